//! The Kafka sink: librdkafka's idempotent producer (`enable.idempotence=true`,
//! `acks=all`), one delivery callback per event feeding the ack tracker.
//!
//! ```text
//! pipeline ──send(event, txn)──▶ ThreadedProducer ──▶ brokers
//!     ▲                               │ delivery callback (librdkafka thread)
//!     └──── SinkNotice::Delivered{txn} / Failed{txn, reason, event} / Fatal
//! ```
//!
//! Only a successful delivery report counts. `message.timeout.ms=0` makes librdkafka
//! retry transient errors forever (the relay applies backpressure itself), so a failed
//! report is either definite for that event (too large, illegal topic, not authorized)
//! or the producer is gone for good (fatal idempotence error): then the pipeline builds
//! a new producer and restarts from the slot's acknowledged position.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::config::KafkaConfig;
use crate::relay::router::OutboxEvent;
use crate::sink::{DeliveryFailure, NoticeSender, SendError, Sink, SinkError, SinkNotice, TxnSeq};

/// Producer settings that keep order and lose nothing; user properties go on top (the
/// config refuses to weaken idempotence or acks).
const PRODUCER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("max.in.flight.requests.per.connection", "5"),
    // Infinite: librdkafka retries transient errors forever; the relay's in-flight
    // bound is the backpressure, and nothing times out into a lost event.
    ("message.timeout.ms", "0"),
    ("linger.ms", "10"),
    ("compression.type", "lz4"),
    ("client.id", "outbox-relay"),
];

/// librdkafka's default `message.max.bytes`.
const LIBRDKAFKA_MESSAGE_MAX_BYTES: u32 = 1_000_000;

/// How long an admin request (create topic, metadata) may take. The pipeline waits for
/// it without sending status updates, so it stays well under `wal_sender_timeout`
/// (60 s by default); a timeout is retried with backoff.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Per-message state carried through librdkafka to the delivery callback.
struct InFlight {
    txn: TxnSeq,
    /// Kept only when a dead-letter topic can take the event if it is refused.
    event: Option<Box<OutboxEvent>>,
}

/// Receives librdkafka's callbacks and turns them into [`SinkNotice`]s.
struct RelayContext {
    notices: NoticeSender,
}

impl ClientContext for RelayContext {
    fn error(&self, error: KafkaError, reason: &str) {
        // Transient errors (broker down, network) are retried by librdkafka on its own;
        // a fatal one is only visible through the client, which the pipeline checks.
        tracing::warn!(error = %error, reason, "kafka client error");
        let _ = self.notices.send(SinkNotice::ClientError);
    }
}

impl ProducerContext for RelayContext {
    type DeliveryOpaque = Box<InFlight>;

    fn delivery(&self, result: &DeliveryResult<'_>, in_flight: Box<InFlight>) {
        let InFlight { txn, event } = *in_flight;
        let notice = match result {
            Ok(_) => SinkNotice::Delivered { txn },
            Err((error, _)) => match error.rdkafka_error_code() {
                Some(RDKafkaErrorCode::Fatal)
                | Some(RDKafkaErrorCode::PurgeQueue)
                | Some(RDKafkaErrorCode::PurgeInflight) => SinkNotice::Fatal {
                    reason: format!("delivery failed: {error}"),
                },
                _ => SinkNotice::Failed {
                    txn,
                    failure: DeliveryFailure {
                        reason: format!("Kafka refused the record: {error}"),
                        event,
                    },
                },
            },
        };
        let _ = self.notices.send(notice);
    }
}

/// The sink.
pub struct KafkaSink {
    producer: ThreadedProducer<RelayContext>,
    admin: AdminClient<DefaultClientContext>,
    settings: KafkaConfig,
    keep_events: bool,
    known_topics: HashSet<String>,
    /// The producer's `message.max.bytes`, for error messages.
    max_message_bytes: String,
}

/// The producer's client configuration: our defaults, then the user's properties.
pub fn producer_config(settings: &KafkaConfig, queue_messages: usize) -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &settings.brokers);
    for (key, value) in PRODUCER_DEFAULTS {
        config.set(*key, *value);
    }
    // Room for every event the pipeline may have in flight, plus dead-letter records.
    config.set(
        "queue.buffering.max.messages",
        queue_messages
            .saturating_mul(2)
            .clamp(1000, 10_000_000)
            .to_string(),
    );
    apply_properties(&mut config, &settings.properties);
    config
}

