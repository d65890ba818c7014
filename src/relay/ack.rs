//! The acknowledgement tracker: pure, in-order, and the place where the product's
//! promise lives.
//!
//! ```text
//!  txn seq:     7          8          9 (open)
//!            [commit ✓] [commit ✓] [no commit yet]
//!            [0 undel.] [2 undel.] [1 undel.]
//!                 ▲
//!   flush LSN = end_lsn of 7: the highest transaction whose events, and all earlier
//!   ones, are delivered. Nothing past 8's start may be acknowledged.
//! ```
//!
//! Correctness argument: transactions enter in commit order (protocol v1 sends a
//! transaction only after it committed, in commit order). A transaction leaves the front
//! of the queue only when it is committed and has no undelivered events, and only then
//! does the confirmed position move, to its `end_lsn` (invariants 1 and 2). The reported
//! value is a running maximum (invariant 3). When the queue is empty nothing is in flight,
//! so the last received position, including a keepalive's `walEnd`, is safe to report:
//! everything before it was sent to us and needed no delivery (invariant 4).
//!
//! One more bound: a position is reported only once the outbox watch
//! ([`crate::relay::watch`]) has vouched for it (the outbox was still published as it
//! was up to there). Rows the publication no longer carries never reach the stream, so
//! nothing else could tell that positions past them hide lost events.

use std::collections::VecDeque;

use crate::pg::Lsn;
use crate::sink::TxnSeq;

#[derive(Debug, Clone, Copy)]
struct TxnState {
    /// `end_lsn` of the Commit, once seen.
    end_lsn: Option<Lsn>,
    undelivered: u64,
}

/// A call that breaks the tracker's protocol: a bug in the caller, reported not ignored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckError {
    #[error("transaction {seq} began out of order (expected {expected})")]
    OutOfOrderBegin { seq: TxnSeq, expected: TxnSeq },
    #[error("transaction {seq} is not open in the ack tracker")]
    UnknownTxn { seq: TxnSeq },
    #[error("transaction {seq} got more delivery reports than events sent")]
    TooManyReports { seq: TxnSeq },
}

/// Tracks transactions from Begin to full delivery.
#[derive(Debug, Default)]
pub struct AckTracker {
    queue: VecDeque<TxnState>,
    /// Sequence number of `queue[0]` (or of the next transaction when empty).
    front_seq: TxnSeq,
    /// Highest `end_lsn` whose whole prefix is delivered.
    confirmed: Lsn,
    /// Last progress position received (Commit `end_lsn` or keepalive `walEnd`).
    received: Lsn,
    /// The value last returned by [`AckTracker::flush_lsn`].
    reported: Lsn,
    /// The highest position the outbox watch vouched for (no bound until
    /// [`AckTracker::cap_at`] sets one).
    vouched: Lsn,
    in_flight: u64,
}

impl AckTracker {
    /// Start from the slot's acknowledged position.
    pub fn new(start: Lsn, first_seq: TxnSeq) -> Self {
        AckTracker {
            front_seq: first_seq,
            confirmed: start,
            received: start,
            reported: start,
            vouched: Lsn(u64::MAX),
            ..AckTracker::default()
        }
    }

    /// Report nothing past `lsn` until [`AckTracker::vouch`] raises the bound.
    pub fn cap_at(&mut self, lsn: Lsn) {
        self.vouched = lsn.max(self.reported);
    }

    /// The outbox watch vouched for every position up to `lsn`.
    pub fn vouch(&mut self, lsn: Lsn) {
        self.vouched = self.vouched.max(lsn);
    }

    /// The highest position the watch vouched for so far.
    pub fn vouched(&self) -> Lsn {
        self.vouched
    }

    /// Whether something safe to acknowledge waits for the watch to vouch for it.
    pub fn wants_vouching(&mut self) -> bool {
        self.advance() > self.vouched
    }

    /// A transaction began. Sequence numbers are consecutive.
    pub fn begin(&mut self, seq: TxnSeq) -> Result<(), AckError> {
        let expected = self.front_seq + self.queue.len() as u64;
        if seq != expected {
            return Err(AckError::OutOfOrderBegin { seq, expected });
        }
        self.queue.push_back(TxnState {
            end_lsn: None,
            undelivered: 0,
        });
        Ok(())
    }

