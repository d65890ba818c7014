//! When to send a status update: soon after the acknowledged position moves, at most
//! every [`PROMPT_ACK_GAP`], besides the keepalive timer.
//!
//! ```text
//!  delivery report ──▶ flush LSN moved? ──no──▶ nothing (the timer still runs)
//!                           │ yes
//!                           ▼
//!          last update ≥ PROMPT_ACK_GAP ago? ──yes──▶ send now
//!                           │ no
//!                           ▼
//!          send at last update + PROMPT_ACK_GAP (one deferred update, not one per report)
//! ```
//!
//! Why: the slot moves only when we report, so a position reported late is WAL held
//! longer and, after a crash, events sent again. PostgreSQL's own subscriber reports on
//! every change; a bound keeps a busy stream from sending one update per delivery.

use std::time::{Duration, Instant};

use crate::pg::Lsn;

/// The shortest time between two status updates sent because the acknowledged position
/// moved: a crash replays at most about this much delivered work (plus what was in
/// flight), and a busy stream sends at most ten such updates a second.
pub const PROMPT_ACK_GAP: Duration = Duration::from_millis(100);

/// What the loop should do about the acknowledged position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feedback {
    /// Nothing new to report.
    Idle,
    /// Send a status update now.
    SendNow,
    /// Send one at this instant (the gap since the last update is not over).
    SendAt(Instant),
}

/// Decide from the position safe to acknowledge (`flush`), the one last reported and when
/// that update went out.
pub fn feedback(flush: Lsn, last_reported: Lsn, last_sent_at: Instant, now: Instant) -> Feedback {
    if flush <= last_reported {
        return Feedback::Idle;
    }
    let due = last_sent_at + PROMPT_ACK_GAP;
    if now >= due {
        Feedback::SendNow
    } else {
        Feedback::SendAt(due)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_to_send_when_the_position_did_not_move() {
        let t0 = Instant::now();
        assert_eq!(
            feedback(Lsn(10), Lsn(10), t0, t0 + PROMPT_ACK_GAP * 5),
            Feedback::Idle
        );
        assert_eq!(feedback(Lsn(9), Lsn(10), t0, t0), Feedback::Idle);
    }

    #[test]
    fn a_moved_position_goes_out_at_once_after_the_gap() {
        let t0 = Instant::now();
        assert_eq!(
            feedback(Lsn(11), Lsn(10), t0, t0 + PROMPT_ACK_GAP),
            Feedback::SendNow
        );
        assert_eq!(
            feedback(Lsn(11), Lsn(10), t0, t0 + Duration::from_secs(10)),
            Feedback::SendNow
        );
    }

    #[test]
    fn within_the_gap_it_is_deferred_to_the_end_of_the_gap() {
        let t0 = Instant::now();
        assert_eq!(
            feedback(Lsn(11), Lsn(10), t0, t0 + Duration::from_millis(30)),
            Feedback::SendAt(t0 + PROMPT_ACK_GAP)
        );
    }
}
