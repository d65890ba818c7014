//! The Kafka sink: librdkafka's idempotent producer (`enable.idempotence=true`,
//! `acks=all`), one delivery callback per record feeding the ack tracker, and topic
//! preparation (create, or check) off the pipeline's loop.
//!
//! ```text
//! pipeline ──send(event, tag)──▶ ThreadedProducer ──▶ brokers
//!     ▲                               │ delivery callback (librdkafka thread)
//!     │                               ▼ kafka_errors::action(code)
//!     └──── SinkNotice::Delivered{tag} / Failed{tag, ...} (dead letter) / Retry / Stop
//!     └──── SinkNotice::Topic{topic, outcome} ◀── admin task (tokio), one per new topic
//! ```
//!
//! Only a successful delivery report counts. `message.timeout.ms=0` makes librdkafka
//! retry transient errors forever (the relay applies backpressure itself); a failed
//! report is classified once by [`kafka_errors::action`]: a failure of the record
//! itself (too large, malformed, illegal topic) is a dead letter, authorization and
//! configuration stop the relay, and everything else rebuilds the producer and resends
//! from the slot's acknowledged position.
//!
//! With `[kafka] exactly_once` the producer is transactional: records are reported
//! delivered only when their Kafka transaction commits (see [`super::kafka_eos`]).
//!
//! Errors outside any record reach the client's error callback; librdkafka reconnects
//! after them on its own, except that a refused login or TLS handshake would go on
//! failing for ever: those stop the relay ([`kafka_errors::client_error_stop`]). Secret
//! property values are cut out of every error text the sink passes on.

use std::collections::HashMap;
use std::sync::Arc;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use tokio::task::JoinSet;

use rdkafka::config::ClientConfig;

use crate::event::OutboxEvent;
use crate::lsn::Lsn;
use crate::metrics::Metrics;
use crate::sink::checkpoint::Checkpoint;
use crate::sink::kafka_config::KafkaConfig;
use crate::sink::kafka_config::{
    admin_config, message_max_bytes, producer_config, transactional_producer_config, QueueBound,
};
use crate::sink::kafka_eos::{self, EosSettings, Transactions};
use crate::sink::kafka_errors::{action, client_error_stop, is_size_error, stop_hint, ErrorAction};
use crate::sink::kafka_log::{self, AdminContext};
use crate::sink::kafka_placement::Placement;
use crate::sink::kafka_secrets::withhold_secret_detail;
use crate::sink::kafka_topics::illegal_topic_name;
use crate::sink::kafka_topics::TopicPreparer;
use crate::sink::{
    DeliveryFailure, NoticeSender, RecordTag, SendError, Session, Sink, SinkError, SinkFuture,
    SinkNotice, TopicStatus,
};

/// How many topics [`KafkaSink`] remembers as ready without a map lookup.
const RECENTLY_READY: usize = 8;

/// Per-message state carried through librdkafka to the delivery callback.
pub(super) struct InFlight {
    /// `None` for an exactly-once checkpoint record.
    pub(super) tag: Option<RecordTag>,
    /// Kept only when a dead-letter topic can take the event if it is refused.
    pub(super) event: Option<Box<OutboxEvent>>,
    /// The partition the event asked for (a `partition` placement).
    pub(super) partition: Option<i32>,
}

/// Receives librdkafka's callbacks and turns them into [`SinkNotice`]s.
pub(super) struct RelayContext {
    notices: NoticeSender,
    /// The producer's `message.max.bytes`, for error messages.
    max_message_bytes: String,
    /// Deliveries are counted per topic here.
    metrics: Arc<Metrics>,
    /// Exactly-once: a record is durable when its transaction commits, not at its
    /// delivery report, and a failed one fails its whole transaction.
    transactional: bool,
    /// For a partition placement the topic cannot take.
    placement: Placement,
}

impl ClientContext for RelayContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        kafka_log::librdkafka_line(level, fac, &withhold_secret_detail(log_message));
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let reason = withhold_secret_detail(reason);
        let code = error
            .rdkafka_error_code()
            .unwrap_or(RDKafkaErrorCode::Unknown);
        // Once per cause, then a count at a bounded rate (kafka_log).
        kafka_log::client_error(&error, &reason);
        // A refused login or TLS handshake: librdkafka would retry it for ever.
        if let Some(reason) = client_error_stop(code, &reason) {
            let _ = self.notices.send(SinkNotice::Stop { reason });
            return;
        }
        // Transient errors (broker down, network) are retried by librdkafka on its own;
        // a fatal one is only visible through the client, which the pipeline checks.
        let _ = self.notices.send(SinkNotice::ClientError);
    }
}

