//! Prometheus metrics and health: counters, gauges and a latency histogram the pipeline
//! updates, served as text on `GET /metrics` when `[metrics] listen` is set, next to
//! `GET /healthz` (the process runs and its loop turns), `GET /readyz` (streaming from
//! the slot and the sink confirms deliveries, or a standby connected to PostgreSQL and
//! waiting for the busy slot; the body says which) and `GET /streamingz` (streaming and
//! ready only).
//!
//! Names are constants so the renderer and the tests share them; the unit test below
//! pins their spelling, which dashboards and alerts depend on (docs/configuration.md
//! lists them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

mod age;
mod labels;

pub use age::{AgeWriter, CarriedAge};
pub use labels::{TopicCounts, MAX_TOPIC_LABELS, OTHER_TOPICS};

pub const EVENTS_TOTAL: &str = "outbox_relay_events_total";
pub const DEAD_LETTERED_TOTAL: &str = "outbox_relay_dead_lettered_total";
pub const TRANSACTIONS_TOTAL: &str = "outbox_relay_transactions_total";
pub const RESTARTS_TOTAL: &str = "outbox_relay_restarts_total";
pub const KAFKA_TRANSACTIONS_TOTAL: &str = "outbox_relay_kafka_transactions_total";
pub const SKIPPED_COMMITTED_TOTAL: &str = "outbox_relay_skipped_committed_total";
pub const SKIPPED_RECORDED_TOTAL: &str = "outbox_relay_skipped_recorded_total";
pub const TAKEOVERS_TOTAL: &str = "outbox_relay_takeovers_total";
pub const IN_FLIGHT: &str = "outbox_relay_in_flight_events";
pub const IN_FLIGHT_BYTES: &str = "outbox_relay_in_flight_bytes";
pub const FLUSH_LSN: &str = "outbox_relay_flush_lsn";
pub const RECEIVED_LSN: &str = "outbox_relay_received_lsn";
pub const LAST_STATUS_UNIX_SECONDS: &str = "outbox_relay_last_status_update_unix_seconds";
pub const OLDEST_UNDELIVERED_SECONDS: &str = "outbox_relay_oldest_undelivered_seconds";
pub const REPLICATION_LAG_BYTES: &str = "outbox_relay_replication_lag_bytes";
pub const REPLICATION_LAG_SECONDS: &str = "outbox_relay_replication_lag_seconds";
pub const STREAMING: &str = "outbox_relay_streaming";
pub const DELIVERY_LATENCY_SECONDS: &str = "outbox_relay_commit_to_delivery_seconds";
pub const TOPIC_DELIVERED_TOTAL: &str = "outbox_relay_topic_delivered_total";
pub const MESSAGES_TOTAL: &str = "outbox_relay_messages_total";
pub const MESSAGES_REFUSED_TOTAL: &str = "outbox_relay_messages_refused_total";
pub const MESSAGES_IGNORED_TOTAL: &str = "outbox_relay_messages_ignored_total";
pub const TOPIC_DEAD_LETTERED_TOTAL: &str = "outbox_relay_topic_dead_lettered_total";

/// Upper bounds (seconds) of the commit-to-delivery histogram's buckets: from a few
/// milliseconds (a relay keeping up) to minutes (a broker outage).
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// `[metrics]`: where to serve them.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve Prometheus metrics on (`GET /metrics`).
    pub listen: String,
}

impl MetricsConfig {
    /// Every problem of the section, each with its key path.
    pub fn problems(&self) -> Vec<String> {
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            vec![format!(
                "metrics.listen: {:?} is not an address like 127.0.0.1:9187",
                self.listen
            )]
        } else {
            Vec::new()
        }
    }
}

