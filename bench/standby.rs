//! (k) Decoding on a standby (issue 21 part 2, `[postgres] primary_url`, PostgreSQL
//! 16+): the primary's CPU per event with the relay on the primary against the relay on
//! a hot standby, on the same WAL, one run each.
//!
//! ```text
//! set-up   a primary of its own (the benchmark's PostgreSQL when it is 16 or later,
//!          else 16; the benchmark's settings, database, outbox table, publication and
//!          state table) and a hot standby of it (physical slot, hot_standby_feedback)
//! slots    bench_on_primary on the primary; bench_on_standby on the standby (created
//!          there while the primary is asked for pg_log_standby_snapshot()): before
//!          the load, so both decode the same WAL
//! load     the standard load on the primary (--events, --txn-sizes; CHECKPOINT); the
//!          standby replays it; then a restartpoint (CHECKPOINT) on the standby
//! primary  relay → Kafka with defaults, url = the primary, on bench_on_primary
//! standby  relay → Kafka with defaults, url = the standby, primary_url = the primary,
//!          on bench_on_standby
//! until    the run's slot is acknowledged past the load
//! ```
//!
//! Each run is one window (`standby_run.rs`), opened after the load was written and
//! replayed: in it the servers only decode and send (and replay the relay's record).
//! The standby's CPU while it replayed the load is reported apart. The relay on the
//! primary runs first.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use outbox_relay_harness::{lsn_to_u64, PgCluster};
use postgres::Client;

use crate::contenders::{Bench, Measured};
use crate::report::Row;
use crate::setup::{self, Load, DATABASE, PUBLICATION};
use crate::standby_run::{relay, RunSpec, ServerWindow};

pub use crate::standby_run::StandbyRun;

/// Row ids of the two runs.
pub const ON_PRIMARY: &str = "standby-relay-on-primary";
pub const ON_STANDBY: &str = "standby-relay-on-standby";

/// The logical slots, on the primary and on the standby; the standby's physical slot.
const PRIMARY_SLOT: &str = "bench_on_primary";
const STANDBY_SLOT: &str = "bench_on_standby";
const PHYSICAL_SLOT: &str = "bench_standby";

/// The first PostgreSQL that decodes on a standby (`server_version_num`).
const STANDBY_DECODING_SINCE: u32 = 160_000;

/// How long the standby may take to replay the load.
const REPLAY_WAIT: Duration = Duration::from_secs(600);

/// What (k) needs from the command line.
pub struct StandbyPlan {
    pub events: u64,
    pub txn_sizes: Vec<u32>,
    pub pad: u32,
    pub idle_max_busy: f64,
    pub idle_wait: Duration,
}

/// (k)'s set-up and runs, for results.json.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StandbyReport {
    pub postgres_version: String,
    pub load: Load,
    /// From the load's end (its CHECKPOINT done) until the standby had replayed it.
    pub replay_wait_s: f64,
    /// Each server's CPU from before the load until the standby's restartpoint after
    /// it: every process, and the live ones by kind (on the primary the session writing
    /// the load and the physical WAL sender streaming it; on the standby the startup
    /// process replaying it and the WAL receiver).
    pub load_primary_cpu_s: f64,
    pub load_primary_cpu_by_kind_s: BTreeMap<String, f64>,
    pub load_standby_cpu_s: f64,
    pub load_standby_cpu_by_kind_s: BTreeMap<String, f64>,
    pub runs: Vec<StandbyRun>,
}

/// The relay's config with defaults: the server (and the primary, on the standby), the
/// slot, publication, table and broker.
fn config(bench: &Bench<'_>, url: &str, primary_url: Option<&str>, slot: &str) -> String {
    let primary = primary_url.map_or_else(String::new, |url| format!("primary_url = \"{url}\"\n"));
    format!(
        "[postgres]\nurl = \"{url}\"\n{primary}slot = \"{slot}\"\npublication = \"{PUBLICATION}\"\n\
         [outbox]\ntable = \"public.outbox\"\n[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"{}\"\n",
        bench.kafka.map(|kafka| kafka.bootstrap()).unwrap_or_default()
    )
}