impl ProducerContext for RelayContext {
    type DeliveryOpaque = Box<InFlight>;

    fn delivery(&self, result: &DeliveryResult<'_>, in_flight: Box<InFlight>) {
        let InFlight {
            tag,
            event,
            partition,
        } = *in_flight;
        let notice = match (result, tag) {
            (Ok(message), tag) => {
                if tag.is_some() {
                    self.metrics.delivered_by_topic.add(message.topic(), 1);
                }
                match tag {
                    Some(tag) if !self.transactional => SinkNotice::Delivered { tag },
                    // Durable with its transaction's commit (kafka_eos::commit).
                    _ => return,
                }
            }
            (Err((error, message)), tag) if self.transactional || tag.is_none() => {
                let code = error
                    .rdkafka_error_code()
                    .unwrap_or(RDKafkaErrorCode::Unknown);
                let place = format!("{}/{}", message.topic(), message.partition());
                if let Some(reason) = self.placement.refusal(code, message.topic(), partition) {
                    let _ = self.notices.send(SinkNotice::Stop {
                        reason: format!("{reason}; with exactly_once a record the broker refuses fails its whole Kafka transaction, so it cannot become a dead letter"),
                    });
                    return;
                }
                match action(code) {
                    ErrorAction::Stop => SinkNotice::Stop {
                        reason: format!(
                            "Kafka refused a record for {place}: {error}; {}",
                            stop_hint(code)
                        ),
                    },
                    ErrorAction::DeadLetter => SinkNotice::Stop {
                        reason: format!(
                            "{}; with exactly_once a record the broker refuses fails its whole Kafka transaction, so it cannot become a dead letter: fix the cause (for a size limit: keep message.max.bytes in [kafka.properties] at or below the topic's max.message.bytes, so the relay itself refuses an oversize event before sending and dead-letters it)",
                            refusal_reason(code, &error.to_string(), &place, &self.max_message_bytes)
                        ),
                    },
                    // The transaction cannot commit: the session starts again and the
                    // checkpoint says what Kafka has.
                    ErrorAction::Retry => SinkNotice::Retry {
                        reason: format!("a record for {place} failed: {error}"),
                    },
                }
            }
            (Err((error, message)), tag) => {
                let Some(tag) = tag else { return };
                let code = error
                    .rdkafka_error_code()
                    .unwrap_or(RDKafkaErrorCode::Unknown);
                let place = format!("{}/{}", message.topic(), message.partition());
                if let Some(reason) = self.placement.refusal(code, message.topic(), partition) {
                    let failure = DeliveryFailure {
                        reason,
                        too_large: false,
                        event,
                    };
                    let _ = self.notices.send(SinkNotice::Failed { tag, failure });
                    return;
                }
                match action(code) {
                    ErrorAction::Retry => SinkNotice::Retry {
                        reason: format!("a record for {place} failed: {error}"),
                    },
                    ErrorAction::Stop => SinkNotice::Stop {
                        reason: format!(
                            "Kafka refused a record for {place}: {error}; {}",
                            stop_hint(code)
                        ),
                    },
                    ErrorAction::DeadLetter => SinkNotice::Failed {
                        tag,
                        failure: DeliveryFailure {
                            reason: refusal_reason(
                                code,
                                &error.to_string(),
                                &place,
                                &self.max_message_bytes,
                            ),
                            too_large: is_size_error(code),
                            event,
                        },
                    },
                }
            }
        };
        let _ = self.notices.send(notice);
    }
}

/// The reason text of a record refused for good (a dead letter's `error` header).
fn refusal_reason(
    code: RDKafkaErrorCode,
    error: &str,
    place: &str,
    max_message_bytes: &str,
) -> String {
    if is_size_error(code) {
        format!(
            "the record is too large for {place}: {error}; raise message.max.bytes in [kafka.properties] (now {max_message_bytes}) and the topic's max.message.bytes on the brokers"
        )
    } else {
        format!("Kafka refused the record for {place}: {error}")
    }
}

#[derive(Debug, Clone)]
enum TopicState {
    Ready,
    Pending,
    Refused(String),
}

