//! Taking the slot over from a relay that went silent: its host vanished (powered off,
//! partitioned away) or froze (a stopped VM, SIGSTOP) without closing its connection,
//! so PostgreSQL keeps its walsender, and with it the slot, until `wal_sender_timeout`
//! (60 s by default).
//!
//! The liveness signal is the streaming relay's **heartbeat**: it sends a standby
//! status update at least every second ([`crate::pg::config::HEARTBEAT_MS`], or every
//! status interval when that is shorter) from its main loop, while reading, while
//! paused by backpressure, while waiting for a sink session and while draining at
//! shutdown. A status update goes over the replication connection only: it writes
//! nothing to the database (one moving nothing changes nothing; one moving the flush
//! position changes the slot in memory, saved at the next checkpoint as always). The
//! walsender records each update's send time as `reply_time` in `pg_stat_replication`.
//!
//! A standby relay looks at the slot's walsender on each attempt at the busy slot (every
//! 100–200 ms). When the same walsender's `reply_time` has not changed for the
//! configured silence (`[postgres] takeover_silence_ms`; four heartbeats, 4 s, by
//! default) while it waits on its client, the standby ends it with
//! `pg_terminate_backend`; its next attempt takes the slot from its acknowledged
//! position. The old relay, when it runs again, finds its connection ended and the slot
//! taken, and waits in turn. What it had read but not yet written when it froze it may
//! still write once (a duplicate, never a loss: it acknowledged none of it).
//!
//! ```text
//! attempt ─▶ slot active for pid P ─▶ sample P (reply_time, reply age, wait event)
//!                                          │ SilenceWatch::observe (pure)
//!            Wait ◀── changed / too young / busy ──┤
//!                                          ▼ Terminate
//!            pg_terminate_backend(P) only if P still holds the slot, its reply_time is
//!            still the one watched and it still waits on its client (one statement)
//! ```
//!
//! Why it does not end a healthy walsender:
//! - **A healthy relay cannot be silent for four heartbeats** while the walsender
//!   reads: the heartbeat comes from the loop's own timer, not from what PostgreSQL
//!   sends, so neither a slow link nor a paused sink nor a large transaction delays
//!   it; four missed in a row is a process that does not run, or a link that carries
//!   nothing for seconds (ending that walsender is then right: the relay reconnects).
//! - **Silence is measured on the standby's own clock**, as the time the same
//!   `reply_time` value has been seen unchanged, so clock skew between the hosts cannot
//!   make a fresh reply look old. The server's age of the reply (`clock_timestamp() -
//!   reply_time`, `backend_start` before the first reply) must be past the silence too:
//!   a relay whose clock runs ahead is never taken over early, only late.
//! - **The walsender must be waiting on its client** (a `WalSender…` wait event). While
//!   it replays a large transaction (above all one of tables the publication leaves
//!   out, of which it sends nothing) it reads replies only every
//!   `wal_sender_timeout / 2`, so a healthy relay's `reply_time` stands still for that
//!   long; it is then busy (no wait event, or I/O), not waiting, and is left alone.
//!   Every one of its waits also watches the socket for replies and it reads them as
//!   soon as it wakes, so a walsender seen waiting with the same old `reply_time` in
//!   the look and again in the ending statement got nothing from its relay in between.
//!   And it must be seen waiting at two looks in a row (100–200 ms apart) with the
//!   same `reply_time`, then again by the ending statement: a walsender that has just
//!   finished a long replay and not yet read the updates queued meanwhile is caught
//!   waiting for a few microseconds at most, never twice.
//! - **The last look and the termination are one statement**: a walsender that replied,
//!   or was replaced, in between is not touched.
//! - A relay that cannot see the walsender's details (no `pg_read_all_stats`) or may not
//!   end it (another role's walsender without `pg_signal_backend`, or a superuser's)
//!   waits as before and says once what to grant.
//! - An older relay (before the heartbeat) streaming during a rolling upgrade reports
//!   only every status interval: a new standby may take the slot from it after 4 s of
//!   silence. Nothing is lost; it waits as the standby from then on.