/// The relay's metrics. Cheap to update from the hot path (relaxed atomics).
#[derive(Debug, Default)]
pub struct Metrics {
    pub events: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub transactions: AtomicU64,
    /// Logical decoding messages of relayed prefixes (records or dead letters).
    pub messages: AtomicU64,
    /// Non-transactional messages of relayed prefixes refused.
    pub messages_refused: AtomicU64,
    /// Messages whose prefix is not relayed.
    pub messages_ignored: AtomicU64,
    pub restarts: AtomicU64,
    /// Kafka transactions committed (exactly-once).
    pub kafka_transactions: AtomicU64,
    /// Replayed events skipped because Kafka's checkpoint has them (exactly-once).
    pub skipped_committed: AtomicU64,
    /// Replayed events skipped because the state table's record shows them delivered.
    pub skipped_recorded: AtomicU64,
    /// Walsenders of a silent relay this standby ended to take the slot over.
    pub takeovers: AtomicU64,
    pub in_flight: AtomicU64,
    /// Bytes (key + value + headers) of the events in flight.
    pub in_flight_bytes: AtomicU64,
    pub flush_lsn: AtomicU64,
    pub received_lsn: AtomicU64,
    pub last_status_unix_seconds: AtomicU64,
    /// Since when the oldest event handed to the sink waits for its confirmation,
    /// carried across pipeline attempts; the age is computed when read.
    pub oldest_undelivered: CarriedAge,
    /// WAL the relay received and has not acknowledged (received - flush).
    pub replication_lag_bytes: AtomicU64,
    /// The commit time of the oldest transaction not yet acknowledged, carried across
    /// pipeline attempts: the replication lag in seconds is its age when read.
    pub oldest_unacknowledged_commit: CarriedAge,
    /// Commit-to-delivery latency of each event.
    pub delivery_latency: Histogram,
    /// Records confirmed per topic (dead-letter records under the dead-letter topic).
    pub delivered_by_topic: TopicCounts,
    /// Events sent to the dead-letter topic, per the topic they were routed to (`""`
    /// when routing failed).
    pub dead_lettered_by_topic: TopicCounts,
    pub health: Health,
}

/// A Prometheus histogram with fixed buckets ([`LATENCY_BUCKETS`]).
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; summed when rendered).
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    /// Sum of observations, in microseconds.
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, seconds: f64) {
        let seconds = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        if let Some(i) = LATENCY_BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        // Whole microseconds: precise enough for a sum of latencies.
        let micros = (seconds * 1e6).min(u64::MAX as f64) as u64;
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            cumulative += bucket.load(Ordering::Relaxed);
            out.push_str(&format!("{name}_bucket{{le=\"{bound}\"}} {cumulative}\n"));
        }
        let count = self.count.load(Ordering::Relaxed);
        out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {count}\n"));
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        out.push_str(&format!("{name}_sum {sum}\n{name}_count {count}\n"));
    }
}

/// What `/healthz` and `/readyz` answer from, set by the pipeline.
#[derive(Debug, Default)]
pub struct Health {
    /// 1 while the pipeline streams from the slot.
    pub streaming: AtomicU64,
    /// 1 while a standby waits for the slot: its last attempt reached PostgreSQL and
    /// found the slot streaming to another relay (0 once an attempt fails otherwise).
    pub standby: AtomicU64,
    /// While streaming, the loop must turn again before this time (unix ms); set on
    /// every status tick to a few status intervals ahead.
    pub loop_deadline_unix_ms: AtomicU64,
    /// The sink is taken for stuck once the oldest undelivered event has waited this
    /// long (ms); 0 = never.
    pub stuck_after_ms: AtomicU64,
}

/// The answers of the health endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthReport {
    /// The process runs and, while streaming, its loop turns.
    pub alive: bool,
    /// Streaming and the sink confirms deliveries, or a standby that can take over.
    pub ready: bool,
    /// Streaming from the slot (else, when ready, a standby).
    pub streaming: bool,
}

impl Metrics {
    /// Health at `now_unix_ms`: pure over the recorded state.
    pub fn health_at(&self, now_unix_ms: u64) -> HealthReport {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let streaming = get(&self.health.streaming) == 1;
        let alive = !streaming || now_unix_ms <= get(&self.health.loop_deadline_unix_ms);
        let stuck_after_ms = get(&self.health.stuck_after_ms);
        let waiting_ms = self.oldest_undelivered.age_ms_at(now_unix_ms);
        let stuck = stuck_after_ms > 0 && waiting_ms > stuck_after_ms;
        let standby = !streaming && get(&self.health.standby) == 1;
        HealthReport {
            alive,
            ready: (streaming && alive && !stuck) || standby,
            streaming,
        }
    }
}

