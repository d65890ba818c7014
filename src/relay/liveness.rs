//! Liveness of the replication connection and of the sink: pure, `now` passed in.
//!
//! Checked on every status tick:
//! - **PostgreSQL silent.** While reading, the walsender sends something (data or a
//!   keepalive) at least every `wal_sender_timeout / 2`; a status update asks for a
//!   reply once nothing has arrived for a status interval. Silence past the receive
//!   timeout means the link is dead (a cut or black-holed network): reconnect. While
//!   reading is paused (backpressure) nothing is read, so silence proves nothing and
//!   the clock restarts.
//! - **Outbox watch silent.** Its check has been unanswered past the same timeout.
//! - **Sink stalled.** The oldest undelivered event has waited past `stall_release`
//!   (a dead broker, or one stuck partition while others deliver): let the replication
//!   connection go, so PostgreSQL (whose shutdown waits for acknowledgements) is not
//!   held; the events are sent again after reconnecting.

use std::time::{Duration, Instant};

use crate::relay::{RelayError, Transient};

/// Why the link, the watch or the sink is taken for dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stall {
    /// Nothing from PostgreSQL for `secs` although it was asked to reply.
    Silent { secs: u64 },
    /// The outbox watch's check unanswered for `secs`.
    WatchSilent { secs: u64 },
    /// The oldest undelivered event has waited `secs`.
    SinkStalled { secs: u64, in_flight: u64 },
}

impl From<Stall> for RelayError {
    fn from(stall: Stall) -> Self {
        match stall {
            Stall::Silent { secs } => Transient::Silent { secs }.into(),
            Stall::WatchSilent { secs } => Transient::WatchSilent { secs }.into(),
            Stall::SinkStalled { secs, in_flight } => {
                Transient::SinkStalled { secs, in_flight }.into()
            }
        }
    }
}

/// Status updates never less often than this fraction of `wal_sender_timeout`.
const STATUS_FRACTION_OF_TIMEOUT: u32 = 3;
/// Floor of the status interval, so a tiny `wal_sender_timeout` cannot make us spin.
const MIN_STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// Silence allowed when the server has no `wal_sender_timeout` to go by.
const DEFAULT_RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// The status update interval: the configured bound, kept under a third of the
/// server's `wal_sender_timeout` (0 = disabled on the server).
pub fn status_interval(configured: Duration, wal_sender_timeout: Option<Duration>) -> Duration {
    let interval = match wal_sender_timeout {
        Some(timeout) if !timeout.is_zero() => configured.min(timeout / STATUS_FRACTION_OF_TIMEOUT),
        _ => configured,
    };
    interval.max(MIN_STATUS_INTERVAL)
}

/// How long PostgreSQL may stay silent, although asked to reply, before the link is
/// taken for dead: the configured value, else the server's `wal_sender_timeout` (the
/// server gives up on us after as long), never less than three status intervals.
pub fn receive_timeout(
    configured: Option<Duration>,
    wal_sender_timeout: Option<Duration>,
    interval: Duration,
) -> Duration {
    let derived = match wal_sender_timeout {
        Some(timeout) if !timeout.is_zero() => timeout,
        _ => DEFAULT_RECEIVE_TIMEOUT,
    };
    configured.unwrap_or(derived).max(interval * 3)
}

/// The bounds, fixed for a pipeline attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessLimits {
    /// The status update interval: silence this long makes the next update ask for a
    /// reply.
    pub status_interval: Duration,
    pub receive_timeout: Duration,
    pub stall_release: Duration,
}

/// What a status tick sees besides the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickInput {
    /// Whether the pipeline is reading the stream (not paused by backpressure).
    pub reading: bool,
    /// How long the outbox watch's pending check has waited (zero when none).
    pub watch_waiting: Duration,
    /// Age of the oldest undelivered event, if any.
    pub oldest_undelivered: Option<Duration>,
    pub in_flight: u64,
}

/// The liveness state of one pipeline attempt.
#[derive(Debug, Clone, Copy)]
pub struct Liveness {
    limits: LivenessLimits,
    last_received: Instant,
}

impl Liveness {
    pub fn new(limits: LivenessLimits, now: Instant) -> Self {
        Liveness {
            limits,
            last_received: now,
        }
    }

    /// Something arrived from PostgreSQL.
    pub fn received(&mut self, now: Instant) {
        self.last_received = now;
    }