/// Creates `slot` on the standby, asking the primary for a record of its running
/// transactions every half second meanwhile (what the relay does: a slot created on a
/// standby waits for one).
fn create_standby_slot(primary: &PgCluster, standby: &mut Client, slot: &str) {
    let created = AtomicBool::new(false);
    let mut asker = primary.client_db(DATABASE);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !created.load(Ordering::Relaxed) {
                let _ = asker.batch_execute("SELECT pg_log_standby_snapshot()");
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        setup::create_slot(standby, slot);
        created.store(true, Ordering::Relaxed);
    });
}

/// Waits until the standby has replayed up to `lsn`.
fn wait_replayed(standby: &mut Client, lsn: u64) -> Result<(), String> {
    outbox_relay_harness::wait::poll_until(REPLAY_WAIT, || {
        let replayed = setup::first_value(standby, "SELECT pg_last_wal_replay_lsn()");
        (lsn_to_u64(&replayed) >= lsn).then_some(())
    })
    .ok_or_else(|| format!("the standby did not replay the load within {REPLAY_WAIT:?}"))
}

/// (k): a primary and its standby, the slots, the load, then the relay on each.
pub fn run(
    bench: &Bench<'_>,
    plan: &StandbyPlan,
) -> Result<(Vec<Measured>, StandbyReport), String> {
    let bindir = if bench.pg.server_version_num() >= STANDBY_DECODING_SINCE {
        bench.pg.bindir()
    } else {
        PgCluster::bindir_of_major(16)
    };
    crate::log(&format!(
        "(k) starting a primary and a hot standby from {}",
        bindir.display()
    ));
    let primary = setup::start_postgres(0, Some(bindir));
    let standby = primary.start_standby(
        PHYSICAL_SLOT,
        DATABASE,
        &[("hot_standby_feedback", "on"), ("max_wal_size", "8GB")],
    );
    let mut standby_admin = standby.client_db(DATABASE);
    let mut primary_bench = Bench {
        pg: &primary,
        kafka: bench.kafka,
        admin: primary.client_db(DATABASE),
        relay_bin: bench.relay_bin.clone(),
        timeout: bench.timeout,
        busy_before_pct: 0.0,
        table_less: false,
        outage: None,
    };
    let postgres_version = setup::first_value(&mut primary_bench.admin, "SHOW server_version");
    setup::create_slot(&mut primary_bench.admin, PRIMARY_SLOT);
    create_standby_slot(&primary, &mut standby_admin, STANDBY_SLOT);

    crate::log(&format!(
        "(k) loading {} events on the primary, transactions of {:?}",
        plan.events, plan.txn_sizes
    ));
    let load_primary = ServerWindow::open(&primary);
    let load_standby = ServerWindow::open(&standby);
    let load = setup::load(
        &mut primary_bench.admin,
        plan.events,
        &plan.txn_sizes,
        plan.pad,
    );
    let loaded = Instant::now();
    let end = setup::wal_lsn(&mut primary_bench.admin);
    wait_replayed(&mut standby_admin, end)?;
    let replay_wait_s = loaded.elapsed().as_secs_f64();
    // A restartpoint: the replayed pages are not written inside a run's window.
    standby_admin
        .batch_execute("CHECKPOINT")
        .map_err(|err| format!("CHECKPOINT on the standby: {err}"))?;
    let load_primary_cpu_by_kind_s = load_primary.by_kind(&Default::default());
    let load_standby_cpu_by_kind_s = load_standby.by_kind(&Default::default());
    let load_primary_cpu_s = load_primary.close().seconds();
    let load_standby_cpu_s = load_standby.close().seconds();
    crate::log(&format!(
        "(k) loaded in {:.1} s; the standby had replayed it {replay_wait_s:.2} s later",
        load.seconds
    ));

    let primary_url = primary.url("postgres", None, DATABASE);
    let standby_url = standby.url("postgres", None, DATABASE);
    let specs = [
        RunSpec {
            id: ON_PRIMARY,
            name: "relay → Kafka, decoding on the primary (PostgreSQL 16+)",
            on_standby: false,
            slot: PRIMARY_SLOT,
            config: config(bench, &primary_url, None, PRIMARY_SLOT),
            target: load.target,
            events: plan.events,
        },
        RunSpec {
            id: ON_STANDBY,
            name: "relay → Kafka, decoding on a hot standby (primary_url)",
            on_standby: true,
            slot: STANDBY_SLOT,
            config: config(bench, &standby_url, Some(&primary_url), STANDBY_SLOT),
            target: load.target,
            events: plan.events,
        },
    ];
    let mut measured = Vec::new();
    let mut runs = Vec::new();
    for spec in &specs {
        primary_bench.busy_before_pct = setup::wait_quiet(plan.idle_max_busy, plan.idle_wait);
        let result = relay(
            &mut primary_bench,
            &standby,
            &mut standby_admin,
            [PRIMARY_SLOT, STANDBY_SLOT],
            spec,
        );
        let slot_admin = if spec.on_standby {
            &mut standby_admin
        } else {
            &mut primary_bench.admin
        };
        setup::drop_slot(slot_admin, spec.slot);
        let (m, run) = result.map_err(|err| format!("(k) {}: {err}", spec.name))?;
        crate::log(&format!(
            "(k) {}: {:.2} s, {:.0} events/s, primary CPU {:.1} µs/event",
            spec.name,
            m.seconds,
            m.events_per_second(),
            run.primary.cpu_s / plan.events as f64 * 1e6
        ));
        measured.push(m);
        runs.push(run);
    }
    let report = StandbyReport {
        postgres_version,
        load,
        replay_wait_s,
        load_primary_cpu_s,
        load_primary_cpu_by_kind_s,
        load_standby_cpu_s,
        load_standby_cpu_by_kind_s,
        runs,
    };
    Ok((measured, report))
}

