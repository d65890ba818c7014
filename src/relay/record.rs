//! The relay's acknowledged position, recorded in its state table, and the resume from
//! it after PostgreSQL forgot part of the slot's progress.
//!
//! # Why
//!
//! PostgreSQL keeps a logical slot's `confirmed_flush_lsn` in memory and writes it to
//! disk only at checkpoints (before 17, not even at a clean shutdown's). After a crash,
//! an immediate or (before 17) a fast restart, or a failover to a standby whose slot was
//! synchronised a while ago, the slot rewinds to its last saved position and the
//! walsender sends again every transaction since: thousands of duplicates per fault
//! under load. The relay writes the position it acknowledged into its state table
//! ([`crate::pg::state`]), a row in the same database, at most once per [`RECORD_GAP`]
//! while events are being acknowledged, and never while idle (see [`Recorder`]). On
//! every start it reads the record, and a transaction whose commit lies before the
//! recorded position is not sent again: it is acknowledged as if delivered, its events
//! counted in `outbox_relay_skipped_recorded_total`, the range logged.
//!
//! # Why a skipped transaction is certainly in Kafka
//!
//! The record holds an acknowledged position, and the relay acknowledges a position
//! only once the sink confirmed every event before it (Kafka: the delivery reports,
//! `acks=all`; see [`crate::relay::ack`]). The write of the record is queued after that
//! confirmation, never before. Transactions are skipped only when their commit record
//! begins before the recorded position, that is, when they end at or before it: each was
//! delivered whole.
//!
//! # Why a restore, a failover or a promoted standby cannot make it skip too much
//!
//! The record is a row in the database the slot decodes, so it travels with the WAL it
//! describes: a position recorded at WAL position `W` is only ever read on a server whose
//! WAL contains `W`, and the position it holds is below `W` (it was acknowledged before
//! the UPDATE was written). A standby, promoted, has replayed the record's WAL or not:
//! if not, it reads an older record (more duplicates, nothing lost); if it has, every
//! transaction below the recorded position is the same on its new timeline (a timeline
//! forks after `W`). A restore to an earlier point brings the record of that point back
//! with the data. What the record cannot follow is a copy of the row into another
//! cluster (a logical dump, a restore into a new cluster): LSNs mean nothing there, so
//! the record is used only when its system identifier is the server's (otherwise the
//! relay logs that it ignores it). A new slot resets the record (`created_sql`), and a
//! position below the slot's own is no skip at all.
//!
//! # Two instances on one slot
//!
//! Only the instance that holds the slot streams, acknowledges and records; a standby
//! that takes over reads the record the other left, which is as safe for it as for the
//! writer (the record says what Kafka confirmed, whichever process sent it).
//!
//! # Exactly-once
//!
//! With `[kafka] exactly_once`, the checkpoint committed in each Kafka transaction is
//! the authority: it is written before the acknowledgement (inside the transaction whose
//! commit the acknowledgement waits for), so it is never behind the record. The record
//! is used only when there is no checkpoint yet.
//!
//! # How much is sent again
//!
//! At most what was acknowledged in the last [`RECORD_GAP`] before the fault (plus what
//! was in flight, as always with at-least-once): positions acknowledged are recorded at
//! most [`RECORD_GAP`] later, and a fault between an acknowledgement and its record
//! resends only that window. A graceful stop writes the last position and waits for the
//! write (bounded), so a stop followed by a rewind resends nothing.
//!
//! Within one process the window is smaller still: when a session ends because
//! PostgreSQL went away (a restart, a crash, a cut link), the relay waits (bounded) for
//! the delivery reports of what it had in flight and keeps the position delivered so far
//! in memory ([`Delivered`]); the next session skips up to the larger of that and the
//! record. A fast shutdown's tail, which the walsender streams after PostgreSQL stopped
//! taking writes (so no record can hold it), is then not sent again either. What is left
//! for a process that lives on: what was in flight and not confirmed within that wait.
//! The next session writes that position into the record before it streams, so the
//! memory outlives the process from then on. For a process killed (`kill -9`, OOM): the
//! last record window and what was in flight, and, killed while PostgreSQL was away,
//! what it delivered since its last record.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::pg::Lsn;

/// The longest time an acknowledged position waits to be recorded, and the shortest time
/// between two records: at most one single-row UPDATE per second, only while events are
/// being acknowledged.
pub const RECORD_GAP: Duration = Duration::from_secs(1);

/// What to do about the record now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStep {
    /// Write this position now.
    Write(Lsn),
    /// A record is owed, not before this instant.
    At(Instant),
    /// Nothing to record (no event acknowledged since the last record).
    Nothing,
}

/// Decides when to record: only positions that acknowledge events (the record's own
/// UPDATE writes WAL, which an idle relay acknowledges: recording that would write
/// again, forever), at most once per [`RECORD_GAP`].
#[derive(Debug)]
pub struct Recorder {
    recorded: Lsn,
    last_write: Option<Instant>,
    /// Ends of the transactions with events not yet acknowledged, in commit order.
    event_commits: VecDeque<Lsn>,
    /// Events were acknowledged past `recorded`.
    owed: bool,
}

impl Recorder {
    /// Starting from the slot's position (recorded or not: nothing to write for it).
    pub fn new(start: Lsn) -> Self {
        Recorder {
            recorded: start,
            last_write: None,
            event_commits: VecDeque::new(),
            owed: false,
        }
    }

    /// A transaction with events committed at `end_lsn`.
    pub fn event_commit(&mut self, end_lsn: Lsn) {
        self.event_commits.push_back(end_lsn);
    }

