//! Exactly-once into Kafka: the transactional side of the Kafka sink.
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
//! checkpoint, never ahead: on start (`KafkaSink::start_transactions`) `init_transactions` fences any older
//! producer of the same `transactional.id` (and aborts its open transaction), then a
//! read_committed consumer reads the last checkpoint, and the pipeline skips what it
//! covers ([`crate::sink::checkpoint::skip_for`]). Events between the checkpoint and the
//! crash were in an aborted transaction, which read_committed consumers never see.
//!
//! Commits run off the pipeline's loop (`spawn_blocking`): while one is under way the
//! sink answers "queue full", so reading pauses and status updates go on. A commit is
//! due when the transaction is `transaction_ms` old (checked at each end of a
//! PostgreSQL transaction, and by a timer's [`SinkNotice::Due`]) or holds
//! `transaction_max_events` records or `transaction_max_bytes` bytes; only the latter
//! two split a PostgreSQL transaction.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use crate::lsn::Lsn;
use crate::metrics::Metrics;
use crate::sink::checkpoint::{Checkpoint, Partial};
use rdkafka::producer::BaseRecord;

use crate::sink::kafka::{InFlight, KafkaSink};
use crate::sink::kafka_topics::illegal_topic_name;
use crate::sink::{NoticeSender, RecordTag, Session, SinkError, SinkNotice};

/// How long `init_transactions` and the checkpoint read may take before the attempt is
/// retried.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a commit may take; past it the session starts again.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The `[kafka]` exactly-once settings, resolved.
#[derive(Debug, Clone)]
pub struct EosSettings {
    pub transactional_id: String,
    pub offsets_topic: String,
    pub transaction_ms: Duration,
    pub max_events: u64,
    /// Bytes (key + value + headers) that make a transaction full.
    pub max_bytes: u64,
}

/// The default `transactional.id` of a slot.
pub fn default_transactional_id(slot: &str) -> String {
    format!("outbox-relay-{slot}")
}

/// The open Kafka transaction.
struct OpenTxn {
    tags: Vec<RecordTag>,
    /// Bytes of the records in `tags`.
    bytes: u64,
    opened_at: Instant,
}

/// The transactional state of a Kafka sink.
pub(super) struct Transactions {
    pub(super) settings: EosSettings,
    session: Option<Session>,
    /// A commit is under way; set by the sink, cleared by the commit task.
    committing: Arc<AtomicBool>,
    open: Option<OpenTxn>,
    /// The end of the last complete PostgreSQL transaction (or the checkpoint's).
    last_end_lsn: Lsn,
    /// The PostgreSQL transaction being sent, and how many of its records are sent.
    current: Option<Partial>,
}

/// What the sink must do after [`Transactions::due`].
pub(super) struct Commit {
    pub(super) checkpoint_key: String,
    pub(super) checkpoint: Vec<u8>,
    pub(super) tags: Vec<RecordTag>,
    pub(super) committing: Arc<AtomicBool>,
}

impl Transactions {
    pub(super) fn new(settings: EosSettings) -> Self {
        Transactions {
            settings,
            session: None,
            committing: Arc::new(AtomicBool::new(false)),
            open: None,
            last_end_lsn: Lsn::ZERO,
            current: None,
        }
    }

    pub(super) fn committing(&self) -> bool {
        self.committing.load(Ordering::Acquire)
    }

    /// Whether a Kafka transaction is open (else `begin_transaction` comes first).
    pub(super) fn is_open(&self) -> bool {
        self.open.is_some()
    }

    pub(super) fn opened(&mut self) {
        self.open = Some(OpenTxn {
            tags: Vec::new(),
            bytes: 0,
            opened_at: Instant::now(),
        });
    }

    pub(super) fn started(&mut self, session: Session, checkpoint: Option<&Checkpoint>) {
        self.session = Some(session);
        self.last_end_lsn = checkpoint.map_or(Lsn::ZERO, |c| c.end_lsn);
    }

    /// A record of the open transaction, of `bytes` bytes, was handed to librdkafka.
    pub(super) fn sent(&mut self, tag: RecordTag, bytes: u64) {
        if let Some(open) = &mut self.open {
            open.tags.push(tag);
            open.bytes = open.bytes.saturating_add(bytes);
        }
        if let Some(current) = &mut self.current {
            current.events += 1;
        }
    }

    pub(super) fn transaction_begin(&mut self, commit_lsn: Lsn, skipped: u64) {
        self.current = Some(Partial {
            commit_lsn,
            events: skipped,
        });
    }

    pub(super) fn transaction_end(&mut self, end_lsn: Lsn) {
        self.current = None;
        self.last_end_lsn = self.last_end_lsn.max(end_lsn);
    }

