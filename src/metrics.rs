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
//!
//! This file is the registry ([`Metrics`], the names, health); `metrics/render.rs`
//! writes the text exposition, `metrics/serve.rs` answers HTTP, and `histogram.rs`,
//! `age.rs` and `labels.rs` hold the value types the registry is made of.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

mod age;
mod histogram;
mod labels;
mod render;
mod serve;

pub use age::{AgeWriter, CarriedAge};
pub use histogram::{Histogram, LATENCY_BUCKETS};
pub use labels::{TopicCounts, MAX_TOPIC_LABELS, OTHER_TOPICS};
pub use serve::serve;

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
pub const OUTBOX_EVENTS_TOTAL: &str = "outbox_relay_outbox_events_total";

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
    /// Events read from each outbox entry of the configuration, by its place there (its
    /// labels are the configured tables and patterns: bounded by the configuration). Set
    /// once, when the relay starts ([`Metrics::name_outboxes`]).
    pub events_by_outbox: std::sync::OnceLock<Vec<(String, AtomicU64)>>,
    pub health: Health,
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

    /// Names the per-outbox counters, in the configuration's order (once; later calls
    /// change nothing).
    pub fn name_outboxes(&self, tables: impl IntoIterator<Item = String>) {
        let _ = self.events_by_outbox.set(
            tables
                .into_iter()
                .map(|table| (table, AtomicU64::new(0)))
                .collect(),
        );
    }

    /// Counts an event of the configuration's outbox entry `entry`.
    pub fn add_outbox_event(&self, entry: usize) {
        let counter = self
            .events_by_outbox
            .get()
            .and_then(|counters| counters.get(entry));
        if let Some((_, counter)) = counter {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                "outbox_relay_outbox_events_total counter",
            ]
        );
    }
}