fn apply_properties(config: &mut ClientConfig, properties: &BTreeMap<String, String>) {
    for (key, value) in properties {
        config.set(key, value);
    }
}

impl KafkaSink {
    /// Build the producer and admin client. `max_in_flight` sizes the producer queue;
    /// `keep_events` keeps in-flight events for the dead-letter topic.
    pub fn new(
        settings: &KafkaConfig,
        notices: NoticeSender,
        max_in_flight: usize,
        keep_events: bool,
    ) -> Result<Self, SinkError> {
        let producer: ThreadedProducer<RelayContext> = producer_config(settings, max_in_flight)
            .create_with_context(RelayContext { notices })
            .map_err(|e| SinkError::KafkaSetup(e.to_string()))?;
        let mut admin_config = ClientConfig::new();
        admin_config.set("bootstrap.servers", &settings.brokers);
        apply_properties(&mut admin_config, &settings.properties);
        let admin = admin_config
            .create()
            .map_err(|e| SinkError::KafkaSetup(format!("admin client: {e}")))?;
        Ok(KafkaSink {
            producer,
            admin,
            settings: settings.clone(),
            keep_events,
            known_topics: HashSet::new(),
            max_message_bytes: settings
                .properties
                .get("message.max.bytes")
                .cloned()
                .unwrap_or_else(|| LIBRDKAFKA_MESSAGE_MAX_BYTES.to_string()),
        })
    }

    /// Make sure `topic` exists, creating it when allowed. Remembers topics it saw.
    pub async fn ensure_topic(&mut self, topic: &str) -> Result<(), SinkError> {
        if self.known_topics.contains(topic) {
            return Ok(());
        }
        if let Some(reason) = illegal_topic_name(topic) {
            return Err(SinkError::Topic {
                topic: topic.to_owned(),
                reason,
            });
        }
        if self.settings.create_topics {
            let replication = TopicReplication::Fixed(self.settings.topic_replication_factor);
            let new_topic = NewTopic::new(topic, self.settings.topic_partitions, replication);
            let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
            let results = tokio::time::timeout(
                ADMIN_TIMEOUT,
                self.admin.create_topics(&[new_topic], &options),
            )
            .await
            .map_err(|_| SinkError::TopicUnavailable {
                topic: topic.to_owned(),
                reason: "creating it timed out; is the broker reachable?".into(),
            })?
            .map_err(|e| SinkError::TopicUnavailable {
                topic: topic.to_owned(),
                reason: format!("creating it failed: {e}"),
            })?;
            for result in results {
                if creation_outcome(topic, result.map_err(|(_, code)| code))? {
                    tracing::info!(%topic, "created topic");
                }
            }
        } else {
            let producer = self.producer.client();
            let topic_owned = topic.to_owned();
            let metadata = tokio::task::block_in_place(|| {
                producer.fetch_metadata(Some(&topic_owned), ADMIN_TIMEOUT)
            })
            .map_err(|e| SinkError::TopicUnavailable {
                topic: topic.to_owned(),
                reason: format!("cannot read its metadata: {e}"),
            })?;
            let exists = metadata
                .topics()
                .iter()
                .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty());
            if !exists {
                return Err(SinkError::Topic {
                    topic: topic.to_owned(),
                    reason: "it does not exist and [kafka] create_topics = false; create it or enable create_topics".into(),
                });
            }
        }
        self.known_topics.insert(topic.to_owned());
        Ok(())
    }

    /// The producer's fatal error, if it has one.
    pub fn fatal_error(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code}: {reason}"))
    }
}

/// What a CreateTopics answer means: `Ok(true)` created, `Ok(false)` already there, or
/// the refusal, naming the topic and what to change.
fn creation_outcome(
    topic: &str,
    result: Result<String, RDKafkaErrorCode>,
) -> Result<bool, SinkError> {
    match result {
        Ok(_) => Ok(true),
        Err(RDKafkaErrorCode::TopicAlreadyExists) => Ok(false),
        Err(code) => Err(SinkError::Topic {
            topic: topic.to_owned(),
            reason: format!(
                "the broker refused to create it: {code}; create it yourself or fix [kafka] topic_partitions / topic_replication_factor"
            ),
        }),
    }
}