/// The sink.
pub struct KafkaSink {
    /// Shared with the commit tasks (exactly-once).
    pub(super) producer: Arc<ThreadedProducer<RelayContext>>,
    pub(super) preparer: TopicPreparer,
    pub(super) notices: NoticeSender,
    keep_events: bool,
    topics: HashMap<String, TopicState>,
    /// The topics last found ready in `topics`, at most [`RECENTLY_READY`] (a shortcut
    /// for the next records).
    recently_ready: Vec<String>,
    /// Admin requests under way; aborted when the sink is dropped (a new attempt).
    tasks: JoinSet<()>,
    /// The producer's `message.max.bytes`, for error messages.
    max_message_bytes: String,
    /// Exactly-once: the transactional state, and what reading the checkpoint needs.
    pub(super) eos: Option<Transactions>,
    pub(super) checkpoint_reader: ClientConfig,
    pub(super) metrics: Arc<Metrics>,
    /// Fires [`SinkNotice::Due`] when the open transaction is old enough.
    pub(super) due_timer: Option<tokio::task::JoinHandle<()>>,
    placement: Placement,
}

impl Drop for KafkaSink {
    fn drop(&mut self) {
        if let Some(timer) = self.due_timer.take() {
            timer.abort();
        }
        // Exactly-once: an open transaction would hold back read_committed consumers of
        // its partitions until the next init_transactions or transaction.timeout.ms;
        // abort it now (bounded; it fails at once when fenced). Its records are sent
        // again by the next session.
        if self
            .eos
            .as_ref()
            .is_some_and(|eos| eos.is_open() && !eos.committing())
        {
            if let Err(error) = self.producer.abort_transaction(ABORT_TIMEOUT) {
                tracing::debug!(error = %error, "aborting the open Kafka transaction failed");
            }
        }
    }
}

/// How long dropping an exactly-once sink may wait for its open transaction's abort.
const ABORT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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
                    .unwrap_or_else(|| kafka_eos::default_transactional_id(slot)),
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
        let producer: ThreadedProducer<RelayContext> = config
            .create_with_context(RelayContext {
                notices: notices.clone(),
                max_message_bytes: max_message_bytes.clone(),
                metrics: Arc::clone(&metrics),
                transactional: eos.is_some(),
                placement: placement.clone(),
            })
            .map_err(|e| SinkError::KafkaSetup(settings.client_error(&e)))?;
        let producer = Arc::new(producer);
        let admin = admin_config(&settings.brokers, &settings.properties)
            .create_with_context(AdminContext)
            .map_err(|e| {
                SinkError::KafkaSetup(format!("admin client: {}", settings.client_error(&e)))
            })?;
        Ok(KafkaSink {
            producer,
            eos: eos.map(Transactions::new),
            checkpoint_reader: admin_config(&settings.brokers, &settings.properties),
            metrics,
            due_timer: None,
            preparer: TopicPreparer {
                admin: Arc::new(admin),
                create_topics: settings.create_topics,
                partitions: settings.topic_partitions,
                replication_factor: settings.topic_replication_factor,
                partition_counts: placement.counts(),
            },
            notices,
            keep_events,
            topics: HashMap::new(),
            recently_ready: Vec::with_capacity(RECENTLY_READY),
            tasks: JoinSet::new(),
            max_message_bytes,
            placement,
        })
    }

    /// Where `topic` stands; a topic seen for the first time is created (or checked) by
    /// a task whose outcome arrives as a [`SinkNotice::Topic`], to be handed to
    /// [`Sink::topic_prepared`].
    fn status_of(&mut self, topic: &str) -> TopicStatus {
        // Asked for every record, mostly about a few topics: comparing with the topics
        // found ready last is cheaper than hashing the name.
        if self.recently_ready.iter().any(|ready| ready == topic) {
            return TopicStatus::Ready;
        }
        match self.topics.get(topic) {
            Some(TopicState::Ready) => {
                self.remember_ready(topic);
                return TopicStatus::Ready;
            }
            Some(TopicState::Pending) => return TopicStatus::Waiting,
            Some(TopicState::Refused(reason)) => return TopicStatus::Refused(reason.clone()),
            None => {}
        }
        if let Some(reason) = illegal_topic_name(topic) {
            self.topics
                .insert(topic.to_owned(), TopicState::Refused(reason.clone()));
            return TopicStatus::Refused(reason);
        }
        while self.tasks.try_join_next().is_some() {}
        self.topics.insert(topic.to_owned(), TopicState::Pending);
        // "created topic" (info) follows only when the topic was really missing.
        if self.preparer.create_topics {
            tracing::debug!(%topic, "creating the topic unless it exists");
        } else {
            tracing::debug!(%topic, "checking that the topic exists");
        }
        let preparer = self.preparer.clone();
        let notices = self.notices.clone();
        let topic = topic.to_owned();
        self.tasks.spawn(async move {
            let outcome = preparer.prepare(&topic).await;
            let _ = notices.send(SinkNotice::Topic { topic, outcome });
        });
        TopicStatus::Waiting
    }

    /// Keep `topic` among the recently ready ones, in place of the oldest when full.
    fn remember_ready(&mut self, topic: &str) {
        if self.recently_ready.len() == RECENTLY_READY {
            self.recently_ready.remove(0);
        }
        self.recently_ready.push(topic.to_owned());
    }

    /// Record the outcome of a topic task.
    fn record_prepared(&mut self, topic: &str, outcome: &Result<(), SinkError>) {
        if outcome.is_err() {
            self.recently_ready.retain(|ready| ready != topic);
        }
        match outcome {
            Ok(()) => {
                self.topics.insert(topic.to_owned(), TopicState::Ready);
            }
            Err(SinkError::Topic { reason, .. }) => {
                self.topics
                    .insert(topic.to_owned(), TopicState::Refused(reason.clone()));
            }
            Err(_) => {
                // Asked again by the next attempt.
                self.topics.remove(topic);
            }
        }
    }

    /// Make sure `topic` exists, creating it when allowed, waiting for the answer (for
    /// the dead-letter topic, before streaming starts).
    async fn prepare_now(&mut self, topic: &str) -> Result<(), SinkError> {
        if let Some(reason) = illegal_topic_name(topic) {
            return Err(SinkError::Topic {
                topic: topic.to_owned(),
                reason,
            });
        }
        self.preparer.prepare(topic).await?;
        self.topics.insert(topic.to_owned(), TopicState::Ready);
        Ok(())
    }

    /// The producer's fatal error, if it has one.
    fn producer_fatal_error(&self) -> Option<String> {
        self.producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code}: {reason}"))
    }
}

