//! Exactly-once into Kafka: the transactional side of the Kafka sink, and the I/O it
//! does with the producer (the state it keeps is [`super::kafka_eos_state`]'s, the
//! checkpoint read [`super::kafka_checkpoint`]'s).
//!
//! ```text
//! PG txn a ─┐                        ┌─ commit_transaction ok ─▶ Delivered{tag} for every record
//! PG txn b ─┼─▶ one Kafka transaction ┤                            (the ack tracker moves, the
//! PG txn c ─┘   + checkpoint record   │                             slot is acknowledged after)
//!               {slot, system, end_lsn}└─ fails ─▶ Retry (new session: the checkpoint decides)
//!                                       └─ fenced ─▶ Stop (a newer relay owns the id)
//! ```
//!
//! Correctness: a record is reported durable only when the Kafka transaction holding it
//! committed, and that transaction's checkpoint record says which PostgreSQL
//! transactions it completes (its `end_lsn`) or how far it got into a split one. The
//! slot is acknowledged after the commit, so after a crash the slot is at or behind the
//! checkpoint, never ahead: on start (`ExactlyOnce::start`) `init_transactions` fences
//! any older producer of the same `transactional.id` (and aborts its open transaction),
//! then a read_committed consumer reads the last checkpoint, and the pipeline skips what
//! it covers ([`crate::sink::checkpoint::skip_for`]). Events between the checkpoint and
//! the crash were in an aborted transaction, which read_committed consumers never see.
//!
//! Commits run off the pipeline's loop (`spawn_blocking`): while one is under way the
//! sink answers "queue full", so reading pauses and status updates go on. A commit is
//! due when the transaction is `transaction_ms` old (checked at each end of a
//! PostgreSQL transaction, and by a timer whose `Wakeup::Due` the sink's poll takes)
//! or holds `transaction_max_events` records or `transaction_max_bytes` bytes; only the
//! latter two split a PostgreSQL transaction. A fenced producer stops the relay: the
//! sink asks `ExactlyOnce::fenced` before it retries after any failure.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, Producer as _};
use tokio::task::JoinHandle;

use crate::lsn::Lsn;
use crate::metrics::Metrics;
use crate::sink::checkpoint::Checkpoint;
use crate::sink::kafka_checkpoint::read_checkpoint;
use crate::sink::kafka_delivery::{InFlight, Notifier, Producer, Wakeup};
use crate::sink::kafka_eos_state::{Commit, EosSettings, Transactions};
use crate::sink::kafka_errors::retry;
use crate::sink::kafka_topics::{illegal_topic_name, TopicPreparer};
use crate::sink::{RecordTag, Session, SinkError, SinkNotice};

/// How long a commit may take; past it the session starts again.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long dropping an exactly-once sink may wait for its open transaction's abort.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default `transactional.id` of a slot.
pub fn default_transactional_id(slot: &str) -> String {
    format!("outbox-relay-{slot}")
}

/// The exactly-once part of a Kafka sink: its transactions, the timer that makes the
/// open one due, and what reading the checkpoint needs.
pub(super) struct ExactlyOnce {
    txns: Transactions,
    checkpoint_reader: ClientConfig,
    metrics: Arc<Metrics>,
    /// Wakes the sink ([`Wakeup::Due`]) when the open transaction is old enough.
    due_timer: Option<JoinHandle<()>>,
}

impl ExactlyOnce {
    pub(super) fn new(
        settings: EosSettings,
        checkpoint_reader: ClientConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        ExactlyOnce {
            txns: Transactions::new(settings),
            checkpoint_reader,
            metrics,
            due_timer: None,
        }
    }

    pub(super) fn transactional_id(&self) -> &str {
        &self.txns.settings.transactional_id
    }

