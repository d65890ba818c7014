//! Waiting on conditions with deadlines. Tests never sleep a fixed time to synchronise:
//! they poll a condition until it holds or the deadline passes, and a timeout panics
//! with a message saying what was awaited.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How often conditions are re-checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Polls `cond` every [`POLL_INTERVAL`] until it returns true; panics with
/// "timed out after …: {what}" when `timeout` passes first. The condition is always
/// checked at least once, and once more at the deadline.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    wait_for(what, timeout, || cond().then_some(()))
}

/// Polls `probe` every [`POLL_INTERVAL`] until it returns `Some`, and returns the value;
/// panics with "timed out after …: {what}" when `timeout` passes first.
pub fn wait_for<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    match poll_until(timeout, &mut probe) {
        Some(value) => value,
        None => panic!("timed out after {timeout:?}: {what}"),
    }
}

/// Like [`wait_for`] but returns `None` on timeout instead of panicking, for callers
/// that want to add their own context (a server log, a process's stderr) to the panic.
pub fn poll_until<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}

/// Waits for `child` to exit, reaping it. Returns `None` if it is still running when
/// `timeout` passes.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    poll_until(timeout, || {
        child
            .try_wait()
            .unwrap_or_else(|err| panic!("waiting for child {}: {err}", child.id()))
    })
}

/// The last `n` lines of `text`, joined with newlines.
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