    /// A status tick: `Ok(true)` when the status update should ask PostgreSQL for a
    /// reply, an error when the link, the watch or the sink is taken for dead.
    pub fn tick(&mut self, now: Instant, input: TickInput) -> Result<bool, Stall> {
        if !input.reading {
            self.last_received = now;
        }
        let silent = now.saturating_duration_since(self.last_received);
        if silent > self.limits.receive_timeout {
            return Err(Stall::Silent {
                secs: silent.as_secs(),
            });
        }
        if input.watch_waiting > self.limits.receive_timeout {
            return Err(Stall::WatchSilent {
                secs: input.watch_waiting.as_secs(),
            });
        }
        if let Some(oldest) = input.oldest_undelivered {
            if oldest > self.limits.stall_release {
                return Err(Stall::SinkStalled {
                    secs: oldest.as_secs(),
                    in_flight: input.in_flight,
                });
            }
        }
        Ok(input.reading && silent >= self.limits.status_interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: LivenessLimits = LivenessLimits {
        status_interval: Duration::from_secs(10),
        receive_timeout: Duration::from_secs(60),
        stall_release: Duration::from_secs(30),
    };

    fn reading() -> TickInput {
        TickInput {
            reading: true,
            watch_waiting: Duration::ZERO,
            oldest_undelivered: None,
            in_flight: 0,
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn silence_while_reading_asks_for_a_reply_then_gives_up() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new(LIMITS, t0);
        assert!(!liveness.tick(t0 + secs(5), reading()).unwrap());
        assert!(
            liveness.tick(t0 + secs(10), reading()).unwrap(),
            "silent for a status interval: ask"
        );
        assert!(liveness.tick(t0 + secs(60), reading()).unwrap());
        assert!(matches!(
            liveness.tick(t0 + secs(61), reading()),
            Err(Stall::Silent { secs: 61 })
        ));
    }

    #[test]
    fn anything_received_restarts_the_clock() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new(LIMITS, t0);
        liveness.received(t0 + secs(50));
        assert!(!liveness.tick(t0 + secs(55), reading()).unwrap());
        assert!(liveness.tick(t0 + secs(100), reading()).unwrap());
    }

    #[test]
    fn silence_while_paused_proves_nothing() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new(LIMITS, t0);
        let paused = TickInput {
            reading: false,
            ..reading()
        };
        assert!(
            !liveness.tick(t0 + secs(100), paused).unwrap(),
            "no reply asked while paused"
        );
        // Reading again: the silence counts from the last paused tick.
        assert!(!liveness.tick(t0 + secs(105), reading()).unwrap());
        assert!(liveness.tick(t0 + secs(160), reading()).is_ok());
        assert!(liveness.tick(t0 + secs(161), reading()).is_err());
    }

    #[test]
    fn a_silent_watch_fails_past_the_receive_timeout() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new(LIMITS, t0);
        let waiting = |w| TickInput {
            watch_waiting: secs(w),
            ..reading()
        };
        assert!(liveness.tick(t0, waiting(60)).is_ok());
        assert!(matches!(
            liveness.tick(t0, waiting(61)),
            Err(Stall::WatchSilent { secs: 61 })
        ));
    }

    #[test]
    fn an_undelivered_event_older_than_stall_release_releases_the_connection() {
        let t0 = Instant::now();
        let mut liveness = Liveness::new(LIMITS, t0);
        let oldest = |age| TickInput {
            reading: false,
            oldest_undelivered: age,
            in_flight: 3,
            ..reading()
        };
        assert!(liveness.tick(t0, oldest(None)).is_ok());
        assert!(liveness.tick(t0, oldest(Some(secs(30)))).is_ok());
        assert!(matches!(
            liveness.tick(t0, oldest(Some(secs(31)))),
            Err(Stall::SinkStalled {
                secs: 31,
                in_flight: 3
            })
        ));
    }

    #[test]
    fn receive_timeout_follows_the_server_and_covers_three_intervals() {
        let second = Duration::from_secs(1);
        assert_eq!(
            receive_timeout(None, Some(60 * second), 10 * second),
            60 * second
        );
        assert_eq!(
            receive_timeout(None, Some(Duration::ZERO), 10 * second),
            DEFAULT_RECEIVE_TIMEOUT
        );
        assert_eq!(
            receive_timeout(Some(5 * second), Some(60 * second), second),
            5 * second
        );
        assert_eq!(receive_timeout(Some(second), None, second), 3 * second);
    }

    #[test]
    fn status_interval_stays_under_a_third_of_the_timeout() {
        let ten = Duration::from_secs(10);
        assert_eq!(status_interval(ten, Some(Duration::from_secs(60))), ten);
        assert_eq!(
            status_interval(ten, Some(Duration::from_secs(6))),
            Duration::from_secs(2)
        );
        assert_eq!(status_interval(ten, Some(Duration::ZERO)), ten);
        assert_eq!(status_interval(ten, None), ten);
        assert_eq!(
            status_interval(ten, Some(Duration::from_millis(30))),
            MIN_STATUS_INTERVAL
        );
    }
}
