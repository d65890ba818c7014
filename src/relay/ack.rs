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
    /// `SPAN_PER_EVENT_BOUND` times the event bound), so that one event that waits
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
mod tests;