fn kind(cpu_by_kind_s: &BTreeMap<String, f64>, kind: &str) -> f64 {
    cpu_by_kind_s.get(kind).copied().unwrap_or(0.0)
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(
        || "–".to_owned(),
        |kib| format!("{:.1} MiB", kib as f64 / 1024.0),
    )
}

/// The table of (k) under the main one.
pub fn markdown(report: Option<&StandbyReport>, rows: &[Row]) -> String {
    let Some(report) = report else {
        return String::new();
    };
    let events = report.load.events.max(1) as f64;
    let per_event = |seconds: f64| seconds / events * 1e6;
    let mut out = format!(
        "\nDecoding on a standby (k): PostgreSQL {}, a primary and a hot standby of their own; \
         {} events loaded on the primary in {:.1} s ({:.0} WAL bytes per event; its physical WAL \
         sender streaming them to the standby used {:.1} s of CPU meanwhile), replayed on the \
         standby {:.2} s after the load ended, at {:.1} s of the standby's CPU ({:.1} s of it the \
         startup process, {:.1} s the WAL receiver). Then, on that WAL, the relay on each (CPU in each run's window: from the \
         relay's start until its slot is acknowledged past the load):\n\n\
         | relay decodes on | time | events/s | primary CPU µs / event (its WAL senders: logical / physical) | standby CPU µs / event (logical WAL sender / startup) | WAL senders: primary / standby | relay CPU s / 1M events | peak RSS | records (missing, duplicates) | busy before |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        report.postgres_version,
        report.load.events,
        report.load.seconds,
        report.load.wal_bytes as f64 / events,
        kind(&report.load_primary_cpu_by_kind_s, "walsender (physical)"),
        report.replay_wait_s,
        report.load_standby_cpu_s,
        kind(&report.load_standby_cpu_by_kind_s, "startup"),
        kind(&report.load_standby_cpu_by_kind_s, "walreceiver"),
    );
    for run in &report.runs {
        let Some(row) = rows.iter().find(|row| row.measured.id == run.id) else {
            continue;
        };
        let m = &row.measured;
        let (p, s) = (&run.primary, &run.standby);
        let _ = writeln!(
            out,
            "| {} | {:.2} s | {:.0} | **{:.1}** ({:.1} / {:.1}) | {:.1} ({:.1} / {:.1}) | {} / {} | {:.2} | {} | {} ({}, {}) | {:.0} % |",
            run.decoded_on,
            m.seconds,
            row.events_per_second,
            per_event(p.cpu_s),
            per_event(p.kind_s("walsender (logical)")),
            per_event(p.kind_s("walsender (physical)")),
            per_event(s.cpu_s),
            per_event(s.kind_s("walsender (logical)")),
            per_event(s.kind_s("startup")),
            p.wal_senders,
            s.wal_senders,
            row.process_cpu_s_per_million,
            mib(m.peak_rss_kib),
            run.records,
            run.missing,
            run.duplicates,
            m.busy_before_pct
        );
    }
    out
}