    fn state(&mut self, seq: TxnSeq) -> Result<&mut TxnState, AckError> {
        seq.checked_sub(self.front_seq)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.queue.get_mut(i))
            .ok_or(AckError::UnknownTxn { seq })
    }

    /// One event of transaction `seq` was handed to the sink.
    pub fn event_sent(&mut self, seq: TxnSeq) -> Result<(), AckError> {
        self.state(seq)?.undelivered += 1;
        self.in_flight += 1;
        Ok(())
    }

    /// Transaction `seq` committed; its `end_lsn` is the position after its commit record.
    pub fn commit(&mut self, seq: TxnSeq, end_lsn: Lsn) -> Result<(), AckError> {
        self.state(seq)?.end_lsn = Some(end_lsn);
        self.received = self.received.max(end_lsn);
        Ok(())
    }

    /// One event of transaction `seq` has a successful delivery report.
    pub fn delivered(&mut self, seq: TxnSeq) -> Result<(), AckError> {
        let state = self.state(seq)?;
        state.undelivered = state
            .undelivered
            .checked_sub(1)
            .ok_or(AckError::TooManyReports { seq })?;
        self.in_flight -= 1;
        Ok(())
    }

    /// A keepalive said everything before `wal_end` was sent.
    pub fn keepalive(&mut self, wal_end: Lsn) {
        self.received = self.received.max(wal_end);
    }

    /// Events handed to the sink and not yet delivered.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Transactions begun and not yet fully delivered.
    pub fn open_transactions(&self) -> usize {
        self.queue.len()
    }

    /// Last progress position received (the `write` field of a status update).
    pub fn received(&self) -> Lsn {
        self.received
    }

    /// The position safe to acknowledge now (delivered and vouched for). Never
    /// decreases.
    pub fn flush_lsn(&mut self) -> Lsn {
        let candidate = self.advance().min(self.vouched);
        self.reported = self.reported.max(candidate);
        self.reported
    }

    /// Drops fully delivered transactions off the front and returns the position they
    /// (and, when nothing is open, the stream) allow, before the watch's bound.
    fn advance(&mut self) -> Lsn {
        while let Some(front) = self.queue.front() {
            match front.end_lsn {
                Some(end_lsn) if front.undelivered == 0 => {
                    self.confirmed = self.confirmed.max(end_lsn);
                    self.queue.pop_front();
                    self.front_seq += 1;
                }
                _ => break,
            }
        }
        if self.queue.is_empty() {
            self.confirmed.max(self.received)
        } else {
            self.confirmed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_past_the_vouched_position_is_reported() {
        let mut t = AckTracker::new(Lsn(100), 0);
        t.cap_at(Lsn(100));
        t.begin(0).unwrap();
        t.event_sent(0).unwrap();
        t.commit(0, Lsn(200)).unwrap();
        t.delivered(0).unwrap();
        t.keepalive(Lsn(300));
        assert!(t.wants_vouching());
        assert_eq!(t.flush_lsn(), Lsn(100), "delivered, but not vouched for");
        t.vouch(Lsn(250));
        assert_eq!(
            t.flush_lsn(),
            Lsn(250),
            "idle position up to the vouched one"
        );
        assert!(t.wants_vouching());
        t.vouch(Lsn(400));
        assert_eq!(t.flush_lsn(), Lsn(300));
        assert!(!t.wants_vouching());
        t.vouch(Lsn(50));
        assert_eq!(t.flush_lsn(), Lsn(300), "a lower vouch changes nothing");
    }

    #[test]
    fn acks_end_lsn_only_after_every_event_is_delivered() {
        let mut t = AckTracker::new(Lsn(100), 0);
        t.begin(0).unwrap();
        t.event_sent(0).unwrap();
        t.event_sent(0).unwrap();
        t.commit(0, Lsn(200)).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(100), "nothing delivered yet");
        t.delivered(0).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(100), "one of two delivered");
        t.delivered(0).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(200), "the commit's end_lsn");
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_later_delivered_transaction_waits_for_an_earlier_one() {
        let mut t = AckTracker::new(Lsn(0), 5);
        for (seq, end) in [(5, 10), (6, 20)] {
            t.begin(seq).unwrap();
            t.event_sent(seq).unwrap();
            t.commit(seq, Lsn(end)).unwrap();
        }
        t.delivered(6).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(0));
        t.delivered(5).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(20));
    }

    #[test]
    fn an_uncommitted_transaction_is_never_acknowledged() {
        let mut t = AckTracker::new(Lsn(0), 0);
        t.begin(0).unwrap();
        t.event_sent(0).unwrap();
        t.delivered(0).unwrap();
        t.keepalive(Lsn(500));
        assert_eq!(
            t.flush_lsn(),
            Lsn(0),
            "open transaction blocks keepalive progress"
        );
        t.commit(0, Lsn(300)).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(500), "then idle: the keepalive position");
    }

    #[test]
    fn idle_reports_keepalive_position_and_empty_transactions_pass() {
        let mut t = AckTracker::new(Lsn(50), 0);
        t.keepalive(Lsn(80));
        assert_eq!(t.flush_lsn(), Lsn(80));
        t.begin(0).unwrap();
        t.commit(0, Lsn(90)).unwrap();
        assert_eq!(
            t.flush_lsn(),
            Lsn(90),
            "an empty transaction (PG <= 14) is acked at once"
        );
        assert_eq!(t.received(), Lsn(90));
    }

    #[test]
    fn flush_lsn_is_monotonic_even_if_a_keepalive_goes_back() {
        let mut t = AckTracker::new(Lsn(0), 0);
        t.keepalive(Lsn(1000));
        assert_eq!(t.flush_lsn(), Lsn(1000));
        t.keepalive(Lsn(10));
        t.begin(0).unwrap();
        t.commit(0, Lsn(500)).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(1000));
    }

    #[test]
    fn protocol_misuse_is_an_error() {
        let mut t = AckTracker::new(Lsn(0), 0);
        assert_eq!(
            t.begin(1),
            Err(AckError::OutOfOrderBegin {
                seq: 1,
                expected: 0
            })
        );
        assert_eq!(t.event_sent(0), Err(AckError::UnknownTxn { seq: 0 }));
        t.begin(0).unwrap();
        assert_eq!(t.delivered(0), Err(AckError::TooManyReports { seq: 0 }));
        t.commit(0, Lsn(1)).unwrap();
        t.flush_lsn();
        assert_eq!(t.delivered(0), Err(AckError::UnknownTxn { seq: 0 }));
    }

    proptest::proptest! {
        /// Random interleavings of deliveries: the flush LSN never passes a transaction
        /// with an undelivered event, never goes back, and ends at the last end_lsn.
        #[test]
        fn never_acks_past_undelivered(
            sizes in proptest::collection::vec(0u64..4, 1..20),
            order in proptest::collection::vec(proptest::num::usize::ANY, 0..200),
        ) {
            let mut t = AckTracker::new(Lsn(0), 0);
            let mut pending: Vec<u64> = Vec::new();
            for (seq, size) in sizes.iter().enumerate() {
                let seq = seq as u64;
                t.begin(seq).unwrap();
                for _ in 0..*size {
                    t.event_sent(seq).unwrap();
                    pending.push(seq);
                }
                t.commit(seq, Lsn((seq + 1) * 100)).unwrap();
            }
            let mut last = Lsn(0);
            let mut remaining: Vec<u64> = sizes.clone();
            let mut picks = order.into_iter();
            while !pending.is_empty() {
                let i = picks.next().unwrap_or(0) % pending.len();
                let seq = pending.swap_remove(i);
                t.delivered(seq).unwrap();
                remaining[seq as usize] -= 1;
                let flush = t.flush_lsn();
                proptest::prop_assert!(flush >= last);
                last = flush;
                if let Some(first_open) = remaining.iter().position(|r| *r > 0) {
                    proptest::prop_assert!(flush.0 <= first_open as u64 * 100);
                }
            }
            proptest::prop_assert_eq!(t.flush_lsn(), Lsn(sizes.len() as u64 * 100));
        }
    }
}
