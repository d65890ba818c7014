//! Age gauges that stay true while things fail: the time since something started
//! waiting is stored, and the age is computed when it is read (a scrape, `/readyz`),
//! so it grows while the loop is stalled, between pipeline attempts and during a
//! producer rebuild, instead of freezing at its last update.
//!
//! ```text
//! attempt 1: event read at t0 ─ undelivered ─ Kafka gone ─ attempt ends (rebuild)
//!                 since = t0, read_up_to = where attempt 1 had read
//! attempt 2: starts from the slot's position, re-reads the event ─ delivered
//!                 since = t0 (carried) until the acknowledged position passes
//!                 read_up_to; then since = its own oldest (or none)
//! scrape:    age = now - since
//! ```
//!
//! A new attempt starts with an empty ack tracker: on its own view nothing waits until
//! it has read the stream again, which is why an age set from each attempt's tracker
//! read 0 with an event in flight. The stored value is *carried* instead: whatever the
//! previous attempt had read and not delivered is still undelivered until the new
//! attempt's acknowledged position passes the point where the previous one stood. The
//! carried age may overstate by what that attempt read after its oldest event (it
//! never understates), which errs on the side of the alert. Positions are plain `u64`
//! LSNs here, so this module needs nothing else of the crate.

use std::sync::atomic::{AtomicU64, Ordering};

/// One age gauge: since when (unix ms) the oldest of something waits, and how far the
/// attempt that last set it had read.
#[derive(Debug, Default)]
pub struct CarriedAge {
    /// Unix ms; 0 = nothing waits.
    since_ms: AtomicU64,
    /// The received position of the attempt that last stored `since_ms`.
    read_up_to: AtomicU64,
}

impl CarriedAge {
    /// The age at `now_unix_ms`, in ms (0 when nothing waits).
    pub fn age_ms_at(&self, now_unix_ms: u64) -> u64 {
        self.since_ms()
            .map_or(0, |since| now_unix_ms.saturating_sub(since))
    }

    /// Since when (unix ms) the oldest waits, if something does.
    pub fn since_ms(&self) -> Option<u64> {
        match self.since_ms.load(Ordering::Relaxed) {
            0 => None,
            since => Some(since),
        }
    }

    /// What a new attempt carries over: the position up to which the previous
    /// attempts had read, when something of theirs still waits.
    pub fn carried(&self) -> Option<u64> {
        self.since_ms()
            .map(|_| self.read_up_to.load(Ordering::Relaxed))
    }

    fn store(&self, since_ms: Option<u64>, read_up_to: u64) {
        self.read_up_to.store(read_up_to, Ordering::Relaxed);
        // 0 means "none"; a wait that began at the epoch is 1 ms later.
        self.since_ms
            .store(since_ms.map_or(0, |since| since.max(1)), Ordering::Relaxed);
    }
}

/// One pipeline attempt's writer of a [`CarriedAge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgeWriter {
    /// Previous attempts had read up to here and something of theirs still waits.
    carried_until: Option<u64>,
}

impl AgeWriter {
    /// The writer of a new attempt: it carries what the gauge holds.
    pub fn new(gauge: &CarriedAge) -> Self {
        AgeWriter {
            carried_until: gauge.carried(),
        }
    }

    /// Store the gauge from this attempt's own view: `own_since_ms` is when its oldest
    /// waiting item began to wait (`None`: none waits), `acknowledged` the position
    /// acknowledged to PostgreSQL, `received` the last position read.
    pub fn update(
        &mut self,
        gauge: &CarriedAge,
        own_since_ms: Option<u64>,
        acknowledged: u64,
        received: u64,
    ) {
        let (since, read_up_to) = next(
            gauge.since_ms(),
            &mut self.carried_until,
            own_since_ms,
            acknowledged,
            received,
        );
        gauge.store(since, read_up_to);
    }
}