use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::pg::config::{DEFAULT_TAKEOVER_SILENCE_HEARTBEATS, HEARTBEAT_MS};
use crate::pg::conn::{PgConnection, PgError, QueryResult};
use crate::pg::sql::quote_literal;

/// The silence after which a standby ends the streaming relay's walsender: the
/// configured value (`0` turns takeover off: wait for `wal_sender_timeout`), else
/// [`DEFAULT_TAKEOVER_SILENCE_HEARTBEATS`] heartbeats of a relay with `status_interval`.
pub fn silence_limit(configured_ms: Option<u64>, status_interval: Duration) -> Option<Duration> {
    match configured_ms {
        Some(0) => None,
        Some(ms) => Some(Duration::from_millis(ms)),
        None => Some(heartbeat(status_interval) * DEFAULT_TAKEOVER_SILENCE_HEARTBEATS),
    }
}

/// SQLSTATE `insufficient_privilege`.
const INSUFFICIENT_PRIVILEGE: &str = "42501";

/// How often a streaming relay with `status_interval` sends a status update at least.
pub fn heartbeat(status_interval: Duration) -> Duration {
    status_interval.min(Duration::from_millis(HEARTBEAT_MS))
}

/// One look at the walsender holding the slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub pid: i32,
    /// `reply_time` as text (`None` before its first reply, or when not visible).
    pub reply_time: Option<String>,
    /// The server's age of the last reply (of the walsender's start before the first).
    pub reply_age: Option<Duration>,
    /// Its wait event is one of a walsender waiting for its client or for WAL.
    pub waiting_on_client: bool,
    /// The role may see other roles' walsender details (`pg_read_all_stats`).
    pub details_visible: bool,
}

/// What to do about the walsender holding the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It is alive, or not silent for long enough yet.
    Wait,
    /// Its details are hidden from this role: nothing can be judged.
    Hidden,
    /// Silent past the limit: end it. `silent_for` is how long this standby saw its
    /// `reply_time` unchanged.
    Terminate { silent_for: Duration },
}

/// Whether a walsender seen silent for `silent_for` (on the standby's clock), whose
/// last reply the server dates `reply_age` ago, is to be ended at `limit`.
pub fn should_terminate(
    silent_for: Duration,
    reply_age: Option<Duration>,
    waiting_on_client: bool,
    limit: Duration,
) -> bool {
    waiting_on_client && silent_for >= limit && reply_age.is_some_and(|age| age >= limit)
}

/// The walsender being watched and since when its `reply_time` is unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Watched {
    pid: i32,
    reply_time: Option<String>,
    since: Instant,
    /// It was waiting on its client at the last look.
    waiting: bool,
}

/// What a standby remembers between its attempts at the busy slot. Pure: the clock is
/// passed in.
#[derive(Debug, Default)]
pub struct SilenceWatch {
    watched: Option<Watched>,
    /// Said once per process: what to grant.
    told_hidden: bool,
    told_not_allowed: bool,
}

impl SilenceWatch {
    /// Judge `sample`, seen at `now`.
    pub fn observe(&mut self, sample: &Sample, now: Instant, limit: Duration) -> Verdict {
        if !sample.details_visible {
            self.watched = None;
            return Verdict::Hidden;
        }
        let (since, waited_before) = match &self.watched {
            Some(watched)
                if watched.pid == sample.pid && watched.reply_time == sample.reply_time =>
            {
                (watched.since, watched.waiting)
            }
            _ => (now, false),
        };
        self.watched = Some(Watched {
            pid: sample.pid,
            reply_time: sample.reply_time.clone(),
            since,
            waiting: sample.waiting_on_client,
        });
        let silent_for = now.saturating_duration_since(since);
        // Waiting at two looks in a row with the same reply: not a walsender that has
        // just finished a long replay and is about to read what its relay sent.
        if should_terminate(
            silent_for,
            sample.reply_age,
            waited_before && sample.waiting_on_client,
            limit,
        ) {
            Verdict::Terminate { silent_for }
        } else {
            Verdict::Wait
        }
    }

