//! (i) A backlog through a broker outage: what the relay's memory does while Kafka does
//! not answer (issue 18: memory bounded in bytes).
//!
//! ```text
//! slot       bench_outage_4k (and bench_outage_256k) created, then its own load:
//!            --outage-events rows of ~4 KB JSON (--outage-large-events of ~256 KB)
//! relay      → Kafka with defaults on that slot; once it acknowledged its first
//!            transaction, the broker is frozen (SIGSTOP) for --outage-s, then SIGCONT
//! until      the slot is acknowledged past the load
//! figure     the relay's peak RSS (VmHWM): what a container limit must allow
//! ```
//!
//! With `--baseline-bin` the same runs (and (b)) are repeated with another relay binary
//! on slots of their own, so a change is compared with the code before it in one run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use outbox_relay_harness::KafkaBroker;

use crate::contenders::{Bench, Measured};
use crate::setup;

/// Characters of filler for ~4 KB and ~256 KB of JSON per payload.
pub const PAD_4K: u32 = 4_000;
pub const PAD_256K: u32 = 256 * 1024;

/// The broker frozen for a while once the relay has acknowledged something, resumed on
/// drop whatever happens (a failed run must not leave the broker stopped).
pub struct Outage<'a> {
    broker: &'a KafkaBroker,
    length: Duration,
    started: Instant,
    paused_at: Option<Instant>,
    resumed: bool,
    acknowledged_at_pause: u64,
}

impl<'a> Outage<'a> {
    pub fn new(broker: &'a KafkaBroker, length: Duration) -> Self {
        Outage {
            broker,
            length,
            started: Instant::now(),
            paused_at: None,
            resumed: false,
            acknowledged_at_pause: 0,
        }
    }

    /// One poll: `progressed` says whether the slot moved since the relay started
    /// (`acknowledged`: bytes of WAL acknowledged so far). Returns whether the outage is
    /// over (resumed).
    pub fn step(&mut self, progressed: bool, acknowledged: u64) -> bool {
        match self.paused_at {
            None if progressed => {
                self.broker.pause();
                self.paused_at = Some(Instant::now());
                self.acknowledged_at_pause = acknowledged;
                false
            }
            None => false,
            Some(at) if !self.resumed && at.elapsed() >= self.length => {
                self.broker.resume();
                self.resumed = true;
                true
            }
            Some(_) => self.resumed,
        }
    }

    /// Whether the broker was frozen at some point.
    pub fn frozen(&self) -> bool {
        self.paused_at.is_some()
    }

    /// What happened, for the row's notes.
    pub fn note(&self, load_bytes: u64) -> String {
        match self.paused_at {
            Some(at) => format!(
                "broker frozen (SIGSTOP) {:.1} s after the relay started, for {} s, with {:.0} % of the load's WAL acknowledged",
                at.duration_since(self.started).as_secs_f64(),
                self.length.as_secs(),
                (100.0 * self.acknowledged_at_pause as f64 / load_bytes.max(1) as f64).min(100.0)
            ),
            None => "the broker was never frozen (the load was acknowledged first)".to_owned(),
        }
    }
}

impl Drop for Outage<'_> {
    fn drop(&mut self) {
        if self.paused_at.is_some() && !self.resumed {
            self.broker.resume();
        }
    }
}

/// What the outage runs need from the command line.
pub struct OutagePlan {
    pub events: u64,
    pub large_events: u64,
    pub length: Duration,
    pub baseline: Option<PathBuf>,
}

/// (i): for each payload size, a slot per binary (the relay, then the baseline), one
/// load, one run per slot with its own outage.
pub fn run(bench: &mut Bench<'_>, plan: &OutagePlan) -> Result<Vec<Measured>, String> {
    let mut measured = Vec::new();
    for (label, events, pad, sizes) in [
        ("4k", plan.events, PAD_4K, &[1, 10, 100, 1000][..]),
        ("256k", plan.large_events, PAD_256K, &[1, 10, 100][..]),
    ] {
        if events == 0 {
            continue;
        }
        let mut runs = vec![(
            format!("relay-outage-{label}"),
            bench.relay_bin.clone(),
            String::new(),
        )];
        if let Some(baseline) = &plan.baseline {
            runs.push((
                format!("baseline-outage-{label}"),
                baseline.clone(),
                " [baseline]".to_owned(),
            ));
        }
        for (id, _, _) in &runs {
            setup::create_slot(&mut bench.admin, &slot_of(id));
        }
        eprintln!("bench: loading {events} events of ~{label} payloads for the outage runs");
        let load = setup::load(&mut bench.admin, events, sizes, pad);
        let own_bin = bench.relay_bin.clone();
        for (id, bin, suffix) in runs {
            let slot = slot_of(&id);
            bench.relay_bin = bin;
            bench.outage = Some(plan.length);
            let name = format!(
                "relay → Kafka, {events} × ~{} KB backlog, broker frozen {} s{suffix}",
                if label == "4k" { 4 } else { 256 },
                plan.length.as_secs()
            );
            let result = bench.relay(&id, &name, &slot, "kafka", load.target, events);
            bench.outage = None;
            bench.relay_bin = own_bin.clone();
            setup::drop_slot(&mut bench.admin, &slot);
            let mut m = result.map_err(|err| format!("(i) {name}: {err}"))?;
            m.notes.push(format!(
                "its own load: {events} events, {:.0} WAL bytes per event",
                load.wal_bytes as f64 / events.max(1) as f64
            ));
            eprintln!(
                "bench: (i) {name}: {:.2} s, peak RSS {}",
                m.seconds,
                m.peak_rss_kib.map_or_else(
                    || "?".to_owned(),
                    |kib| format!("{:.1} MiB", kib as f64 / 1024.0)
                )
            );
            measured.push(m);
        }
    }
    Ok(measured)
}

fn slot_of(id: &str) -> String {
    format!("bench_{}", id.replace('-', "_"))
}
