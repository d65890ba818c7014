//! The Prometheus text exposition of [`Metrics`]: one HELP and TYPE line per metric,
//! ages computed as of the time asked, the histogram, and the per-topic series with
//! escaped labels. Pure over the recorded values (the time is a parameter of
//! [`Metrics::render_at`]). Apart from the registry in `metrics.rs` because the help
//! texts and the format are long and change for other reasons than the counters do.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    unix_ms_now, Metrics, DEAD_LETTERED_TOTAL, DELIVERY_LATENCY_SECONDS, EVENTS_TOTAL, FLUSH_LSN,
    IN_FLIGHT, IN_FLIGHT_BYTES, KAFKA_TRANSACTIONS_TOTAL, LAST_STATUS_UNIX_SECONDS,
    MESSAGES_IGNORED_TOTAL, MESSAGES_REFUSED_TOTAL, MESSAGES_TOTAL, OLDEST_UNDELIVERED_SECONDS,
    OUTBOX_EVENTS_TOTAL, RECEIVED_LSN, REPLICATION_LAG_BYTES, REPLICATION_LAG_SECONDS,
    RESTARTS_TOTAL, SKIPPED_COMMITTED_TOTAL, SKIPPED_RECORDED_TOTAL, STREAMING, TAKEOVERS_TOTAL,
    TOPIC_DEAD_LETTERED_TOTAL, TOPIC_DELIVERED_TOTAL, TRANSACTIONS_TOTAL,
};

impl Metrics {
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
        out.push_str(&format!(
            "# HELP {OUTBOX_EVENTS_TOTAL} Events read from each outbox table (one label per configured table or pattern).\n# TYPE {OUTBOX_EVENTS_TOTAL} counter\n"
        ));
        for (table, count) in self.events_by_outbox.get().into_iter().flatten() {
            out.push_str(&format!(
                "{OUTBOX_EVENTS_TOTAL}{{outbox=\"{}\"}} {}\n",
                escape_label(table),
                get(count)
            ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::AgeWriter;

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
    fn per_topic_counts_are_labelled_and_escaped() {
        let metrics = Metrics::new();
        metrics.delivered_by_topic.add("orders", 2);
        metrics.delivered_by_topic.add("orders", 3);
        metrics.dead_lettered_by_topic.add("we\"ird", 1);
        metrics.name_outboxes(["a.outbox".to_owned(), "b.outbox".to_owned()]);
        metrics.add_outbox_event(1);
        metrics.add_outbox_event(1);
        metrics.add_outbox_event(7);
        let text = metrics.render();
        assert!(
            text.contains(&format!("{OUTBOX_EVENTS_TOTAL}{{outbox=\"a.outbox\"}} 0\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{OUTBOX_EVENTS_TOTAL}{{outbox=\"b.outbox\"}} 2\n")),
            "{text}"
        );
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
}