/// Now, as unix milliseconds.
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Metrics::default())
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }

    /// The Prometheus text exposition of every metric, ages as of now.
    pub fn render(&self) -> String {
        self.render_at(unix_ms_now())
    }

    /// The Prometheus text exposition of every metric, ages as of `now_unix_ms`.
    pub fn render_at(&self, now_unix_ms: u64) -> String {
        let mut out = String::with_capacity(1024);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (name, kind, help, value) in [
            (
                EVENTS_TOTAL,
                "counter",
                "Outbox events handed to the sink.",
                get(&self.events),
            ),
            (
                DEAD_LETTERED_TOTAL,
                "counter",
                "Events sent to the dead-letter topic.",
                get(&self.dead_lettered),
            ),
            (
                TRANSACTIONS_TOTAL,
                "counter",
                "Committed transactions received.",
                get(&self.transactions),
            ),
            (
                MESSAGES_TOTAL,
                "counter",
                "Logical decoding messages of relayed prefixes (the table-less outbox), each a record or a dead letter.",
                get(&self.messages),
            ),
            (
                MESSAGES_REFUSED_TOTAL,
                "counter",
                "Non-transactional messages of relayed prefixes refused (messages.non_transactional = refuse).",
                get(&self.messages_refused),
            ),
            (
                MESSAGES_IGNORED_TOTAL,
                "counter",
                "Logical decoding messages whose prefix is not relayed.",
                get(&self.messages_ignored),
            ),
            (
                RESTARTS_TOTAL,
                "counter",
                "Pipeline restarts after retryable errors.",
                get(&self.restarts),
            ),
            (
                KAFKA_TRANSACTIONS_TOTAL,
                "counter",
                "Kafka transactions committed (exactly_once).",
                get(&self.kafka_transactions),
            ),
            (
                SKIPPED_COMMITTED_TOTAL,
                "counter",
                "Replayed events skipped because the exactly-once checkpoint shows them committed in Kafka.",
                get(&self.skipped_committed),
            ),
            (
                SKIPPED_RECORDED_TOTAL,
                "counter",
                "Replayed events skipped because the relay's record in its state table, or its memory of its previous session, shows them delivered (the slot rewound, e.g. after a PostgreSQL restart).",
                get(&self.skipped_recorded),
            ),
            (
                TAKEOVERS_TOTAL,
                "counter",
                "Walsenders of a silent relay this standby ended to take the slot over.",
                get(&self.takeovers),
            ),
            (
                IN_FLIGHT,
                "gauge",
                "Events handed to the sink and not yet confirmed.",
                get(&self.in_flight),
            ),
            (
                IN_FLIGHT_BYTES,
                "gauge",
                "Bytes (record key, value and headers) of the events handed to the sink and not yet confirmed.",
                get(&self.in_flight_bytes),
            ),
            (
                FLUSH_LSN,
                "gauge",
                "Position acknowledged to PostgreSQL (flush LSN, as a number).",
                get(&self.flush_lsn),
            ),
            (
                RECEIVED_LSN,
                "gauge",
                "Last progress position received from PostgreSQL.",
                get(&self.received_lsn),
            ),
            (
                LAST_STATUS_UNIX_SECONDS,
                "gauge",
                "When the last status update was sent to PostgreSQL.",
                get(&self.last_status_unix_seconds),
            ),
            (
                OLDEST_UNDELIVERED_SECONDS,
                "gauge",
                "How long the oldest event handed to the sink has waited for its confirmation (0 when none waits); one stuck partition shows here.",
                self.oldest_undelivered.age_ms_at(now_unix_ms) / 1000,
            ),
            (
                REPLICATION_LAG_BYTES,
                "gauge",
                "WAL received from PostgreSQL and not yet acknowledged (received - flush position); the slot retains at least this much.",
                get(&self.replication_lag_bytes),
            ),
            (
                STREAMING,
                "gauge",
                "1 while streaming from the slot (a standby waiting for the slot shows 0).",
                get(&self.health.streaming),
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        let lag = self.oldest_unacknowledged_commit.age_ms_at(now_unix_ms) as f64 / 1000.0;
        out.push_str(&format!(
            "# HELP {REPLICATION_LAG_SECONDS} Age, by its commit time on PostgreSQL, of the oldest transaction not yet acknowledged (0 when all are).\n# TYPE {REPLICATION_LAG_SECONDS} gauge\n{REPLICATION_LAG_SECONDS} {lag}\n"
        ));
        self.delivery_latency.render(
            DELIVERY_LATENCY_SECONDS,
            "Time from an event's commit on PostgreSQL to its delivery confirmation.",
            &mut out,
        );
        for (name, help, counts) in [
            (
                TOPIC_DELIVERED_TOTAL,
                "Records confirmed by the sink, per topic (the first 100 topics; later ones under topic=\"_other\").",
                &self.delivered_by_topic,
            ),
            (
                TOPIC_DEAD_LETTERED_TOTAL,
                "Events sent to the dead-letter topic, per the topic they were routed to (empty when routing failed; the first 100 topics, later ones under topic=\"_other\").",
                &self.dead_lettered_by_topic,
            ),
        ] {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for (topic, count) in counts.snapshot() {
                out.push_str(&format!(
                    "{name}{{topic=\"{}\"}} {count}\n",
                    escape_label(&topic)
                ));
            }
        }
        out
    }
}

/// A label value in Prometheus' text format: backslash, double quote and newline escaped.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Serve `GET /metrics`, `GET /healthz` and `GET /readyz` on `listener` until the task
/// is dropped. Anything else gets 404.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            // Out of file descriptors or similar: do not spin.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let n = match tokio::time::timeout(
                std::time::Duration::from_secs(5),
                stream.read(&mut request),
            )
            .await
            {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let head = String::from_utf8_lossy(&request[..n]);
            let path = head
                .strip_prefix("GET ")
                .and_then(|rest| rest.split([' ', '\r']).next())
                .unwrap_or("");
            let health = || metrics.health_at(unix_ms_now());
            let response = match path {
                "/metrics" => {
                    let body = metrics.render();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                }
                "/healthz" => status_response(
                    health().alive,
                    "alive\n",
                    "the relay's loop stopped turning\n",
                ),
                "/readyz" => {
                    let health = health();
                    let role = if health.streaming {
                        "streaming\n"
                    } else {
                        "standby\n"
                    };
                    status_response(health.ready, role, NOT_READY)
                }
                "/streamingz" => {
                    let health = health();
                    status_response(
                        health.ready && health.streaming,
                        "streaming\n",
                        if health.ready {
                            "standby: another relay streams from the slot\n"
                        } else {
                            NOT_READY
                        },
                    )
                }
                _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_owned(),
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// 200 with `ok`, or 503 with `not_ok`.
/// Why `/readyz` answers 503.
const NOT_READY: &str = "not ready: PostgreSQL unreachable (or the slot not yet tried), the loop stopped turning, or the sink has not confirmed deliveries for too long\n";

fn status_response(good: bool, ok: &str, not_ok: &str) -> String {
    let (status, body) = if good {
        ("200 OK", ok)
    } else {
        ("503 Service Unavailable", not_ok)
    };
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_in_prometheus_text_format() {
        let metrics = Metrics::new();
        Metrics::add(&metrics.events, 3);
        Metrics::set(&metrics.flush_lsn, 0x1_0000_0000);
        Metrics::set(&metrics.in_flight_bytes, 4096);
        let text = metrics.render();
        assert!(
            text.contains(&format!(
                "# TYPE {EVENTS_TOTAL} counter\n{EVENTS_TOTAL} 3\n"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("{FLUSH_LSN} 4294967296\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "# TYPE {IN_FLIGHT_BYTES} gauge\n{IN_FLIGHT_BYTES} 4096\n"
            )),
            "{text}"
        );
        // 19 plain series, the lag, the histogram (14 buckets, +Inf, sum, count); no
        // per-topic series before any delivery.
        assert_eq!(
            text.lines().filter(|l| !l.starts_with('#')).count(),
            19 + 1 + 17
        );
    }

    #[test]
    fn ages_are_computed_when_rendered_not_when_last_updated() {
        let metrics = Metrics::new();
        AgeWriter::new(&metrics.oldest_undelivered).update(
            &metrics.oldest_undelivered,
            Some(1_000),
            0,
            0,
        );
        AgeWriter::new(&metrics.oldest_unacknowledged_commit).update(
            &metrics.oldest_unacknowledged_commit,
            Some(500),
            0,
            0,
        );
        // No writer ran since: the ages still grow with the clock.
        for (now, waited, lag) in [(2_000, 1, 1.5), (23_500, 22, 23.0)] {
            let text = metrics.render_at(now);
            assert!(
                text.contains(&format!("\n{OLDEST_UNDELIVERED_SECONDS} {waited}\n")),
                "{text}"
            );
            assert!(
                text.contains(&format!("\n{REPLICATION_LAG_SECONDS} {lag}\n")),
                "{text}"
            );
        }
    }

    #[test]
    fn the_latency_histogram_is_cumulative() {
        let histogram = Histogram::default();
        for seconds in [0.001, 0.02, 0.02, 7.0, 1e9, -1.0, f64::NAN] {
            histogram.observe(seconds);
        }
        let mut text = String::new();
        histogram.render("h", "help", &mut text);
        for line in [
            "h_bucket{le=\"0.005\"} 3\n",
            "h_bucket{le=\"0.025\"} 5\n",
            "h_bucket{le=\"5\"} 5\n",
            "h_bucket{le=\"10\"} 6\n",
            "h_bucket{le=\"300\"} 6\n",
            "h_bucket{le=\"+Inf\"} 7\n",
            "h_count 7\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }

    #[test]
    fn per_topic_counts_are_labelled_and_escaped() {
        let metrics = Metrics::new();
        metrics.delivered_by_topic.add("orders", 2);
        metrics.delivered_by_topic.add("orders", 3);
        metrics.dead_lettered_by_topic.add("we\"ird", 1);
        let text = metrics.render();
        assert!(
            text.contains(&format!("{TOPIC_DELIVERED_TOTAL}{{topic=\"orders\"}} 5\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{TOPIC_DEAD_LETTERED_TOTAL}{{topic=\"we\\\"ird\"}} 1\n"
            )),
            "{text}"
        );
    }

    #[test]
    fn health_follows_streaming_the_loop_and_the_sink() {
        let metrics = Metrics::new();
        let report = |now| metrics.health_at(now);
        // Not streaming, and no attempt found the slot busy yet (starting, or
        // PostgreSQL unreachable): alive, not ready.
        assert_eq!(
            report(5_000),
            HealthReport {
                alive: true,
                ready: false,
                streaming: false
            }
        );
        // A standby: connected, waiting for the busy slot. Ready, not streaming.
        Metrics::set(&metrics.health.standby, 1);
        assert_eq!(
            report(5_000),
            HealthReport {
                alive: true,
                ready: true,
                streaming: false
            }
        );
        Metrics::set(&metrics.health.standby, 0);
        Metrics::set(&metrics.health.streaming, 1);
        Metrics::set(&metrics.health.loop_deadline_unix_ms, 100_000);
        Metrics::set(&metrics.health.stuck_after_ms, 30_000);
        assert_eq!(
            report(90_000),
            HealthReport {
                alive: true,
                ready: true,
                streaming: true
            }
        );
        // The loop stopped turning.
        assert_eq!(
            report(100_001),
            HealthReport {
                alive: false,
                ready: false,
                streaming: true
            }
        );
        // The oldest undelivered event waits too long: alive, not ready.
        // Waiting since 59 s: 31 s at 90 s, computed when asked.
        AgeWriter::new(&metrics.oldest_undelivered).update(
            &metrics.oldest_undelivered,
            Some(59_000),
            0,
            0,
        );
        assert!(report(80_000).ready, "21 s of waiting is not stuck yet");
        assert_eq!(
            report(90_000),
            HealthReport {
                alive: true,
                ready: false,
                streaming: true
            }
        );
    }

    /// The names are the relay's public interface: dashboards and alerts are written
    /// against them. Spelled out here, once; everything else uses the constants.
    #[test]
    fn metric_names_and_kinds_are_stable() {
        let text = Metrics::new().render();
        let kinds: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .collect();
        assert_eq!(
            kinds,
            [
                "outbox_relay_events_total counter",
                "outbox_relay_dead_lettered_total counter",
                "outbox_relay_transactions_total counter",
                "outbox_relay_messages_total counter",
                "outbox_relay_messages_refused_total counter",
                "outbox_relay_messages_ignored_total counter",
                "outbox_relay_restarts_total counter",
                "outbox_relay_kafka_transactions_total counter",
                "outbox_relay_skipped_committed_total counter",
                "outbox_relay_skipped_recorded_total counter",
                "outbox_relay_takeovers_total counter",
                "outbox_relay_in_flight_events gauge",
                "outbox_relay_in_flight_bytes gauge",
                "outbox_relay_flush_lsn gauge",
                "outbox_relay_received_lsn gauge",
                "outbox_relay_last_status_update_unix_seconds gauge",
                "outbox_relay_oldest_undelivered_seconds gauge",
                "outbox_relay_replication_lag_bytes gauge",
                "outbox_relay_streaming gauge",
                "outbox_relay_replication_lag_seconds gauge",
                "outbox_relay_commit_to_delivery_seconds histogram",
                "outbox_relay_topic_delivered_total counter",
                "outbox_relay_topic_dead_lettered_total counter",
            ]
        );
    }

    #[tokio::test]
    async fn serves_metrics_over_http_and_404_otherwise() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Metrics::new();
        Metrics::add(&metrics.events, 7);
        let server = tokio::spawn(serve(listener, metrics));
        let get = |path: &'static str| async move {
            let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            stream
                .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut response = String::new();
            stream.read_to_string(&mut response).await.unwrap();
            response
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains(&format!("{EVENTS_TOTAL} 7")), "{ok}");
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        let not_ready = get("/readyz").await;
        assert!(not_ready.starts_with("HTTP/1.1 503"), "{not_ready}");
        server.abort();
    }
}