    /// The commit to make now, if one is due: `None` while a commit is under way, when
    /// no transaction is open, or when it is neither old nor full enough (an old one in
    /// the middle of a PostgreSQL transaction waits for its end; a full one is split).
    pub(super) fn due(&mut self) -> Option<Commit> {
        if self.committing() {
            return None;
        }
        let open = self.open.as_ref()?;
        let full = u64::try_from(open.tags.len()).unwrap_or(u64::MAX) >= self.settings.max_events
            || open.bytes >= self.settings.max_bytes;
        let old = open.opened_at.elapsed() >= self.settings.transaction_ms;
        let mid_transaction = self.current.is_some();
        if !(full || (old && !mid_transaction)) {
            return None;
        }
        let session = self.session.as_ref()?;
        let partial = self.current.filter(|partial| partial.events > 0);
        let checkpoint = Checkpoint::new(
            &session.slot,
            &session.system_id,
            self.last_end_lsn,
            partial,
        );
        let open = self.open.take()?;
        self.committing.store(true, Ordering::Release);
        Some(Commit {
            checkpoint_key: session.slot.clone(),
            checkpoint: checkpoint.encode(),
            tags: open.tags,
            committing: Arc::clone(&self.committing),
        })
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
        return SinkError::KafkaStop(fenced_message(transactional_id, &error.to_string()));
    }
    match fatal {
        Some((code, reason)) if is_fenced(code) => SinkError::KafkaStop(fenced_message(
            transactional_id,
            &format!("{code}: {reason}"),
        )),
        _ => SinkError::KafkaRetry(format!("{what} failed: {error}")),
    }
}

/// Commit the open transaction (blocking; run it with `spawn_blocking`), then report
/// every record of it delivered, or why not.
pub(super) fn commit_blocking<P: Producer<C>, C: rdkafka::producer::ProducerContext>(
    producer: &P,
    commit: Commit,
    transactional_id: &str,
    notices: &NoticeSender,
    metrics: &Metrics,
) {
    match producer.commit_transaction(COMMIT_TIMEOUT) {
        Ok(()) => {
            Metrics::add(&metrics.kafka_transactions, 1);
            // Cleared before the reports: a report lets the pipeline send again.
            commit.committing.store(false, Ordering::Release);
            for tag in commit.tags {
                let _ = notices.send(SinkNotice::Delivered { tag });
            }
        }
        Err(error) => {
            let notice = match classify(
                transactional_id,
                "committing the Kafka transaction",
                &error,
                producer.client().fatal_error(),
            ) {
                SinkError::KafkaStop(reason) => SinkNotice::Stop { reason },
                other => SinkNotice::Retry {
                    reason: other.to_string(),
                },
            };
            let _ = notices.send(notice);
        }
    }
}

/// The checkpoint reader's client context: its errors are answered by [`read_checkpoint`]
/// itself (a partition's end is the expected way out), so librdkafka's error callback
/// only logs them at debug level instead of rdkafka's default ERROR.
struct QuietContext;

