//! Capped exponential backoff with jitter, for restarts after retryable errors. Pure
//! apart from the seed.

use std::time::Duration;

/// First retry delay.
pub const INITIAL_DELAY: Duration = Duration::from_millis(250);
/// Longest delay between retries: a relay should come back within seconds once the
/// fault is gone, and one relay retrying every few seconds costs the server nothing.
pub const MAX_DELAY: Duration = Duration::from_secs(5);

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

    pub fn next_delay(&mut self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(16)).unwrap_or(u32::MAX);
        let cap = INITIAL_DELAY.saturating_mul(factor).min(MAX_DELAY);
        self.attempt = self.attempt.saturating_add(1);
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
