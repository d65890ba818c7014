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
//!
//! Each event handed to the sink gets a [`Ticket`] carrying its send time (`now` is
//! passed in, so the tracker stays pure). The age of the oldest undelivered event is
//! what stall detection watches: one stuck partition shows there even while every other
//! partition delivers.
//!
//! The ticket also carries the event's size in bytes (the record's key, value and
//! headers as handed to the sink), so the tracker knows the bytes in flight as well as
//! the events: [`AckTracker::has_room`] is the pipeline's backpressure test on both.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::event::{Ticket, TxnSeq};
use crate::pg::Lsn;

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

/// How much may be in flight before reading pauses (`[relay] max_in_flight` and
/// `max_in_flight_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightLimits {
    pub events: u64,
    pub bytes: u64,
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
    /// Send time and size of the events from the oldest undelivered one on, by ticket
    /// serial (= send order): `sent[i]` is the event of serial `first_serial + i`,
    /// `None` once delivered. Delivered events leave the front as soon as every earlier
    /// one did, so the front is always the oldest undelivered event. A ring instead of a
    /// map: two pushes and pops per event, no node allocations (the map was the largest
    /// cost of the tracker per event). Its length is the serial span from the oldest
    /// undelivered event to the newest, bounded by [`AckTracker::has_room`].
    sent: VecDeque<Option<(Instant, u32)>>,
    first_serial: u64,
    /// Events in `sent` not yet delivered.
    undelivered: u64,
    /// The sum of the sizes in `sent`.
    bytes: u64,
}