    /// The standby streams, or stopped waiting: start over next time.
    pub fn forget(&mut self) {
        self.watched = None;
    }
}

/// The look at the slot's walsender (`None`: the slot is free now).
pub fn sample_sql(slot: &str) -> String {
    format!(
        "SELECT s.active_pid AS pid, r.reply_time::text AS reply_time, \
                (1000 * extract(epoch FROM pg_catalog.clock_timestamp() \
                    - coalesce(r.reply_time, r.backend_start)))::bigint AS reply_age_ms, \
                coalesce(a.wait_event LIKE 'WalSender%', false) AS waiting, \
                pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE') AS details_visible \
           FROM pg_catalog.pg_replication_slots s \
           LEFT JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid \
           LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = s.active_pid \
          WHERE s.slot_name = {} AND s.active_pid IS NOT NULL",
        quote_literal(slot)
    )
}

/// Ends walsender `pid` only if it still holds `slot`, still shows the `reply_time`
/// that was watched, and still waits on its client. One row, `t`, when it was ended.
pub fn terminate_sql(slot: &str, pid: i32, reply_time: Option<&str>) -> String {
    let same_reply = match reply_time {
        Some(time) => format!("r.reply_time::text = {}", quote_literal(time)),
        None => "r.reply_time IS NULL".to_owned(),
    };
    format!(
        "SELECT pg_catalog.pg_terminate_backend(r.pid) AS terminated \
           FROM pg_catalog.pg_replication_slots s \
           JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid \
           JOIN pg_catalog.pg_stat_activity a ON a.pid = r.pid \
          WHERE s.slot_name = {} AND r.pid = {pid} AND {same_reply} \
            AND a.wait_event LIKE 'WalSender%'",
        quote_literal(slot)
    )
}

fn parse_sample(result: &QueryResult) -> Option<Sample> {
    let pid = result.get(0, "pid")?.parse().ok()?;
    Some(Sample {
        pid,
        reply_time: result.get(0, "reply_time").map(str::to_owned),
        reply_age: result
            .get(0, "reply_age_ms")
            .and_then(|ms| ms.parse::<i64>().ok())
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis),
        waiting_on_client: result.get(0, "waiting") == Some("t"),
        details_visible: result.get(0, "details_visible") == Some("t"),
    })
}

