//! The Kafka sink: librdkafka's idempotent producer (`enable.idempotence=true`,
//! `acks=all`), one delivery callback per record feeding the ack tracker, and topic
//! preparation (create, or check) off the pipeline's loop.
//!
//! ```text
//! pipeline ──send(event, tag)──▶ ThreadedProducer ──▶ brokers
//!     ▲                               │ delivery callback (librdkafka thread)
//!     │                               ▼ kafka_errors::action(code)
//!     ├──── Delivered{tag} / Refused{tag, ...} (dead letter) / Stop     (kafka_delivery)
//!     └──── Wake ──▶ poll(): a client error (fatal? fenced?), a failed record or commit
//!                    (retry, unless fenced), a due transaction, a prepared topic
//! ```
//!
//! Only a successful delivery report counts. `message.timeout.ms=0` makes librdkafka
//! retry transient errors forever (the relay applies backpressure itself); a failed
//! report is classified once by [`action`]: a failure of the record
//! itself (too large, malformed, illegal topic) is a dead letter, authorization and
//! configuration stop the relay, and everything else rebuilds the producer (the
//! attempt ends with [`SinkError::Retry`]) and resends from the slot's acknowledged
//! position.
//!
//! With `[kafka] exactly_once` the producer is transactional: records are reported
//! delivered only when their Kafka transaction commits (see [`super::kafka_eos`]).
//!
//! Errors outside any record reach the client's error callback; librdkafka reconnects
//! after them on its own, except that a refused login or TLS handshake would go on
//! failing for ever: those stop the relay ([`crate::sink::kafka_errors::client_error_stop`]). A fatal
//! producer error is not flagged there: the callback wakes the pipeline, whose poll asks
//! the client. Secret property values are cut out of every error text the sink passes
//! on.

use std::sync::Arc;

use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer as _};
use tokio::sync::mpsc;

use crate::event::OutboxEvent;
use crate::lsn::Lsn;
use crate::metrics::Metrics;
use crate::sink::checkpoint::Checkpoint;
use crate::sink::kafka_config::KafkaConfig;
use crate::sink::kafka_config::{
    admin_config, message_max_bytes, producer_config, transactional_producer_config, QueueBound,
};
use crate::sink::kafka_delivery::{
    refusal_reason, InFlight, Notifier, Producer, RelayContext, Wakeup,
};
use crate::sink::kafka_eos::{default_transactional_id, ExactlyOnce};
use crate::sink::kafka_eos_state::EosSettings;
use crate::sink::kafka_errors::{
    action, fatal, is_size_error, retry, setup, stop_hint, ErrorAction,
};
use crate::sink::kafka_log::AdminContext;
use crate::sink::kafka_placement::Placement;
use crate::sink::kafka_topics::{TopicPreparer, Topics};
use crate::sink::{
    NoticeSender, RecordTag, SendError, Session, Sink, SinkError, SinkFuture, TopicStatus,
};

/// The sink.
pub struct KafkaSink {
    /// Shared with the commit tasks (exactly-once).
    producer: Arc<Producer>,
    topics: Topics,
    notifier: Notifier,
    /// What each [`SinkNotice::Wake`](crate::sink::SinkNotice::Wake) announced, taken
    /// one per [`Sink::poll`].
    wakeups: mpsc::UnboundedReceiver<Wakeup>,
    keep_events: bool,
    /// The producer's `message.max.bytes`, for error messages.
    max_message_bytes: String,
    /// Exactly-once: the transactions and what reading the checkpoint needs.
    eos: Option<ExactlyOnce>,
    placement: Placement,
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        if let Some(eos) = &mut self.eos {
            eos.close(&self.producer);
        }
    }
}

