//! librdkafka's errors and log lines, said once per cause at a bounded rate.
//!
//! While Kafka is unreachable librdkafka reports the same failure over and over: in
//! every client's error callback (the producer's and the admin client's), and again in
//! its own log (`FAIL` lines), several times a second. Here each cause (the error code,
//! or librdkafka's log facility) is logged at its first occurrence; repeats within
//! [`SUMMARY_EVERY`] are counted, and the first repeat after it is logged with the count
//! (`repeated = N` occurrences over `over_s` seconds), which starts the next period.
//! The state is process-wide, so it outlives the producer rebuilds that would otherwise
//! start every count again. librdkafka's own `FAIL` and `ERROR` lines say what the
//! error callback says; they go to debug.
//!
//! [`Summariser`] is the pure part.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;

use crate::sink::kafka_secrets::withhold_secret_detail;

/// At most one line per cause in this long (after its first one).
pub const SUMMARY_EVERY: Duration = Duration::from_secs(15);
/// Causes remembered at once; the least recently logged is forgotten beyond it.
const MAX_CAUSES: usize = 256;

/// What to do with one occurrence of a cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it: the first occurrence, or the first for a while.
    Log,
    /// Log it with a count: `repeated` occurrences (this one included) over `over`.
    Summary { repeated: u64, over: Duration },
    /// Count it, log nothing.
    Quiet,
}

#[derive(Debug, Clone, Copy)]
struct Cause {
    /// When the cause was last logged.
    logged_at: Instant,
    /// Occurrences since then, not logged.
    suppressed: u64,
}

/// Rate-limited logging by cause: pure (the caller passes the time).
#[derive(Debug)]
pub struct Summariser {
    every: Duration,
    max_causes: usize,
    causes: HashMap<String, Cause>,
}

impl Summariser {
    pub fn new(every: Duration, max_causes: usize) -> Self {
        Summariser {
            every,
            max_causes: max_causes.max(1),
            causes: HashMap::new(),
        }
    }

    /// One occurrence of `cause` at `now` (which must not go backwards).
    pub fn observe(&mut self, cause: &str, now: Instant) -> Verdict {
        if let Some(state) = self.causes.get_mut(cause) {
            let over = now.saturating_duration_since(state.logged_at);
            if over < self.every {
                state.suppressed = state.suppressed.saturating_add(1);
                return Verdict::Quiet;
            }
            let repeated = state.suppressed.saturating_add(1);
            *state = Cause {
                logged_at: now,
                suppressed: 0,
            };
            return if repeated == 1 {
                Verdict::Log
            } else {
                Verdict::Summary { repeated, over }
            };
        }
        if self.causes.len() >= self.max_causes {
            let oldest = self
                .causes
                .iter()
                .min_by_key(|(_, state)| state.logged_at)
                .map(|(cause, _)| cause.clone());
            if let Some(oldest) = oldest {
                self.causes.remove(&oldest);
            }
        }
        self.causes.insert(
            cause.to_owned(),
            Cause {
                logged_at: now,
                suppressed: 0,
            },
        );
        Verdict::Log
    }
}

/// The process-wide summariser of Kafka's errors and log lines.
fn summariser() -> &'static Mutex<Summariser> {
    static SUMMARISER: OnceLock<Mutex<Summariser>> = OnceLock::new();
    SUMMARISER.get_or_init(|| Mutex::new(Summariser::new(SUMMARY_EVERY, MAX_CAUSES)))
}

fn verdict(cause: &str) -> Verdict {
    summariser()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .observe(cause, Instant::now())
}

/// A client error (from any client's error callback), rate-limited by its code.
/// `reason` must come redacted.
pub fn client_error(error: &KafkaError, reason: &str) {
    let cause = format!("error {:?}", error.rdkafka_error_code());
    match verdict(&cause) {
        Verdict::Log => tracing::warn!(error = %error, reason, "kafka client error"),
        Verdict::Summary { repeated, over } => tracing::warn!(
            error = %error,
            reason,
            repeated,
            over_s = over.as_secs(),
            "kafka client error (repeated {repeated} times in the last {} s)",
            over.as_secs()
        ),
        Verdict::Quiet => tracing::debug!(error = %error, reason, "kafka client error"),
    }
}

/// One line of librdkafka's own log. `message` must come redacted.
pub fn librdkafka_line(level: RDKafkaLogLevel, facility: &str, message: &str) {
    use RDKafkaLogLevel as L;
    let serious = matches!(
        level,
        L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
    );
    // FAIL (a connection failed) and ERROR say what the error callback says.
    if !serious || matches!(facility, "FAIL" | "ERROR") {
        tracing::debug!(target: "librdkafka", facility, "{message}");
        return;
    }
    match verdict(&format!("log {facility}")) {
        Verdict::Log => tracing::warn!(target: "librdkafka", facility, "{message}"),
        Verdict::Summary { repeated, over } => tracing::warn!(
            target: "librdkafka",
            facility,
            repeated,
            over_s = over.as_secs(),
            "{message} (lines of this kind repeated {repeated} times in the last {} s)",
            over.as_secs()
        ),
        Verdict::Quiet => tracing::debug!(target: "librdkafka", facility, "{message}"),
    }
}

/// The admin client's context: its errors and log lines go through the same
/// summariser as the producer's. The admin client is only asked for topics; what it
/// reports about the brokers the producer reports too.
#[derive(Debug, Clone, Default)]
pub struct AdminContext;

impl ClientContext for AdminContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        librdkafka_line(level, fac, &withhold_secret_detail(log_message));
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client_error(&error, &withhold_secret_detail(reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_logged_once_then_summarised_at_most_every_period() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut summary = Summariser::new(Duration::from_secs(15), 8);
        assert_eq!(summary.observe("down", at(0)), Verdict::Log);
        // Seven a second for 20 s: quiet until 15 s have passed, then one summary.
        let mut logged = Vec::new();
        for i in 1..140 {
            let now = at(i * 143);
            match summary.observe("down", now) {
                Verdict::Quiet => {}
                other => logged.push((i, other)),
            }
        }
        assert_eq!(logged.len(), 1, "{logged:?}");
        let (i, verdict) = logged[0];
        assert_eq!(i, 105, "the first occurrence 15 s after the first line");
        assert_eq!(
            verdict,
            Verdict::Summary {
                repeated: 105,
                over: Duration::from_millis(105 * 143)
            }
        );
        // Another cause has its own count.
        assert_eq!(summary.observe("auth", at(20_000)), Verdict::Log);
        // A cause that comes back after a quiet period is a plain line again.
        assert_eq!(summary.observe("auth", at(60_000)), Verdict::Log);
    }

    #[test]
    fn the_causes_remembered_are_bounded() {
        let start = Instant::now();
        let mut summary = Summariser::new(Duration::from_secs(15), 2);
        for (i, cause) in ["a", "b", "c"].iter().enumerate() {
            let now = start + Duration::from_millis(i as u64);
            assert_eq!(summary.observe(cause, now), Verdict::Log);
        }
        assert_eq!(summary.causes.len(), 2);
        // "a" was forgotten: logged again as new; "c" is still counted.
        let now = start + Duration::from_millis(10);
        assert_eq!(summary.observe("a", now), Verdict::Log);
        assert_eq!(summary.observe("c", now), Verdict::Quiet);
    }
}