impl Sink for KafkaSink {
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError> {
        if let Some(eos) = &mut self.eos {
            if eos.committing() {
                // Sent in the next transaction; the commit's reports resume the pump.
                return Err(SendError::QueueFull(Box::new(event)));
            }
            if !eos.is_open() {
                let producer = &self.producer;
                producer.begin_transaction().map_err(|e| {
                    kafka_eos::classify(
                        &eos.settings.transactional_id,
                        "beginning a Kafka transaction",
                        &e,
                        producer.client().fatal_error(),
                    )
                })?;
                eos.opened();
                let notices = self.notices.clone();
                let after = eos.settings.transaction_ms;
                if let Some(timer) = self.due_timer.take() {
                    timer.abort();
                }
                self.due_timer = Some(tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    let _ = notices.send(SinkNotice::Due);
                }));
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
            return Err(SendError::Sink(SinkError::KafkaStop(reason)));
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
                Err(SendError::Sink(SinkError::KafkaRetry(reason)))
            }
            ErrorAction::Stop => Err(SendError::Sink(SinkError::KafkaStop(format!(
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
        self.commit_if_due()
    }

    fn begin_session<'a>(
        &'a mut self,
        session: &'a Session,
    ) -> SinkFuture<'a, Result<Option<Checkpoint>, SinkError>> {
        Box::pin(self.start_transactions(session))
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
        self.commit_if_due()
    }

    fn stop_reason(&self) -> Option<String> {
        self.fenced()
    }

    fn topic_status(&mut self, topic: &str) -> TopicStatus {
        self.status_of(topic)
    }

    fn topic_prepared(&mut self, topic: &str, outcome: &Result<(), SinkError>) {
        self.record_prepared(topic, outcome);
    }

    fn ensure_topic<'a>(&'a mut self, topic: &'a str) -> SinkFuture<'a, Result<(), SinkError>> {
        Box::pin(self.prepare_now(topic))
    }

    fn fatal_error(&self) -> Option<String> {
        self.producer_fatal_error()
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

    #[test]
    fn refusal_reasons_say_what_to_raise_for_size() {
        let size = refusal_reason(
            RDKafkaErrorCode::MessageSizeTooLarge,
            "Broker: Message size too large",
            "t/0",
            "1000000",
        );
        assert!(
            size.contains("too large") && size.contains("message.max.bytes"),
            "{size}"
        );
        let other = refusal_reason(
            RDKafkaErrorCode::InvalidRecord,
            "Broker: invalid record",
            "t/0",
            "1",
        );
        assert!(
            other.contains("t/0") && other.contains("invalid record"),
            "{other}"
        );
    }
}