/// How many times the event bound the serial span from the oldest undelivered event to
/// the newest may reach before reading pauses: events behind one that waits (its
/// partition's leader is away) keep flowing, within a bounded ring.
const SPAN_PER_EVENT_BOUND: u64 = 2;

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

    /// One event of transaction `seq`, of `bytes` bytes, was handed to the sink at `now`
    /// (which must not go backwards between calls). The ticket settles it in
    /// [`AckTracker::delivered`].
    pub fn event_sent(
        &mut self,
        seq: TxnSeq,
        now: Instant,
        bytes: u64,
    ) -> Result<Ticket, AckError> {
        self.state(seq)?.undelivered += 1;
        let serial = self.first_serial + self.sent.len() as u64;
        // A row is at most 1 GB in PostgreSQL: the size fits; saturated it still
        // counts the same on the way in and out.
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.sent.push_back(Some((now, bytes)));
        self.undelivered += 1;
        self.bytes = self.bytes.saturating_add(u64::from(bytes));
        Ok(Ticket { seq, serial })
    }

    /// Transaction `seq` committed; its `end_lsn` is the position after its commit record.
    pub fn commit(&mut self, seq: TxnSeq, end_lsn: Lsn) -> Result<(), AckError> {
        self.state(seq)?.end_lsn = Some(end_lsn);
        self.received = self.received.max(end_lsn);
        Ok(())
    }

    /// The event of `ticket` has a successful delivery report (or is settled by its
    /// dead-letter record).
    pub fn delivered(&mut self, ticket: Ticket) -> Result<(), AckError> {
        let seq = ticket.seq;
        self.state(seq)?;
        let slot = ticket
            .serial
            .checked_sub(self.first_serial)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.sent.get_mut(i))
            .and_then(Option::take);
        let Some((_, bytes)) = slot else {
            return Err(AckError::TooManyReports { seq });
        };
        self.bytes = self.bytes.saturating_sub(u64::from(bytes));
        self.undelivered -= 1;
        while matches!(self.sent.front(), Some(None)) {
            self.sent.pop_front();
            self.first_serial += 1;
        }
        let state = self.state(seq)?;
        state.undelivered = state
            .undelivered
            .checked_sub(1)
            .ok_or(AckError::TooManyReports { seq })?;
        Ok(())
    }

    /// How long the oldest undelivered event has waited, `None` when none waits.
    pub fn oldest_undelivered_age(&self, now: Instant) -> Option<Duration> {
        self.sent
            .front()
            .and_then(|slot| slot.as_ref())
            .map(|(sent, _)| now.saturating_duration_since(*sent))
    }

    /// A keepalive said everything before `wal_end` was sent.
    pub fn keepalive(&mut self, wal_end: Lsn) {
        self.received = self.received.max(wal_end);
    }

    /// Events handed to the sink and not yet delivered.
    pub fn in_flight(&self) -> u64 {
        self.undelivered
    }

    /// Bytes of the events handed to the sink and not yet delivered.
    pub fn in_flight_bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether another event may be read: fewer events than the event bound in flight,
    /// and fewer bytes than the byte bound. The next event's size is not known before it
    /// is read, so what is in flight stays below the bounds plus one event; an event
    /// larger than the byte bound is admitted when little enough is in flight (always
    /// when nothing is), and then nothing more until it is delivered.
    ///
    /// The span from the oldest undelivered event to the newest is bounded too (at
    /// [`SPAN_PER_EVENT_BOUND`] times the event bound), so that one event that waits
    /// while later ones are delivered cannot grow the tracker without bound.
    pub fn has_room(&self, limits: InFlightLimits) -> bool {
        self.in_flight() < limits.events
            && self.bytes < limits.bytes
            && (self.sent.len() as u64) < limits.events.saturating_mul(SPAN_PER_EVENT_BOUND)
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

    /// The position before which every transaction received is delivered, whether or not
    /// the watch vouched for it yet (for a resume within this process, which
    /// acknowledges nothing by itself: [`crate::relay::record::Delivered`]).
    pub fn delivered_through(&mut self) -> Lsn {
        self.advance()
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

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn nothing_past_the_vouched_position_is_reported() {
        let mut t = AckTracker::new(Lsn(100), 0);
        t.cap_at(Lsn(100));
        t.begin(0).unwrap();
        let ticket = t.event_sent(0, t0(), 1).unwrap();
        t.commit(0, Lsn(200)).unwrap();
        t.delivered(ticket).unwrap();
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
        let now = t0();
        let mut t = AckTracker::new(Lsn(100), 0);
        t.begin(0).unwrap();
        let a = t.event_sent(0, now, 1).unwrap();
        let b = t.event_sent(0, now, 1).unwrap();
        t.commit(0, Lsn(200)).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(100), "nothing delivered yet");
        t.delivered(a).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(100), "one of two delivered");
        t.delivered(b).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(200), "the commit's end_lsn");
        assert_eq!(t.in_flight(), 0);
    }

    #[test]
    fn a_later_delivered_transaction_waits_for_an_earlier_one() {
        let now = t0();
        let mut t = AckTracker::new(Lsn(0), 5);
        let mut tickets = Vec::new();
        for (seq, end) in [(5, 10), (6, 20)] {
            t.begin(seq).unwrap();
            tickets.push(t.event_sent(seq, now, 1).unwrap());
            t.commit(seq, Lsn(end)).unwrap();
        }
        t.delivered(tickets[1]).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(0));
        t.delivered(tickets[0]).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(20));
    }

    #[test]
    fn an_uncommitted_transaction_is_never_acknowledged() {
        let mut t = AckTracker::new(Lsn(0), 0);
        t.begin(0).unwrap();
        let ticket = t.event_sent(0, t0(), 1).unwrap();
        t.delivered(ticket).unwrap();
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
        let now = t0();
        let mut t = AckTracker::new(Lsn(0), 0);
        assert_eq!(
            t.begin(1),
            Err(AckError::OutOfOrderBegin {
                seq: 1,
                expected: 0
            })
        );
        assert_eq!(
            t.event_sent(0, now, 1),
            Err(AckError::UnknownTxn { seq: 0 })
        );
        t.begin(0).unwrap();
        let ticket = t.event_sent(0, now, 1).unwrap();
        t.delivered(ticket).unwrap();
        assert_eq!(
            t.delivered(ticket),
            Err(AckError::TooManyReports { seq: 0 }),
            "a ticket settles once"
        );
        t.commit(0, Lsn(1)).unwrap();
        t.flush_lsn();
        assert_eq!(t.delivered(ticket), Err(AckError::UnknownTxn { seq: 0 }));
    }

    #[test]
    fn the_oldest_undelivered_event_ages_while_others_deliver() {
        let start = t0();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut t = AckTracker::new(Lsn(0), 0);
        assert_eq!(t.oldest_undelivered_age(at(0)), None, "nothing in flight");
        t.begin(0).unwrap();
        // One event on a stuck partition, sent at 0 ms.
        let stuck = t.event_sent(0, at(0), 1).unwrap();
        t.commit(0, Lsn(10)).unwrap();
        // Later transactions keep being sent and delivered (other partitions).
        for seq in 1..=50u64 {
            t.begin(seq).unwrap();
            let ticket = t.event_sent(seq, at(seq * 100), 1).unwrap();
            t.commit(seq, Lsn(10 + seq * 10)).unwrap();
            t.delivered(ticket).unwrap();
        }
        assert_eq!(
            t.oldest_undelivered_age(at(5_000)),
            Some(Duration::from_secs(5)),
            "deliveries elsewhere do not hide the stuck event"
        );
        assert_eq!(t.flush_lsn(), Lsn(0), "and nothing past it is acknowledged");
        t.delivered(stuck).unwrap();
        assert_eq!(t.oldest_undelivered_age(at(5_000)), None);
        assert_eq!(t.flush_lsn(), Lsn(510));
    }

    #[test]
    fn the_age_follows_the_oldest_of_several_undelivered_events() {
        let start = t0();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut t = AckTracker::new(Lsn(0), 0);
        t.begin(0).unwrap();
        let first = t.event_sent(0, at(0), 1).unwrap();
        let second = t.event_sent(0, at(1_000), 1).unwrap();
        let third = t.event_sent(0, at(2_000), 1).unwrap();
        assert_eq!(
            t.oldest_undelivered_age(at(3_000)),
            Some(Duration::from_secs(3))
        );
        t.delivered(first).unwrap();
        assert_eq!(
            t.oldest_undelivered_age(at(3_000)),
            Some(Duration::from_secs(2))
        );
        t.delivered(third).unwrap();
        assert_eq!(
            t.oldest_undelivered_age(at(3_000)),
            Some(Duration::from_secs(2)),
            "a younger delivery does not reset the older one"
        );
        t.delivered(second).unwrap();
        assert_eq!(t.oldest_undelivered_age(at(3_000)), None);
        assert_eq!(
            t.oldest_undelivered_age(at(0)),
            None,
            "and a clock before a send time is no panic"
        );
    }

    const LIMITS: InFlightLimits = InFlightLimits {
        events: 100,
        bytes: 1_000,
    };

    #[test]
    fn reading_pauses_at_the_byte_bound_and_resumes_on_delivery() {
        let now = t0();
        let mut t = AckTracker::new(Lsn(0), 0);
        t.begin(0).unwrap();
        assert!(t.has_room(LIMITS), "nothing in flight");
        let a = t.event_sent(0, now, 600).unwrap();
        assert!(t.has_room(LIMITS), "600 of 1000 bytes");
        let b = t.event_sent(0, now, 300).unwrap();
        assert!(t.has_room(LIMITS), "900 of 1000 bytes");
        let c = t.event_sent(0, now, 100).unwrap();
        assert_eq!(t.in_flight_bytes(), 1_000);
        assert!(!t.has_room(LIMITS), "at the bound: reading pauses");
        assert_eq!(t.in_flight(), 3, "far below the event bound");
        t.delivered(b).unwrap();
        assert_eq!(t.in_flight_bytes(), 700);
        assert!(t.has_room(LIMITS), "a delivery frees room");
        t.delivered(a).unwrap();
        t.delivered(c).unwrap();
        assert_eq!(t.in_flight_bytes(), 0);
    }

    #[test]
    fn an_event_larger_than_the_byte_bound_goes_alone() {
        let now = t0();
        let mut t = AckTracker::new(Lsn(0), 0);
        t.begin(0).unwrap();
        assert!(t.has_room(LIMITS), "nothing in flight: admitted");
        let big = t.event_sent(0, now, 5_000).unwrap();
        assert!(
            !t.has_room(LIMITS),
            "nothing else is read while the oversize event is in flight"
        );
        t.delivered(big).unwrap();
        assert!(t.has_room(LIMITS), "delivered: reading goes on");
        let small = t.event_sent(0, now, 10).unwrap();
        assert!(t.has_room(LIMITS));
        t.delivered(small).unwrap();
        t.commit(0, Lsn(10)).unwrap();
        assert_eq!(t.flush_lsn(), Lsn(10));
    }

    #[test]
    fn the_event_bound_still_pauses_small_events() {
        let now = t0();
        let limits = InFlightLimits {
            events: 2,
            bytes: 1_000,
        };
        let mut t = AckTracker::new(Lsn(0), 0);
        t.begin(0).unwrap();
        let a = t.event_sent(0, now, 1).unwrap();
        assert!(t.has_room(limits));
        t.event_sent(0, now, 1).unwrap();
        assert!(!t.has_room(limits), "two events: the event bound");
        t.delivered(a).unwrap();
        assert!(t.has_room(limits));
    }

    #[test]
    fn one_waiting_event_bounds_the_span_behind_it() {
        let now = t0();
        let limits = InFlightLimits {
            events: 3,
            bytes: 1_000,
        };
        let mut t = AckTracker::new(Lsn(0), 0);
        t.begin(0).unwrap();
        let waiting = t.event_sent(0, now, 1).unwrap();
        // Later events are delivered while the first one waits: the in-flight count
        // stays low, the span behind the waiting event grows up to twice the bound.
        for _ in 0..5 {
            assert!(t.has_room(limits));
            let later = t.event_sent(0, now, 1).unwrap();
            t.delivered(later).unwrap();
        }
        assert_eq!(t.in_flight(), 1);
        assert!(
            !t.has_room(limits),
            "six events since the waiting one: the span bound (2 x 3)"
        );
        t.delivered(waiting).unwrap();
        assert!(t.has_room(limits), "delivered: the span is empty again");
        assert_eq!(t.oldest_undelivered_age(now), None);
        assert_eq!(
            t.delivered(waiting),
            Err(AckError::TooManyReports { seq: 0 })
        );
    }

    proptest::proptest! {
        /// Random interleavings of deliveries: the flush LSN never passes a transaction
        /// with an undelivered event, never goes back, and ends at the last end_lsn.
        #[test]
        fn never_acks_past_undelivered(
            sizes in proptest::collection::vec(0u64..4, 1..20),
            order in proptest::collection::vec(proptest::num::usize::ANY, 0..200),
        ) {
            let now = Instant::now();
            let mut t = AckTracker::new(Lsn(0), 0);
            let mut pending: Vec<Ticket> = Vec::new();
            for (seq, size) in sizes.iter().enumerate() {
                let seq = seq as u64;
                t.begin(seq).unwrap();
                for _ in 0..*size {
                    pending.push(t.event_sent(seq, now, 1).unwrap());
                }
                t.commit(seq, Lsn((seq + 1) * 100)).unwrap();
            }
            let mut last = Lsn(0);
            let mut remaining: Vec<u64> = sizes.clone();
            let mut picks = order.into_iter();
            while !pending.is_empty() {
                let i = picks.next().unwrap_or(0) % pending.len();
                let ticket = pending.swap_remove(i);
                t.delivered(ticket).unwrap();
                remaining[ticket.seq() as usize] -= 1;
                let flush = t.flush_lsn();
                proptest::prop_assert!(flush >= last);
                last = flush;
                if let Some(first_open) = remaining.iter().position(|r| *r > 0) {
                    proptest::prop_assert!(flush.0 <= first_open as u64 * 100);
                }
            }
            proptest::prop_assert_eq!(t.flush_lsn(), Lsn(sizes.len() as u64 * 100));
            proptest::prop_assert_eq!(t.oldest_undelivered_age(now), None);
        }
    }
}
