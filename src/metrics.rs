//! Prometheus metrics: counters and gauges the pipeline updates, served as text on
//! `GET /metrics` when `[metrics] listen` is set.
//!
//! Names are constants so the renderer and the tests share them; the unit test below
//! pins their spelling, which dashboards and alerts depend on (docs/configuration.md
//! lists them).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub const EVENTS_TOTAL: &str = "outbox_relay_events_total";
pub const DEAD_LETTERED_TOTAL: &str = "outbox_relay_dead_lettered_total";
pub const TRANSACTIONS_TOTAL: &str = "outbox_relay_transactions_total";
pub const RESTARTS_TOTAL: &str = "outbox_relay_restarts_total";
pub const IN_FLIGHT: &str = "outbox_relay_in_flight_events";
pub const FLUSH_LSN: &str = "outbox_relay_flush_lsn";
pub const RECEIVED_LSN: &str = "outbox_relay_received_lsn";
pub const LAST_STATUS_UNIX_SECONDS: &str = "outbox_relay_last_status_update_unix_seconds";
pub const OLDEST_UNDELIVERED_SECONDS: &str = "outbox_relay_oldest_undelivered_seconds";

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
    pub restarts: AtomicU64,
    pub in_flight: AtomicU64,
    pub flush_lsn: AtomicU64,
    pub received_lsn: AtomicU64,
    pub last_status_unix_seconds: AtomicU64,
    pub oldest_undelivered_seconds: AtomicU64,
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

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
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
                RESTARTS_TOTAL,
                "counter",
                "Pipeline restarts after retryable errors.",
                get(&self.restarts),
            ),
            (
                IN_FLIGHT,
                "gauge",
                "Events handed to the sink and not yet confirmed.",
                get(&self.in_flight),
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
                get(&self.oldest_undelivered_seconds),
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        }
        out
    }
}

/// Serve `GET /metrics` on `listener` until the task is dropped. Anything else gets 404.
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
            let response = if head.starts_with("GET /metrics ")
                || head.starts_with("GET /metrics\r")
            {
                let body = metrics.render();
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    .to_owned()
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_metric_in_prometheus_text_format() {
        let metrics = Metrics::new();
        Metrics::add(&metrics.events, 3);
        Metrics::set(&metrics.flush_lsn, 0x1_0000_0000);
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
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 9);
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
                "outbox_relay_restarts_total counter",
                "outbox_relay_in_flight_events gauge",
                "outbox_relay_flush_lsn gauge",
                "outbox_relay_received_lsn gauge",
                "outbox_relay_last_status_update_unix_seconds gauge",
                "outbox_relay_oldest_undelivered_seconds gauge",
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
        server.abort();
    }
}
