//! The run's size and seed, from the environment: `CHAOS_LARGE=1` for the larger run,
//! `CHAOS_EVENTS`, `CHAOS_FAULTS` and `CHAOS_WINDOW_SECS` for single overrides,
//! `CHAOS_SEED` to replay a run.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One run's size.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    pub label: &'static str,
    /// Committed events to reach (the run may overshoot by a transaction per writer).
    pub events: usize,
    pub faults: usize,
    /// Window over which faults are spread and writes are paced.
    pub window: Duration,
    /// Deadline for the relay to acknowledge everything after the last fault.
    pub catch_up: Duration,
    /// Deadline for the verifier to read everything back.
    pub consume: Duration,
}

pub const BOUNDED: Size = Size {
    label: "bounded",
    events: 50_000,
    faults: 24,
    window: Duration::from_secs(240),
    catch_up: Duration::from_secs(180),
    consume: Duration::from_secs(240),
};

pub const LARGE: Size = Size {
    label: "large",
    events: 200_000,
    faults: 100,
    window: Duration::from_secs(600),
    catch_up: Duration::from_secs(600),
    consume: Duration::from_secs(600),
};

/// `CHAOS_SEED` if set, else one from the clock and the process id (printed, to replay).
pub fn chaos_seed() -> u64 {
    match std::env::var("CHAOS_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|err| panic!("CHAOS_SEED={text:?} is not a u64: {err}")),
        Err(_) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock after 1970");
            now.as_secs() ^ u64::from(now.subsec_nanos()) << 20 ^ u64::from(std::process::id())
        }
    }
}

/// `CHAOS_LARGE=1` picks [`LARGE`], else [`BOUNDED`]; `CHAOS_EVENTS`, `CHAOS_FAULTS`
/// and `CHAOS_WINDOW_SECS` override single parameters (for quick local runs).
pub fn run_size() -> Size {
    let mut size = if std::env::var("CHAOS_LARGE").is_ok_and(|v| v == "1") {
        LARGE
    } else {
        BOUNDED
    };
    let number = |name: &str| {
        std::env::var(name).ok().map(|text| {
            text.trim()
                .parse::<u64>()
                .unwrap_or_else(|err| panic!("{name}={text:?} is not a number: {err}"))
        })
    };
    if let Some(events) = number("CHAOS_EVENTS") {
        size.events = usize::try_from(events).expect("fits");
        size.label = "custom";
    }
    if let Some(faults) = number("CHAOS_FAULTS") {
        size.faults = usize::try_from(faults).expect("fits");
        size.label = "custom";
    }
    if let Some(secs) = number("CHAOS_WINDOW_SECS") {
        size.window = Duration::from_secs(secs);
        size.label = "custom";
    }
    size
}