impl KafkaSink {
    /// Build the producer and admin client. `queue` (the in-flight bounds) sizes the
    /// producer queue; `keep_events` keeps in-flight events for the dead-letter topic.
    pub fn new(
        settings: &KafkaConfig,
        notices: NoticeSender,
        queue: QueueBound,
        keep_events: bool,
        metrics: Arc<Metrics>,
        slot: Option<&str>,
        partition_column: Option<String>,
    ) -> Result<Self, SinkError> {
        let placement = Placement::new(partition_column);
        let max_message_bytes = message_max_bytes(&settings.properties).to_string();
        let eos = match slot {
            Some(slot) if settings.exactly_once => Some(EosSettings {
                transactional_id: settings
                    .transactional_id
                    .clone()
                    .unwrap_or_else(|| default_transactional_id(slot)),
                offsets_topic: settings.offsets_topic.clone(),
                transaction_ms: std::time::Duration::from_millis(settings.transaction_ms),
                // At most half the in-flight bound: records are in flight until their
                // transaction commits, and reading pauses at the bound, so a fuller
                // transaction could wait for ever for the end of its PostgreSQL one.
                max_events: {
                    let bound = u64::try_from(queue.messages / 2).unwrap_or(u64::MAX).max(1);
                    settings
                        .transaction_max_events
                        .map_or(bound, |n| n.min(bound))
                },
                // Half the byte bound, for the same reason.
                max_bytes: {
                    let bound = (queue.bytes / 2).max(1);
                    settings
                        .transaction_max_bytes
                        .map_or(bound, |n| n.min(bound))
                },
            }),
            _ => None,
        };
        let config = match &eos {
            Some(eos) => transactional_producer_config(
                &settings.brokers,
                &settings.properties,
                queue,
                &eos.transactional_id,
            ),
            None => producer_config(&settings.brokers, &settings.properties, queue),
        };
        let (notifier, wakeups) = Notifier::new(notices);
        let producer: Producer = config
            .create_with_context(RelayContext {
                notifier: notifier.clone(),
                max_message_bytes: max_message_bytes.clone(),
                metrics: Arc::clone(&metrics),
                transactional: eos.is_some(),
                placement: placement.clone(),
            })
            .map_err(|e| setup(settings.client_error(&e)))?;
        let producer = Arc::new(producer);
        let admin = admin_config(&settings.brokers, &settings.properties)
            .create_with_context(AdminContext)
            .map_err(|e| setup(format!("admin client: {}", settings.client_error(&e))))?;
        let checkpoint_reader = admin_config(&settings.brokers, &settings.properties);
        Ok(KafkaSink {
            producer,
            eos: eos.map(|eos| ExactlyOnce::new(eos, checkpoint_reader, metrics)),
            topics: Topics::new(TopicPreparer {
                admin: Arc::new(admin),
                create_topics: settings.create_topics,
                partitions: settings.topic_partitions,
                replication_factor: settings.topic_replication_factor,
                partition_counts: placement.counts(),
            }),
            notifier,
            wakeups,
            keep_events,
            max_message_bytes,
            placement,
        })
    }

    /// The producer's fatal error, if it has one.
    fn producer_fatal_error(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code}: {reason}"))
    }

    /// Exactly-once: when a newer producer fenced this one, the message to stop with.
    fn fenced(&self) -> Option<String> {
        self.eos.as_ref()?.fenced(&self.producer)
    }

    /// What a wakeup means, on the pipeline's task.
    fn on_wakeup(&mut self, wakeup: Wakeup) -> Result<(), SinkError> {
        match wakeup {
            Wakeup::Due => self.flush(),
            Wakeup::Topic { topic, outcome } => {
                self.topics.prepared(&topic, &outcome);
                match outcome {
                    // Records waiting for a refused topic become dead letters (its
                    // status is Refused now).
                    Ok(()) | Err(SinkError::TopicRefused { .. }) => Ok(()),
                    // No answer: asked again within the session for a while (ending it
                    // would send again what is in flight).
                    Err(SinkError::TopicUnavailable { reason, .. })
                        if self.topics.ask_again(&topic, &reason, &self.notifier) =>
                    {
                        Ok(())
                    }
                    Err(other) => Err(other),
                }
            }
            Wakeup::ClientError | Wakeup::Retry(_) if self.fenced().is_some() => {
                Err(SinkError::Stop(self.fenced().unwrap_or_default()))
            }
            Wakeup::Retry(reason) => {
                let reason = self.producer_fatal_error().map_or(reason, |fatal| {
                    format!("the producer failed for good: {fatal}")
                });
                Err(retry(reason))
            }
            Wakeup::ClientError => match self.producer_fatal_error() {
                Some(reason) => {
                    tracing::error!(reason = %reason, "fatal Kafka producer error: rebuilding the producer");
                    Err(fatal(reason))
                }
                None => Ok(()),
            },
        }
    }
}