    /// Before a record is sent: `Ok(false)` while a commit is under way (the record
    /// waits as for a full queue; the commit's reports resume the pump). When no Kafka
    /// transaction is open, one begins, with the timer that makes it due.
    pub(super) fn before_send(
        &mut self,
        producer: &Producer,
        notifier: &Notifier,
    ) -> Result<bool, SinkError> {
        if self.txns.committing() {
            return Ok(false);
        }
        if !self.txns.is_open() {
            producer.begin_transaction().map_err(|e| {
                classify(
                    self.transactional_id(),
                    "beginning a Kafka transaction",
                    &e,
                    producer.client().fatal_error(),
                )
            })?;
            self.txns.opened();
            let notifier = notifier.clone();
            let after = self.txns.settings.transaction_ms;
            if let Some(timer) = self.due_timer.take() {
                timer.abort();
            }
            self.due_timer = Some(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                notifier.wake(Wakeup::Due);
            }));
        }
        Ok(true)
    }

    /// A record of the open transaction, of `bytes` bytes, was handed to librdkafka.
    pub(super) fn sent(&mut self, tag: RecordTag, bytes: u64) {
        self.txns.sent(tag, bytes);
    }

    pub(super) fn transaction_begin(&mut self, commit_lsn: Lsn, skipped: u64) {
        self.txns.transaction_begin(commit_lsn, skipped);
    }

    pub(super) fn transaction_end(&mut self, end_lsn: Lsn) {
        self.txns.transaction_end(end_lsn);
    }

    /// When the producer failed because a newer one fenced it, the message to stop with.
    pub(super) fn fenced(&self, producer: &Producer) -> Option<String> {
        let (code, reason) = producer.client().fatal_error()?;
        is_fenced(code)
            .then(|| fenced_message(self.transactional_id(), &format!("{code}: {reason}")))
    }

    /// The sink is dropped (a new attempt): an open transaction would hold back
    /// read_committed consumers of its partitions until the next init_transactions or
    /// transaction.timeout.ms; abort it now (bounded; it fails at once when fenced). Its
    /// records are sent again by the next session.
    pub(super) fn close(&mut self, producer: &Producer) {
        if let Some(timer) = self.due_timer.take() {
            timer.abort();
        }
        if self.txns.is_open() && !self.txns.committing() {
            if let Err(error) = producer.abort_transaction(ABORT_TIMEOUT) {
                tracing::debug!(error = %error, "aborting the open Kafka transaction failed");
            }
        }
    }

    /// The session starts: the offsets topic, `init_transactions` (fencing older
    /// producers of the id, aborting their open transaction), then the last committed
    /// checkpoint, trusted only for the same PostgreSQL system.
    pub(super) async fn start(
        &mut self,
        producer: &Arc<Producer>,
        preparer: &TopicPreparer,
        session: &Session,
    ) -> Result<Option<Checkpoint>, SinkError> {
        let topic = self.txns.settings.offsets_topic.clone();
        let transactional_id = self.transactional_id().to_owned();
        if let Some(reason) = illegal_topic_name(&topic) {
            return Err(SinkError::Stop(format!(
                "kafka.offsets_topic {topic:?}: {reason}"
            )));
        }
        preparer.prepare_compacted(&topic).await?;
        let producer = Arc::clone(producer);
        let id = transactional_id.clone();
        tokio::task::spawn_blocking(move || {
            producer
                .init_transactions(std::time::Duration::from_secs(30))
                .map_err(|e| {
                    classify(
                        &id,
                        "initialising Kafka transactions",
                        &e,
                        producer.client().fatal_error(),
                    )
                })
        })
        .await
        .map_err(|e| retry(format!("initialising Kafka transactions: {e}")))??;
        let config = self.checkpoint_reader.clone();
        let slot = session.slot.clone();
        let reader_topic = topic.clone();
        let checkpoint =
            tokio::task::spawn_blocking(move || read_checkpoint(config, &reader_topic, &slot))
                .await
                .map_err(|e| retry(format!("reading the checkpoint: {e}")))??;
        if let Some(checkpoint) = &checkpoint {
            checkpoint
                .check_system(&session.system_id, &topic)
                .map_err(SinkError::Stop)?;
        }
        tracing::info!(
            transactional_id = %transactional_id,
            offsets_topic = %topic,
            checkpoint_end_lsn = %checkpoint.as_ref().map_or(Lsn::ZERO, |c| c.end_lsn),
            checkpoint_partial_events = checkpoint.as_ref().and_then(|c| c.partial).map_or(0, |p| p.events),
            "exactly-once: transactions initialised, skipping what the checkpoint covers"
        );
        self.txns.started(session.clone(), checkpoint.as_ref());
        Ok(checkpoint)
    }

    /// When the open transaction is due, send its checkpoint record and commit it off
    /// the loop.
    pub(super) fn commit_if_due(
        &mut self,
        producer: &Arc<Producer>,
        notifier: &Notifier,
    ) -> Result<(), SinkError> {
        let Some(commit) = self.txns.due() else {
            return Ok(());
        };
        let topic = self.txns.settings.offsets_topic.clone();
        let transactional_id = self.transactional_id().to_owned();
        let record = BaseRecord::with_opaque_to(
            &topic,
            Box::new(InFlight {
                tag: None,
                event: None,
                partition: None,
            }),
        )
        .key(commit.checkpoint_key.as_bytes())
        .payload(&commit.checkpoint);
        if let Err((error, _)) = producer.send(record) {
            return Err(classify(
                &transactional_id,
                "sending the checkpoint record",
                &error,
                producer.client().fatal_error(),
            ));
        }
        if let Some(timer) = self.due_timer.take() {
            timer.abort();
        }
        let producer = Arc::clone(producer);
        let notifier = notifier.clone();
        let metrics = Arc::clone(&self.metrics);
        tokio::task::spawn_blocking(move || {
            commit_blocking(&producer, commit, &transactional_id, &notifier, &metrics);
        });
        Ok(())
    }
}