    /// Whether `acknowledged` covers events not recorded yet (whatever the time).
    pub fn owes(&mut self, acknowledged: Lsn) -> bool {
        while self
            .event_commits
            .front()
            .is_some_and(|&end| end <= acknowledged)
        {
            self.event_commits.pop_front();
            self.owed = true;
        }
        self.owed && acknowledged > self.recorded
    }

    /// The acknowledged position is `acknowledged` at `now`.
    pub fn step(&mut self, acknowledged: Lsn, now: Instant) -> RecordStep {
        if !self.owes(acknowledged) {
            return RecordStep::Nothing;
        }
        match self.last_write.map(|at| at + RECORD_GAP) {
            Some(next) if now < next => RecordStep::At(next),
            _ => RecordStep::Write(acknowledged),
        }
    }

    /// The write of `lsn` was queued at `now`.
    pub fn written(&mut self, lsn: Lsn, now: Instant) {
        self.recorded = self.recorded.max(lsn);
        self.last_write = Some(now);
        self.owed = false;
    }

    /// The last position written.
    pub fn recorded(&self) -> Lsn {
        self.recorded
    }
}

/// What one session of this process had delivered when it ended (every event of every
/// transaction before `through` confirmed by the sink), for the next session's resume:
/// the same promise as the record, kept in memory, for what the record could not hold
/// (PostgreSQL refuses the record's UPDATE from the moment a shutdown begins, while its
/// walsender still sends the rest of the WAL; a link cut ends the session between a
/// delivery and its record).
///
/// It is used only on the same cluster and timeline, and only up to the end of the WAL
/// the server has: a session decodes flushed WAL only, and a timeline is one line of WAL,
/// so below that end the server holds the very transactions that were delivered. A
/// promotion or a restore changes the timeline and a copied cluster the system
/// identifier; then only the record, which travels with the WAL, counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub system_id: String,
    pub timeline: u32,
    pub through: Lsn,
}

impl Delivered {
    /// The position a session on `system_id`/`timeline`, whose server's WAL ends at
    /// `wal_end`, may skip to on the strength of this memory (`None`: not here).
    pub fn usable(&self, system_id: &str, timeline: u32, wal_end: Lsn) -> Option<Lsn> {
        (self.system_id == system_id && self.timeline == timeline && self.through <= wal_end)
            .then_some(self.through)
    }
}

/// The resume from the record at start, counted for the log line that ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resume {
    /// The slot's position when streaming began.
    pub from: Lsn,
    /// The recorded position: transactions committing before it are skipped.
    pub through: Lsn,
    pub transactions: u64,
    pub events: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_session_delivered_counts_only_on_its_own_cluster_timeline_and_wal() {
        let delivered = Delivered {
            system_id: "7".into(),
            timeline: 1,
            through: Lsn(500),
        };
        assert_eq!(delivered.usable("7", 1, Lsn(500)), Some(Lsn(500)));
        assert_eq!(delivered.usable("7", 1, Lsn(900)), Some(Lsn(500)));
        // A promotion or a restore: another timeline.
        assert_eq!(delivered.usable("7", 2, Lsn(900)), None);
        // Another cluster.
        assert_eq!(delivered.usable("8", 1, Lsn(900)), None);
        // WAL shorter than what was delivered: not the WAL it was decoded from.
        assert_eq!(delivered.usable("7", 1, Lsn(499)), None);
    }

    #[test]
    fn records_only_positions_that_acknowledge_events() {
        let t0 = Instant::now();
        let mut r = Recorder::new(Lsn(100));
        // Keepalives move the acknowledged position: nothing to record.
        assert_eq!(r.step(Lsn(200), t0), RecordStep::Nothing);
        r.event_commit(Lsn(300));
        assert_eq!(
            r.step(Lsn(250), t0),
            RecordStep::Nothing,
            "not yet acknowledged"
        );
        assert_eq!(r.step(Lsn(300), t0), RecordStep::Write(Lsn(300)));
        r.written(Lsn(300), t0);
        // The record's own WAL, acknowledged later: still nothing.
        let later = t0 + RECORD_GAP * 5;
        assert_eq!(r.step(Lsn(400), later), RecordStep::Nothing);
        assert_eq!(r.recorded(), Lsn(300));
    }

    #[test]
    fn at_most_one_record_per_gap_and_the_owed_one_is_not_forgotten() {
        let t0 = Instant::now();
        let mut r = Recorder::new(Lsn(0));
        r.event_commit(Lsn(10));
        assert_eq!(r.step(Lsn(10), t0), RecordStep::Write(Lsn(10)));
        r.written(Lsn(10), t0);
        r.event_commit(Lsn(20));
        let soon = t0 + RECORD_GAP / 2;
        assert_eq!(r.step(Lsn(20), soon), RecordStep::At(t0 + RECORD_GAP));
        // Later, with the stream idle (keepalive positions only), the owed record is
        // written at the position acknowledged then.
        assert_eq!(r.step(Lsn(25), t0 + RECORD_GAP), RecordStep::Write(Lsn(25)));
    }

    #[test]
    fn a_steady_stream_is_recorded_although_something_is_always_in_flight() {
        let t0 = Instant::now();
        let mut r = Recorder::new(Lsn(0));
        let mut writes = 0;
        for i in 1..=100u64 {
            // Transaction i commits while i - 1 is being acknowledged.
            r.event_commit(Lsn(i * 10));
            let now = t0 + RECORD_GAP / 10 * u32::try_from(i).unwrap();
            if let RecordStep::Write(lsn) = r.step(Lsn((i - 1) * 10), now) {
                r.written(lsn, now);
                writes += 1;
            }
        }
        assert!((9..=11).contains(&writes), "{writes} writes in 10 s");
        assert!(r.recorded() >= Lsn(900));
    }
}