impl Sink for KafkaSink {
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError> {
        if let Some(eos) = &mut self.eos {
            if !eos.before_send(&self.producer, &self.notifier)? {
                // Sent in the next transaction; the commit's reports resume the pump.
                return Err(SendError::QueueFull(Box::new(event)));
            }
        }
        let mut headers = OwnedHeaders::new_with_capacity(event.headers.len());
        for header in &event.headers {
            headers = headers.insert(KafkaHeader {
                key: &header.name,
                value: header.value.as_deref(),
            });
        }
        // Borrowed when there is no envelope: librdkafka copies the bytes itself.
        let value = event.value();
        let bytes = self.eos.as_ref().map_or(0, |_| event.record_bytes());
        let in_flight = Box::new(InFlight {
            tag: Some(tag),
            event: self.keep_events.then(|| Box::new(event.clone())),
            partition: event.partition,
        });
        let mut record = BaseRecord::with_opaque_to(&event.topic, in_flight)
            .headers(headers)
            .timestamp(event.timestamp_ms);
        if let Some(key) = &event.key {
            record = record.key(key.as_bytes());
        }
        if let Some(value) = value.as_deref() {
            record = record.payload(value);
        }
        if let Some(partition) = event.partition {
            record = record.partition(partition);
        }
        // Drop the record (and the value borrowed from `event`) before `event` moves.
        let outcome = self.producer.send(record).map_err(|(error, _)| error);
        drop(value);
        let Err(error) = outcome else {
            if let Some(eos) = &mut self.eos {
                eos.sent(tag, bytes);
            }
            return Ok(());
        };
        let event = Box::new(event);
        let code = error
            .rdkafka_error_code()
            .unwrap_or(RDKafkaErrorCode::Unknown);
        let place = match event.partition {
            Some(partition) => format!("{}/{partition}", event.topic),
            None => event.topic.clone(),
        };
        if code == RDKafkaErrorCode::QueueFull {
            return Err(SendError::QueueFull(event));
        }
        if let Some(reason) = self.fenced() {
            return Err(SendError::Sink(SinkError::Stop(reason)));
        }
        if let Some(reason) = self.placement.refusal(code, &event.topic, event.partition) {
            return Err(SendError::Refused {
                reason,
                too_large: false,
                event,
            });
        }
        match action(code) {
            ErrorAction::Retry => {
                let reason = match self.producer_fatal_error() {
                    Some(fatal) => format!("the producer failed for good: {fatal}"),
                    None => format!("a record for {place} was not accepted: {error}"),
                };
                Err(SendError::Sink(retry(reason)))
            }
            ErrorAction::Stop => Err(SendError::Sink(SinkError::Stop(format!(
                "Kafka refused a record for {place}: {error}; {}",
                stop_hint(code)
            )))),
            ErrorAction::DeadLetter if is_size_error(code) => {
                let size = event.key.as_ref().map_or(0, String::len)
                    + event.value().map_or(0, |v| v.len());
                Err(SendError::Refused {
                    reason: format!(
                        "the record ({size} bytes of key and value) is too large for message.max.bytes ({}): raise message.max.bytes in [kafka.properties] (and the topic's max.message.bytes on the brokers)",
                        self.max_message_bytes
                    ),
                    too_large: true,
                    event,
                })
            }
            ErrorAction::DeadLetter => Err(SendError::Refused {
                reason: refusal_reason(code, &error.to_string(), &place, &self.max_message_bytes),
                too_large: false,
                event,
            }),
        }
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        // librdkafka sends on its own (linger.ms); reports come from its thread.
        // Exactly-once: commit the open transaction when it is due.
        match &mut self.eos {
            Some(eos) => eos.commit_if_due(&self.producer, &self.notifier),
            None => Ok(()),
        }
    }

    fn poll(&mut self) -> Result<(), SinkError> {
        // One wakeup per Wake, so they are handled in the channel's order.
        match self.wakeups.try_recv() {
            Ok(wakeup) => self.on_wakeup(wakeup),
            Err(_) => Ok(()),
        }
    }

    fn topic_status(&mut self, topic: &str) -> TopicStatus {
        self.topics.status(topic, &self.notifier)
    }

    fn ensure_topic<'a>(&'a mut self, topic: &'a str) -> SinkFuture<'a, Result<(), SinkError>> {
        Box::pin(self.topics.prepare_now(topic))
    }

    fn begin_session<'a>(
        &'a mut self,
        session: &'a Session,
    ) -> SinkFuture<'a, Result<Option<Checkpoint>, SinkError>> {
        let KafkaSink {
            eos,
            producer,
            topics,
            ..
        } = self;
        Box::pin(async move {
            match eos {
                Some(eos) => eos.start(producer, &topics.preparer, session).await,
                None => Ok(None),
            }
        })
    }

    fn transaction_begin(&mut self, commit_lsn: Lsn, skipped: u64) {
        if let Some(eos) = &mut self.eos {
            eos.transaction_begin(commit_lsn, skipped);
        }
    }

    fn transaction_end(&mut self, end_lsn: Lsn) -> Result<(), SinkError> {
        if let Some(eos) = &mut self.eos {
            eos.transaction_end(end_lsn);
        }
        self.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_errors_name_the_property_but_not_its_value() {
        use rdkafka::producer::BaseProducer;
        for (key, value) in [
            // Not a property: librdkafka's error names the key, rdkafka appends the value.
            ("sasl.pasword", "Zq-typo-secret-1"),
            // A property this build cannot take (OIDC needs libcurl): librdkafka's own
            // description quotes the value.
            ("sasl.oauthbearer.client.secret", "Zq-oidc-secret-2"),
        ] {
            let settings: KafkaConfig = toml::from_str(&format!(
                "brokers = \"127.0.0.1:9\"\n[properties]\n\"{key}\" = \"{value}\"\n"
            ))
            .expect("a [kafka] section");
            let error = admin_config("127.0.0.1:9", &settings.properties)
                .create::<BaseProducer>()
                .err()
                .unwrap_or_else(|| panic!("librdkafka accepted {key}"));
            let text = settings.client_error(&error);
            assert!(!text.contains(value), "{key}: {text}");
            assert!(text.contains(key), "names the property: {text}");
        }
    }
}
