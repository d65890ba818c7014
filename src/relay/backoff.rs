//! Capped exponential backoff with jitter, for restarts after retryable errors. Pure
//! apart from the seed.

use std::time::Duration;

/// First retry delay.
pub const INITIAL_DELAY: Duration = Duration::from_millis(250);
/// Longest delay between retries: a relay should come back within seconds once the
/// fault is gone, and one relay retrying every few seconds costs the server nothing.
pub const MAX_DELAY: Duration = Duration::from_secs(5);

/// A session that lasted this long starts the delays over: the fault that ended it was
/// not there for its first seconds, so it is not one that a growing wait spares the
/// server from. Short, because a relay still waiting out an old fault's delay when the
/// server is back again streams late and, until it has recorded what the last session
/// delivered, a `kill -9` in that window sends it all again (a CI chaos run: a relay
/// 3 s into a delay grown over a minute of faults, killed 1 s after PostgreSQL's fast
/// restart). A fault that recurs every few seconds still grows the delays.
pub const RESET_AFTER: Duration = Duration::from_secs(10);

/// Longest wait of a standby relay between attempts at a busy slot: each attempt is a
/// connection and a refused START_REPLICATION (a few milliseconds of the server's time),
/// five to ten a second per standby.
pub const SLOT_WAIT_MAX: Duration = Duration::from_millis(200);

/// Delay sequence: doubles from [`INITIAL_DELAY`] up to [`MAX_DELAY`], each delay drawn
/// uniformly from its upper half ("equal jitter") so restarting relays spread out.
#[derive(Debug, Clone)]
pub struct Backoff {
    attempt: u32,
    state: u64,
}

impl Backoff {
    pub fn new(seed: u64) -> Self {
        Backoff {
            attempt: 0,
            state: seed | 1,
        }
    }

    /// Seeded from the clock.
    pub fn from_clock() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Backoff::new(u64::from(nanos) ^ u64::from(std::process::id()) << 32)
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// A session (an attempt: connecting, streaming, until its error) ended after
    /// `lasted`: one of at least [`RESET_AFTER`] starts the delays over. Returns whether
    /// it did.
    pub fn session_ended(&mut self, lasted: Duration) -> bool {
        let reset = lasted >= RESET_AFTER;
        if reset {
            self.reset();
        }
        reset
    }

    /// The wait of a standby relay between attempts at a slot another process streams
    /// from: short and not growing, so that it takes over within about
    /// [`SLOT_WAIT_MAX`] of the slot's release (a `kill -9`ed relay's walsender ends at
    /// once, when its socket closes). Drawn from [`SLOT_WAIT_MAX`]'s upper half, and the
    /// growing sequence is left where it was.
    pub fn slot_wait_delay(&mut self) -> Duration {
        self.draw(SLOT_WAIT_MAX)
    }

    pub fn next_delay(&mut self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(16)).unwrap_or(u32::MAX);
        let cap = INITIAL_DELAY.saturating_mul(factor).min(MAX_DELAY);
        self.attempt = self.attempt.saturating_add(1);
        self.draw(cap)
    }

    /// A delay drawn uniformly from `[cap / 2, cap)`.
    fn draw(&mut self, cap: Duration) -> Duration {
        // xorshift64: good enough to spread retries, no dependency needed.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let half = cap / 2;
        let jitter_nanos = u64::try_from(half.as_nanos()).unwrap_or(u64::MAX);
        half + Duration::from_nanos(self.state % jitter_nanos.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standby_waits_briefly_and_leaves_the_growing_sequence_alone() {
        let mut backoff = Backoff::new(7);
        let first = backoff.next_delay();
        for _ in 0..100 {
            let wait = backoff.slot_wait_delay();
            assert!(
                wait >= SLOT_WAIT_MAX / 2 && wait < SLOT_WAIT_MAX,
                "{wait:?}"
            );
        }
        // The next growing delay is the second step's, not the hundred-and-second's.
        let second = backoff.next_delay();
        assert!(
            second >= INITIAL_DELAY && second < INITIAL_DELAY * 2,
            "{first:?} {second:?}"
        );
    }

    #[test]
    fn delays_grow_and_stay_capped_with_jitter() {
        let mut backoff = Backoff::new(42);
        let delays: Vec<Duration> = (0..12).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] >= INITIAL_DELAY / 2 && delays[0] <= INITIAL_DELAY);
        assert!(delays[3] >= INITIAL_DELAY * 4 && delays[3] <= INITIAL_DELAY * 8);
        for delay in &delays {
            assert!(*delay <= MAX_DELAY);
        }
        assert!(delays[11] >= MAX_DELAY / 2);
        backoff.reset();
        assert!(backoff.next_delay() <= INITIAL_DELAY);
    }

    #[test]
    fn a_session_of_ten_seconds_starts_the_delays_over_and_a_short_one_does_not() {
        let mut backoff = Backoff::new(9);
        for _ in 0..6 {
            backoff.next_delay();
        }
        assert!(!backoff.session_ended(Duration::from_secs(2)));
        let grown = backoff.next_delay();
        assert!(grown >= MAX_DELAY / 2, "{grown:?}");
        // Ten seconds of streaming between two faults: the next retry is the first one.
        assert!(backoff.session_ended(Duration::from_secs(10)));
        let first = backoff.next_delay();
        assert!(first <= INITIAL_DELAY, "{first:?}");
    }

    #[test]
    fn different_seeds_spread_out() {
        let a: Vec<_> = (0..5)
            .scan(Backoff::new(1), |b, _| Some(b.next_delay()))
            .collect();
        let b: Vec<_> = (0..5)
            .scan(Backoff::new(2), |b, _| Some(b.next_delay()))
            .collect();
        assert_ne!(a, b);
    }
}