/// The transition, pure: the new `since` and `read_up_to`, ending the carry once the
/// acknowledged position has passed where the earlier attempts had read.
fn next(
    stored: Option<u64>,
    carried_until: &mut Option<u64>,
    own: Option<u64>,
    acknowledged: u64,
    received: u64,
) -> (Option<u64>, u64) {
    if carried_until.is_some_and(|until| acknowledged >= until) {
        *carried_until = None;
    }
    match *carried_until {
        Some(until) => {
            let since = match (stored, own) {
                (Some(stored), Some(own)) => Some(stored.min(own)),
                (stored, own) => stored.or(own),
            };
            (since, until.max(received))
        }
        None => (own, received),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_age_is_computed_when_read_and_grows_without_updates() {
        let gauge = CarriedAge::default();
        assert_eq!(gauge.age_ms_at(50_000), 0, "nothing waits");
        let mut writer = AgeWriter::new(&gauge);
        writer.update(&gauge, Some(10_000), 100, 200);
        assert_eq!(gauge.age_ms_at(10_500), 500);
        // No update for 21 s (a stalled loop, Kafka unreachable): still true.
        assert_eq!(gauge.age_ms_at(31_000), 21_000);
        // Delivered, nothing else waits.
        writer.update(&gauge, None, 300, 300);
        assert_eq!(gauge.age_ms_at(40_000), 0);
        assert_eq!(gauge.carried(), None);
        // A clock that went backwards reads 0, not a wrapped number.
        writer.update(&gauge, Some(50_000), 300, 400);
        assert_eq!(gauge.age_ms_at(49_000), 0);
    }

    #[test]
    fn a_new_attempt_carries_the_wait_until_it_acknowledges_past_the_old_one() {
        let gauge = CarriedAge::default();
        // Attempt 1 read up to 500; its event from t=1 s is undelivered when it ends.
        let mut first = AgeWriter::new(&gauge);
        first.update(&gauge, Some(1_000), 100, 500);
        // Attempt 2 starts from the slot's position (100) with nothing in flight yet.
        let mut second = AgeWriter::new(&gauge);
        assert_eq!(second.carried_until, Some(500));
        second.update(&gauge, None, 100, 100);
        assert_eq!(gauge.age_ms_at(9_000), 8_000, "not 0 during the rebuild");
        // It re-reads the event (at t=8 s by its own clock): the wait began at 1 s.
        second.update(&gauge, Some(8_000), 100, 300);
        assert_eq!(gauge.age_ms_at(9_000), 8_000);
        // Attempt 2 ends too before delivering: attempt 3 carries the furthest read.
        let third = AgeWriter::new(&gauge);
        assert_eq!(third.carried_until, Some(500));
        // Back in attempt 2's place: delivered and acknowledged up to 400, not yet
        // past 500: something read before may still wait.
        second.update(&gauge, Some(8_500), 400, 600);
        assert_eq!(gauge.since_ms(), Some(1_000));
        // Acknowledged past 500: its own view takes over.
        second.update(&gauge, Some(8_500), 500, 600);
        assert_eq!(gauge.since_ms(), Some(8_500));
        second.update(&gauge, None, 600, 600);
        assert_eq!(gauge.since_ms(), None);
        assert_eq!(AgeWriter::new(&gauge).carried_until, None);
    }

    #[test]
    fn without_a_carry_the_attempt_own_view_is_the_gauge() {
        let mut carried = None;
        assert_eq!(next(Some(5), &mut carried, None, 0, 10), (None, 10));
        assert_eq!(next(None, &mut carried, Some(7), 0, 10), (Some(7), 10));
        let mut carried = Some(50);
        assert_eq!(next(None, &mut carried, Some(7), 0, 10), (Some(7), 50));
        assert_eq!(next(Some(3), &mut carried, Some(7), 0, 60), (Some(3), 60));
        assert_eq!(next(Some(3), &mut carried, None, 50, 60), (None, 60));
        assert_eq!(carried, None);
    }
}
