//! What reaches the Kafka sink from outside the pipeline's loop, and how it is passed on.
//!
//! ```text
//! librdkafka thread: delivery report ──▶ Delivered{tag} / Refused{tag, ...} / Stop ──▶ pipeline
//!                    client error    ──▶ Stop (refused login, TLS)                 ──▶ pipeline
//!                                    └─▶ Wakeup::ClientError ┐
//!                    failed report   ──▶ Wakeup::Retry       ├─ queued, then one Wake ──▶ pipeline
//! commit task, due timer, topic task ──▶ Wakeup::...         ┘   ──▶ KafkaSink::poll takes it
//! ```
//!
//! Notices the pipeline can act on alone go straight to it (one per delivery report,
//! nothing else on that path). What needs the producer itself before it means anything
//! (was the client error fatal? was the producer fenced? is the transaction due? did the
//! topic get created?) is queued as a `Wakeup` and announced by one
//! [`SinkNotice::Wake`]; the pipeline answers each Wake with one call of
//! [`Sink::poll`](crate::sink::Sink::poll), which takes one wakeup, so they are handled
//! in the channel's order, after the deliveries reported before them.

use std::sync::Arc;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use tokio::sync::mpsc;

use crate::event::OutboxEvent;
use crate::metrics::Metrics;
use crate::sink::kafka_errors::{action, client_error_stop, is_size_error, stop_hint, ErrorAction};
use crate::sink::kafka_log;
use crate::sink::kafka_placement::Placement;
use crate::sink::kafka_secrets::withhold_secret_detail;
use crate::sink::{DeliveryFailure, NoticeSender, RecordTag, SinkError, SinkNotice};

/// The Kafka sink's producer.
pub(super) type Producer = ThreadedProducer<RelayContext>;

/// Per-message state carried through librdkafka to the delivery callback.
pub(super) struct InFlight {
    /// `None` for an exactly-once checkpoint record.
    pub(super) tag: Option<RecordTag>,
    /// Kept only when a dead-letter topic can take the event if it is refused.
    pub(super) event: Option<Box<OutboxEvent>>,
    /// The partition the event asked for (a `partition` placement).
    pub(super) partition: Option<i32>,
}

/// Work for [`Sink::poll`](crate::sink::Sink::poll), on the pipeline's task.
#[derive(Debug)]
pub(super) enum Wakeup {
    /// The client reported an error: it may have become fatal (librdkafka does not flag
    /// fatal errors in its error callback) or fenced.
    ClientError,
    /// A record or a commit failed transiently: retry with this reason, unless the
    /// producer was fenced (stop) or failed for good (its fatal error says why).
    Retry(String),
    /// The open exactly-once transaction may be due for its commit.
    Due,
    /// A topic task ended: the topic is ready, or why not.
    Topic {
        topic: String,
        outcome: Result<(), SinkError>,
    },
}

/// Sends the sink's notices: straight to the pipeline, or queued for its poll.
#[derive(Clone)]
pub(super) struct Notifier {
    notices: NoticeSender,
    wakeups: mpsc::UnboundedSender<Wakeup>,
}

impl Notifier {
    /// A notifier and the queue of wakeups the sink's poll takes from.
    pub(super) fn new(notices: NoticeSender) -> (Self, mpsc::UnboundedReceiver<Wakeup>) {
        let (wakeups, queued) = mpsc::unbounded_channel();
        (Notifier { notices, wakeups }, queued)
    }

    /// A notice the pipeline acts on alone. A closed channel means the pipeline is
    /// gone; nothing is left to tell.
    pub(super) fn notify(&self, notice: SinkNotice) {
        let _ = self.notices.send(notice);
    }

    /// Queue `wakeup`, then wake the pipeline for it (in this order, so a poll always
    /// finds the wakeup its Wake announced).
    pub(super) fn wake(&self, wakeup: Wakeup) {
        if self.wakeups.send(wakeup).is_ok() {
            let _ = self.notices.send(SinkNotice::Wake);
        }
    }
}

/// Receives librdkafka's callbacks and turns them into notices.
pub(super) struct RelayContext {
    pub(super) notifier: Notifier,
    /// The producer's `message.max.bytes`, for error messages.
    pub(super) max_message_bytes: String,
    /// Deliveries are counted per topic here.
    pub(super) metrics: Arc<Metrics>,
    /// Exactly-once: a record is durable when its transaction commits, not at its
    /// delivery report, and a failed one fails its whole transaction.
    pub(super) transactional: bool,
    /// For a partition placement the topic cannot take.
    pub(super) placement: Placement,
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
            self.notifier.notify(SinkNotice::Stop { reason });
            return;
        }
        // Transient errors (broker down, network) are retried by librdkafka on its own;
        // a fatal one is only visible through the client, which the sink's poll checks.
        self.notifier.wake(Wakeup::ClientError);
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
                    // Durable with its transaction's commit (kafka_eos::commit_blocking).
                    _ => return,
                }
            }
            (Err((error, message)), tag) if self.transactional || tag.is_none() => {
                let code = error
                    .rdkafka_error_code()
                    .unwrap_or(RDKafkaErrorCode::Unknown);
                let place = format!("{}/{}", message.topic(), message.partition());
                if let Some(reason) = self.placement.refusal(code, message.topic(), partition) {
                    self.notifier.notify(SinkNotice::Stop {
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
                    ErrorAction::Retry => {
                        return self.notifier.wake(Wakeup::Retry(format!(
                            "a record for {place} failed: {error}"
                        )))
                    }
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
                    self.notifier.notify(SinkNotice::Refused { tag, failure });
                    return;
                }
                match action(code) {
                    ErrorAction::Retry => {
                        return self.notifier.wake(Wakeup::Retry(format!(
                            "a record for {place} failed: {error}"
                        )))
                    }
                    ErrorAction::Stop => SinkNotice::Stop {
                        reason: format!(
                            "Kafka refused a record for {place}: {error}; {}",
                            stop_hint(code)
                        ),
                    },
                    ErrorAction::DeadLetter => SinkNotice::Refused {
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
        self.notifier.notify(notice);
    }
}

/// The reason text of a record refused for good (a dead letter's `error` header).
pub(super) fn refusal_reason(
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[tokio::test]
    async fn a_wake_follows_its_wakeup_and_notices_go_straight() {
        let (notices, mut received) = mpsc::unbounded_channel();
        let (notifier, mut wakeups) = Notifier::new(notices);
        notifier.notify(SinkNotice::Stop {
            reason: "stop".into(),
        });
        notifier.wake(Wakeup::Due);
        assert!(matches!(received.try_recv(), Ok(SinkNotice::Stop { .. })));
        assert!(matches!(received.try_recv(), Ok(SinkNotice::Wake)));
        assert!(matches!(wakeups.try_recv(), Ok(Wakeup::Due)));
        assert!(received.try_recv().is_err() && wakeups.try_recv().is_err());
        // The sink is gone (its queue closed): no Wake for a wakeup nobody will take.
        drop(wakeups);
        notifier.wake(Wakeup::ClientError);
        assert!(received.try_recv().is_err());
    }
}