impl rdkafka::ClientContext for QuietContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(error = %error, reason, "checkpoint reader");
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// Read the last committed checkpoint of `slot` from `topic` (blocking): every
/// partition from its start to its end as a read_committed consumer sees it.
pub(super) fn read_checkpoint(
    mut config: ClientConfig,
    topic: &str,
    slot: &str,
) -> Result<Option<Checkpoint>, SinkError> {
    let unavailable = |reason: String| SinkError::TopicUnavailable {
        topic: topic.to_owned(),
        reason,
    };
    let consumer: BaseConsumer<QuietContext> = config
        .set("group.id", "outbox-relay-checkpoint-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create_with_context(QuietContext)
        .map_err(|e| SinkError::KafkaSetup(format!("checkpoint reader: {e}")))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), START_TIMEOUT)
        .map_err(|e| unavailable(format!("cannot read its metadata: {e}")))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(unavailable(
            "the offsets topic has no partitions (does it exist?)".into(),
        ));
    }
    let mut list = TopicPartitionList::new();
    let mut remaining = HashSet::new();
    for &partition in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, START_TIMEOUT)
            .map_err(|e| {
                unavailable(format!("cannot read partition {partition}'s offsets: {e}"))
            })?;
        if high > low {
            list.add_partition_offset(topic, partition, Offset::Beginning)
                .map_err(|e| unavailable(e.to_string()))?;
            remaining.insert(partition);
        }
    }
    if remaining.is_empty() {
        return Ok(None);
    }
    consumer
        .assign(&list)
        .map_err(|e| unavailable(format!("cannot read it: {e}")))?;
    let deadline = Instant::now() + START_TIMEOUT;
    let mut last: Option<Checkpoint> = None;
    while !remaining.is_empty() {
        if Instant::now() > deadline {
            return Err(unavailable(format!(
                "reading the last checkpoint did not finish within {}s (an open transaction of another producer on the topic?)",
                START_TIMEOUT.as_secs()
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(message)) => {
                if message.key() != Some(slot.as_bytes()) {
                    continue;
                }
                last = match message.payload() {
                    // A tombstone: the checkpoint was deleted.
                    None => None,
                    Some(value) => Some(Checkpoint::decode(value).map_err(|reason| {
                        SinkError::KafkaStop(format!(
                            "the offsets topic {topic:?} holds a record with key {slot:?} at partition {} offset {} that is {reason}; choose another [kafka] offsets_topic for this relay",
                            message.partition(),
                            message.offset()
                        ))
                    })?),
                };
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                remaining.remove(&partition);
            }
            Some(Err(error)) => {
                return Err(unavailable(format!(
                    "reading the checkpoint failed: {error}"
                )))
            }
        }
    }
    Ok(last)
}

impl KafkaSink {
    /// Exactly-once: when the producer failed because a newer one fenced it, the
    /// message to stop with.
    pub(super) fn fenced(&self) -> Option<String> {
        let eos = self.eos.as_ref()?;
        let (code, reason) = self.producer.client().fatal_error()?;
        is_fenced(code)
            .then(|| fenced_message(&eos.settings.transactional_id, &format!("{code}: {reason}")))
    }

    /// Exactly-once start: the offsets topic, `init_transactions` (fencing older
    /// producers of the id, aborting their open transaction), then the last committed
    /// checkpoint, trusted only for the same PostgreSQL system.
    pub(super) async fn start_transactions(
        &mut self,
        session: &Session,
    ) -> Result<Option<Checkpoint>, SinkError> {
        let Some(eos) = &self.eos else {
            return Ok(None);
        };
        let topic = eos.settings.offsets_topic.clone();
        let transactional_id = eos.settings.transactional_id.clone();
        if let Some(reason) = illegal_topic_name(&topic) {
            return Err(SinkError::KafkaStop(format!(
                "kafka.offsets_topic {topic:?}: {reason}"
            )));
        }
        self.preparer.prepare_compacted(&topic).await?;
        let producer = Arc::clone(&self.producer);
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
        .map_err(|e| SinkError::KafkaRetry(format!("initialising Kafka transactions: {e}")))??;
        let config = self.checkpoint_reader.clone();
        let slot = session.slot.clone();
        let reader_topic = topic.clone();
        let checkpoint =
            tokio::task::spawn_blocking(move || read_checkpoint(config, &reader_topic, &slot))
                .await
                .map_err(|e| SinkError::KafkaRetry(format!("reading the checkpoint: {e}")))??;
        if let Some(checkpoint) = &checkpoint {
            checkpoint
                .check_system(&session.system_id, &topic)
                .map_err(SinkError::KafkaStop)?;
        }
        tracing::info!(
            transactional_id = %transactional_id,
            offsets_topic = %topic,
            checkpoint_end_lsn = %checkpoint.as_ref().map_or(Lsn::ZERO, |c| c.end_lsn),
            checkpoint_partial_events = checkpoint.as_ref().and_then(|c| c.partial).map_or(0, |p| p.events),
            "exactly-once: transactions initialised, skipping what the checkpoint covers"
        );
        if let Some(eos) = &mut self.eos {
            eos.started(session.clone(), checkpoint.as_ref());
        }
        Ok(checkpoint)
    }

    /// Exactly-once: when the open transaction is due, send its checkpoint record and
    /// commit it off the loop.
    pub(super) fn commit_if_due(&mut self) -> Result<(), SinkError> {
        let Some(eos) = &mut self.eos else {
            return Ok(());
        };
        let Some(commit) = eos.due() else {
            return Ok(());
        };
        let topic = eos.settings.offsets_topic.clone();
        let transactional_id = eos.settings.transactional_id.clone();
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
        if let Err((error, _)) = self.producer.send(record) {
            return Err(classify(
                &transactional_id,
                "sending the checkpoint record",
                &error,
                self.producer.client().fatal_error(),
            ));
        }
        if let Some(timer) = self.due_timer.take() {
            timer.abort();
        }
        let producer = Arc::clone(&self.producer);
        let notices = self.notices.clone();
        let metrics = Arc::clone(&self.metrics);
        tokio::task::spawn_blocking(move || {
            commit_blocking(&*producer, commit, &transactional_id, &notices, &metrics);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Ticket;

    fn settings(max_events: u64, transaction_ms: u64) -> EosSettings {
        EosSettings {
            transactional_id: "outbox-relay-s".into(),
            offsets_topic: "offsets".into(),
            transaction_ms: Duration::from_millis(transaction_ms),
            max_events,
            max_bytes: u64::MAX,
        }
    }

    fn tag(seq: u64, index: u64) -> RecordTag {
        RecordTag {
            ticket: Ticket { seq, serial: index },
            dead_letter: false,
        }
    }

    fn started(max_events: u64, transaction_ms: u64) -> Transactions {
        let mut txns = Transactions::new(settings(max_events, transaction_ms));
        txns.started(
            Session {
                slot: "s".into(),
                system_id: "7301".into(),
            },
            None,
        );
        txns
    }

    #[test]
    fn commits_whole_postgres_transactions_when_old_enough() {
        let mut txns = started(100, 0);
        assert!(txns.due().is_none(), "nothing open");
        txns.transaction_begin(Lsn(90), 0);
        txns.opened();
        txns.sent(tag(0, 0), 1);
        // Old, but in the middle of a PostgreSQL transaction: waits for its end.
        assert!(txns.due().is_none());
        txns.transaction_end(Lsn(100));
        let commit = txns.due().expect("due");
        assert_eq!(commit.tags, vec![tag(0, 0)]);
        let checkpoint = Checkpoint::decode(&commit.checkpoint).unwrap();
        assert_eq!(checkpoint.end_lsn, Lsn(100));
        assert_eq!(checkpoint.partial, None);
        assert_eq!(commit.checkpoint_key, "s");
        assert!(txns.committing() && !txns.is_open());
        assert!(txns.due().is_none(), "one commit at a time");
    }

    #[test]
    fn a_full_transaction_splits_and_counts_the_committed_events() {
        let mut txns = started(2, 60_000);
        txns.transaction_begin(Lsn(500), 3);
        txns.opened();
        txns.sent(tag(0, 0), 1);
        assert!(txns.due().is_none(), "neither full nor old");
        txns.sent(tag(0, 1), 1);
        let commit = txns.due().expect("full");
        let checkpoint = Checkpoint::decode(&commit.checkpoint).unwrap();
        assert_eq!(checkpoint.end_lsn, Lsn::ZERO);
        assert_eq!(
            checkpoint.partial,
            Some(Partial {
                commit_lsn: Lsn(500),
                events: 5
            })
        );
    }

    #[test]
    fn a_transaction_full_in_bytes_splits() {
        let mut txns = started(100, 60_000);
        txns.settings.max_bytes = 1_000;
        txns.transaction_begin(Lsn(500), 0);
        txns.opened();
        txns.sent(tag(0, 0), 600);
        assert!(txns.due().is_none(), "600 of 1000 bytes, 1 of 100 records");
        txns.sent(tag(0, 1), 400);
        let commit = txns.due().expect("full in bytes");
        assert_eq!(commit.tags, vec![tag(0, 0), tag(0, 1)]);
        let checkpoint = Checkpoint::decode(&commit.checkpoint).unwrap();
        assert_eq!(
            checkpoint.partial,
            Some(Partial {
                commit_lsn: Lsn(500),
                events: 2
            })
        );
    }

    #[test]
    fn the_checkpoint_never_goes_back_behind_the_one_read() {
        let mut txns = Transactions::new(settings(1, 0));
        let read = Checkpoint::new("s", "7301", Lsn(1000), None);
        txns.started(
            Session {
                slot: "s".into(),
                system_id: "7301".into(),
            },
            Some(&read),
        );
        // A replayed (skipped) transaction ends below the checkpoint.
        txns.transaction_begin(Lsn(700), 0);
        txns.transaction_end(Lsn(800));
        txns.transaction_begin(Lsn(1100), 0);
        txns.opened();
        txns.sent(tag(1, 0), 1);
        txns.transaction_end(Lsn(1200));
        let commit = txns.due().expect("due");
        let checkpoint = Checkpoint::decode(&commit.checkpoint).unwrap();
        assert_eq!(checkpoint.end_lsn, Lsn(1200));
    }

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
            SinkError::KafkaRetry(_)
        ));
        assert!(matches!(
            classify(
                "id",
                "committing",
                &state,
                Some((RDKafkaErrorCode::Fenced, "fenced by a newer instance".into()))
            ),
            SinkError::KafkaStop(message) if message.contains("fenced")
        ));
        assert!(matches!(
            classify(
                "id",
                "committing",
                &state,
                Some((RDKafkaErrorCode::OutOfOrderSequenceNumber, "gap".into()))
            ),
            SinkError::KafkaRetry(_)
        ));
    }
}
