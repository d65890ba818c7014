//! The transactional state of the exactly-once Kafka sink, pure: which records the open
//! Kafka transaction holds, which PostgreSQL transaction is being sent, and when the
//! open transaction is due for its commit, with the checkpoint record it ends with.
//! The I/O (begin, commit, fencing) is [`super::kafka_eos`]'s.
//!
//! A commit is due when the transaction is `transaction_ms` old and no PostgreSQL
//! transaction is half sent, or when it holds `max_events` records or `max_bytes`
//! bytes (then a PostgreSQL transaction is split, and the checkpoint says how far it
//! got).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lsn::Lsn;
use crate::sink::checkpoint::{Checkpoint, Partial};
use crate::sink::{RecordTag, Session};

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
}