/// Why Kafka would refuse this topic name, checked before producing to it.
pub fn illegal_topic_name(topic: &str) -> Option<String> {
    if topic.is_empty() {
        return Some("a topic name cannot be empty".into());
    }
    if topic == "." || topic == ".." {
        return Some("a topic name cannot be \".\" or \"..\"".into());
    }
    if topic.len() > 249 {
        return Some(format!(
            "a topic name is at most 249 characters, this one has {}",
            topic.len()
        ));
    }
    if let Some(bad) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "Kafka topic names may contain only ASCII letters, digits, '.', '_' and '-', not {bad:?}"
        ));
    }
    None
}

impl Sink for KafkaSink {
    fn send(&mut self, event: OutboxEvent, txn: TxnSeq) -> Result<(), SendError> {
        let mut headers = OwnedHeaders::new_with_capacity(event.headers.len());
        for header in &event.headers {
            headers = headers.insert(KafkaHeader {
                key: &header.name,
                value: header.value.as_deref(),
            });
        }
        // Borrowed when there is no envelope: librdkafka copies the bytes itself.
        let value = event.value();
        let in_flight = Box::new(InFlight {
            txn,
            event: self.keep_events.then(|| Box::new(event.clone())),
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
        match outcome {
            Ok(()) => Ok(()),
            Err(error) => {
                let event = Box::new(event);
                match error.rdkafka_error_code() {
                    Some(RDKafkaErrorCode::QueueFull) => Err(SendError::QueueFull(event)),
                    Some(RDKafkaErrorCode::Fatal) => Err(SendError::Sink(SinkError::KafkaFatal(
                        self.fatal_error().unwrap_or_else(|| error.to_string()),
                    ))),
                    Some(RDKafkaErrorCode::MessageSizeTooLarge) => {
                        let size = event.key.as_ref().map_or(0, String::len)
                            + event.value().map_or(0, |v| v.len());
                        Err(SendError::Refused {
                            reason: format!(
                                "the record ({size} bytes of key and value) is too large for message.max.bytes ({}): raise message.max.bytes in [kafka.properties] (and the topic's max.message.bytes on the brokers)",
                                self.max_message_bytes
                            ),
                            event,
                        })
                    }
                    _ => Err(SendError::Refused {
                        reason: format!("Kafka refused the record: {error}"),
                        event,
                    }),
                }
            }
        }
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        // librdkafka sends on its own (linger.ms); reports come from its thread.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_kafka_refuses_are_caught_before_sending() {
        assert_eq!(illegal_topic_name("outbox.event.Order_1-x"), None);
        for bad in ["", ".", "..", "outbox.event.注文", "a b", "a/b"] {
            assert!(illegal_topic_name(bad).is_some(), "{bad:?}");
        }
        assert!(illegal_topic_name(&"x".repeat(250)).is_some());
        assert!(illegal_topic_name(&"x".repeat(249)).is_none());
    }

    #[test]
    fn a_refused_creation_names_the_topic_and_the_settings() {
        assert!(creation_outcome("t", Ok("t".into())).unwrap());
        assert!(!creation_outcome("t", Err(RDKafkaErrorCode::TopicAlreadyExists)).unwrap());
        let err = creation_outcome(
            "outbox.event.x",
            Err(RDKafkaErrorCode::InvalidReplicationFactor),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("outbox.event.x"), "{err}");
        assert!(err.contains("refused to create"), "{err}");
        assert!(err.contains("topic_replication_factor"), "{err}");
    }

    #[test]
    fn user_properties_override_defaults() {
        let settings = KafkaConfig {
            brokers: "b:1".into(),
            create_topics: true,
            topic_partitions: 1,
            topic_replication_factor: 1,
            properties: [("linger.ms".to_string(), "50".to_string())]
                .into_iter()
                .collect(),
        };
        let config = producer_config(&settings, 100);
        assert_eq!(config.get("linger.ms"), Some("50"));
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("message.timeout.ms"), Some("0"));
        assert_eq!(config.get("bootstrap.servers"), Some("b:1"));
        assert_eq!(config.get("queue.buffering.max.messages"), Some("1000"));
    }
}