/// A standby's look at the busy `slot` on its connection: ends the walsender when it is
/// silent past `limit`. Returns whether it ended one (the slot is then free, or about to
/// be). Errors of the look itself are the caller's to log: the standby waits on.
pub async fn look(
    conn: &mut PgConnection,
    slot: &str,
    limit: Duration,
    watch: &mut SilenceWatch,
    metrics: &Metrics,
) -> Result<bool, PgError> {
    let result = conn.simple_query(&sample_sql(slot)).await?;
    let Some(sample) = parse_sample(&result) else {
        watch.forget();
        return Ok(false);
    };
    let silent_for = match watch.observe(&sample, Instant::now(), limit) {
        Verdict::Wait => return Ok(false),
        Verdict::Hidden => {
            if !watch.told_hidden {
                watch.told_hidden = true;
                tracing::warn!(
                    %slot,
                    pid = sample.pid,
                    "this role cannot see whether the relay streaming from the slot is alive (pg_stat_replication hides other roles' reply_time), so a standby cannot take over from a silent one before wal_sender_timeout: GRANT pg_read_all_stats TO the relay's role (and pg_signal_backend when the instances use different roles)"
                );
            }
            return Ok(false);
        }
        Verdict::Terminate { silent_for } => silent_for,
    };
    let reply_age_ms = sample
        .reply_age
        .map_or(0, |age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX));
    let ended = conn
        .simple_query(&terminate_sql(
            slot,
            sample.pid,
            sample.reply_time.as_deref(),
        ))
        .await;
    match ended {
        Ok(result) if result.get(0, "terminated") == Some("t") => {
            tracing::warn!(
                %slot,
                pid = sample.pid,
                silence_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
                unchanged_for_ms = u64::try_from(silent_for.as_millis()).unwrap_or(u64::MAX),
                reply_age_ms,
                last_reply = sample.reply_time.as_deref().unwrap_or("none"),
                "{}",
                super::log::TAKING_OVER
            );
            Metrics::add(&metrics.takeovers, 1);
            watch.forget();
            Ok(true)
        }
        // It replied, moved on or went away since the look: watch it afresh.
        Ok(_) => {
            watch.forget();
            Ok(false)
        }
        Err(PgError::Db(db)) if db.code == INSUFFICIENT_PRIVILEGE => {
            if !watch.told_not_allowed {
                watch.told_not_allowed = true;
                tracing::warn!(
                    %slot,
                    pid = sample.pid,
                    reply_age_ms,
                    error = %db.message,
                    "the relay streaming from the slot is silent, and this role may not end its walsender: GRANT pg_signal_backend TO the relay's role (a superuser's walsender can be ended only by a superuser); waiting for PostgreSQL to end it after wal_sender_timeout"
                );
            }
            Ok(false)
        }
        Err(other) => Err(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_millis(600);

    fn sample(pid: i32, reply_time: Option<&str>, age_ms: u64) -> Sample {
        Sample {
            pid,
            reply_time: reply_time.map(str::to_owned),
            reply_age: Some(Duration::from_millis(age_ms)),
            waiting_on_client: true,
            details_visible: true,
        }
    }

    #[test]
    fn the_silence_limit_defaults_to_four_heartbeats_and_zero_turns_it_off() {
        let interval = Duration::from_secs(10);
        assert_eq!(heartbeat(interval), Duration::from_secs(1));
        assert_eq!(silence_limit(None, interval), Some(Duration::from_secs(4)));
        let short = Duration::from_millis(200);
        assert_eq!(heartbeat(short), short);
        assert_eq!(silence_limit(None, short), Some(Duration::from_millis(800)));
        assert_eq!(
            silence_limit(Some(600), interval),
            Some(Duration::from_millis(600))
        );
        assert_eq!(silence_limit(Some(0), interval), None);
    }

    #[test]
    fn only_a_waiting_walsender_silent_by_both_clocks_is_ended() {
        let ms = Duration::from_millis;
        assert!(should_terminate(ms(600), Some(ms(700)), true, LIMIT));
        // Too short on the standby's clock (it has only just begun watching).
        assert!(!should_terminate(ms(599), Some(ms(5000)), true, LIMIT));
        // Fresh by the server's clock (a relay whose clock runs ahead: never early).
        assert!(!should_terminate(ms(5000), Some(ms(100)), true, LIMIT));
        assert!(!should_terminate(ms(5000), None, true, LIMIT));
        // Busy decoding a large transaction: it reads replies only now and then.
        assert!(!should_terminate(ms(5000), Some(ms(5000)), false, LIMIT));
    }

    #[test]
    fn silence_is_the_time_the_same_reply_is_seen_unchanged() {
        let mut watch = SilenceWatch::default();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        // The server dates the reply long ago (skewed clocks, or a standby that just
        // started): the standby still watches for the whole limit itself.
        let old = sample(7, Some("12:00:00.1"), 60_000);
        assert_eq!(watch.observe(&old, at(0), LIMIT), Verdict::Wait);
        assert_eq!(watch.observe(&old, at(599), LIMIT), Verdict::Wait);
        assert_eq!(
            watch.observe(&old, at(600), LIMIT),
            Verdict::Terminate {
                silent_for: Duration::from_millis(600)
            }
        );
        // A new reply restarts the clock.
        let replied = sample(7, Some("12:00:00.3"), 60_000);
        assert_eq!(watch.observe(&replied, at(700), LIMIT), Verdict::Wait);
        assert_eq!(watch.observe(&replied, at(1200), LIMIT), Verdict::Wait);
        // So does another walsender, even with the same reply time.
        let other = sample(8, Some("12:00:00.3"), 60_000);
        assert_eq!(watch.observe(&other, at(1300), LIMIT), Verdict::Wait);
        assert_eq!(watch.observe(&other, at(1800), LIMIT), Verdict::Wait);
        assert!(matches!(
            watch.observe(&other, at(1900), LIMIT),
            Verdict::Terminate { .. }
        ));
    }

    #[test]
    fn a_walsender_is_ended_only_when_seen_waiting_at_two_looks_in_a_row() {
        let mut watch = SilenceWatch::default();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let busy = Sample {
            waiting_on_client: false,
            ..sample(5, Some("12:00:00.1"), 60_000)
        };
        let waiting = sample(5, Some("12:00:00.1"), 60_000);
        // Replaying a large transaction past the limit: left alone.
        assert_eq!(watch.observe(&busy, at(0), LIMIT), Verdict::Wait);
        assert_eq!(watch.observe(&busy, at(5000), LIMIT), Verdict::Wait);
        // Done and waiting, not yet having read its relay's updates: not at this look.
        assert_eq!(watch.observe(&waiting, at(5100), LIMIT), Verdict::Wait);
        // Still waiting with the same reply at the next look: silent.
        assert_eq!(
            watch.observe(&waiting, at(5200), LIMIT),
            Verdict::Terminate {
                silent_for: Duration::from_millis(5200)
            }
        );
    }

    #[test]
    fn a_walsender_before_its_first_reply_is_dated_by_its_start() {
        let mut watch = SilenceWatch::default();
        let start = Instant::now();
        // Just started: no reply yet, the server dates it by backend_start.
        let young = sample(9, None, 100);
        assert_eq!(watch.observe(&young, start, LIMIT), Verdict::Wait);
        let later = sample(9, None, 300);
        assert_eq!(
            watch.observe(&later, start + Duration::from_millis(700), LIMIT),
            Verdict::Wait
        );
        // Never replied at all, started long ago.
        let silent = sample(9, None, 900);
        assert!(matches!(
            watch.observe(&silent, start + Duration::from_millis(900), LIMIT),
            Verdict::Terminate { .. }
        ));
    }

    #[test]
    fn hidden_details_are_never_judged() {
        let mut watch = SilenceWatch::default();
        let start = Instant::now();
        let hidden = Sample {
            details_visible: false,
            reply_time: None,
            reply_age: None,
            waiting_on_client: false,
            pid: 3,
        };
        for ms in [0, 1000, 60_000] {
            assert_eq!(
                watch.observe(&hidden, start + Duration::from_millis(ms), LIMIT),
                Verdict::Hidden
            );
        }
    }

    #[test]
    fn the_statements_quote_the_slot_and_recheck_the_reply() {
        let look = sample_sql("s'lot");
        assert!(look.contains("s.slot_name = 's''lot'"), "{look}");
        let end = terminate_sql("s'lot", 42, Some("2026-12-02 05:00:00.1+00"));
        for needle in [
            "s.slot_name = 's''lot'",
            "r.pid = 42",
            "r.reply_time::text = '2026-12-02 05:00:00.1+00'",
            "a.wait_event LIKE 'WalSender%'",
        ] {
            assert!(end.contains(needle), "{needle}: {end}");
        }
        assert!(terminate_sql("s", 42, None).contains("r.reply_time IS NULL"));
    }
}