/// Whether a transactional error means a newer producer took over this id.
pub fn is_fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Fenced
            | RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
    )
}

/// The message a fenced relay stops with.
pub fn fenced_message(transactional_id: &str, error: &str) -> String {
    if error.contains("uthoriz") {
        return format!(
            "Kafka refused transactional id {transactional_id:?}: {error}; grant the relay's principal WRITE and DESCRIBE on that transactional id (and IdempotentWrite on the cluster), see docs/exactly-once.md"
        );
    }
    format!(
        "this relay was fenced: another producer with transactional id {transactional_id:?} started after it ({error}), so this one stops instead of writing. Another relay instance owns the slot's Kafka transactions now; if that is not intended, give each slot its own [kafka] transactional_id, see docs/exactly-once.md"
    )
}

/// Classify a transactional call's failure: fenced (or not allowed) stops, anything
/// else starts the session again (the new producer aborts what is open, the checkpoint
/// says where to resume).
/// `fatal` is the producer's fatal error, if it has one: the error of the call itself
/// may only say "fatal" or "wrong state" while the fatal error says "fenced".
pub fn classify(
    transactional_id: &str,
    what: &str,
    error: &KafkaError,
    fatal: Option<(RDKafkaErrorCode, String)>,
) -> SinkError {
    let code = error
        .rdkafka_error_code()
        .unwrap_or(RDKafkaErrorCode::Unknown);
    if is_fenced(code) {
        return SinkError::Stop(fenced_message(transactional_id, &error.to_string()));
    }
    match fatal {
        Some((code, reason)) if is_fenced(code) => SinkError::Stop(fenced_message(
            transactional_id,
            &format!("{code}: {reason}"),
        )),
        _ => retry(format!("{what} failed: {error}")),
    }
}

/// Commit the open transaction (blocking; run it with `spawn_blocking`), then report
/// every record of it delivered, or why not.
fn commit_blocking(
    producer: &Producer,
    commit: Commit,
    transactional_id: &str,
    notifier: &Notifier,
    metrics: &Metrics,
) {
    match producer.commit_transaction(COMMIT_TIMEOUT) {
        Ok(()) => {
            Metrics::add(&metrics.kafka_transactions, 1);
            // Cleared before the reports: a report lets the pipeline send again.
            commit.committing.store(false, Ordering::Release);
            for tag in commit.tags {
                notifier.notify(SinkNotice::Delivered { tag });
            }
        }
        Err(error) => match classify(
            transactional_id,
            "committing the Kafka transaction",
            &error,
            producer.client().fatal_error(),
        ) {
            SinkError::Stop(reason) => notifier.notify(SinkNotice::Stop { reason }),
            // Checked again for fencing and a fatal error by the sink's poll, which
            // words the retry (the reason alone here, or it would say it twice).
            _ => notifier.wake(Wakeup::Retry(format!(
                "committing the Kafka transaction failed: {error}"
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fencing_stops_and_says_what_to_do() {
        assert!(is_fenced(RDKafkaErrorCode::Fenced));
        assert!(is_fenced(RDKafkaErrorCode::ProducerFenced));
        assert!(!is_fenced(RDKafkaErrorCode::RequestTimedOut));
        let message = fenced_message("outbox-relay-s", "Local: This instance has been fenced");
        assert!(message.contains("fenced") && message.contains("transactional_id"));
        assert_eq!(default_transactional_id("s"), "outbox-relay-s");
    }

    #[test]
    fn a_call_failing_for_a_fenced_producer_stops_whatever_its_own_code() {
        let state = KafkaError::Flush(RDKafkaErrorCode::State);
        assert!(matches!(
            classify("id", "committing", &state, None),
            SinkError::Retry(_)
        ));
        assert!(matches!(
            classify(
                "id",
                "committing",
                &state,
                Some((RDKafkaErrorCode::Fenced, "fenced by a newer instance".into()))
            ),
            SinkError::Stop(message) if message.contains("fenced")
        ));
        assert!(matches!(
            classify(
                "id",
                "committing",
                &state,
                Some((RDKafkaErrorCode::OutOfOrderSequenceNumber, "gap".into()))
            ),
            SinkError::Retry(_)
        ));
    }
}
