//! (j)'s measurement: several relays started at once in one window, timed until every
//! one of their slots is acknowledged past the load (`many.rs` sets them up). The costs
//! are those of every contender (`contenders.rs`: PostgreSQL's CPU, the broker's, the
//! machine's), the relays' CPU and peak RSS summed, and besides: the most WAL senders
//! seen at once, the WAL their slots retained at the start, when each slot got there,
//! and whether every event reached the topics.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_relay_harness::procstat::{self, CpuTime};
use outbox_relay_harness::wait::poll_until;

use crate::contenders::{log_tail, stopped_events, warning_lines, Bench, KillOnDrop, Measured};
use crate::setup;

/// What (j) measured besides a row's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ManyRun {
    /// The row ([`crate::many::ONE_RELAY`], [`crate::many::RELAY_EACH`]) with the time,
    /// CPU and events.
    pub id: String,
    pub tables: u32,
    pub relays: usize,
    pub slots: usize,
    /// Most WAL senders seen at once while it ran (`pg_stat_replication`).
    pub wal_senders: i64,
    /// Sum over its slots of `pg_current_wal_lsn() - restart_lsn` when it started.
    pub wal_retained_sum_bytes: i64,
    /// The largest of those: the WAL the disk keeps for them (the files are shared).
    pub wal_retained_max_bytes: i64,
    /// VmHWM summed over its relays, and the largest one.
    pub peak_rss_sum_kib: Option<u64>,
    pub peak_rss_max_kib: Option<u64>,
    /// Seconds until the first and the last of its slots was acknowledged past the load.
    pub first_slot_s: f64,
    pub last_slot_s: f64,
}

/// One relay of a contender: its slot, its config, the events it must report.
pub struct RelaySpec {
    pub slot: String,
    pub config: String,
    pub events: u64,
}

/// `pg_current_wal_lsn() - restart_lsn` of `slots`: the sum and the largest.
fn wal_retained(bench: &mut Bench<'_>, slots: &[String]) -> Result<(i64, i64), String> {
    let row = bench
        .admin
        .query_one(
            "SELECT coalesce(sum(pg_current_wal_lsn() - restart_lsn), 0)::bigint, \
                    coalesce(max(pg_current_wal_lsn() - restart_lsn), 0)::bigint \
               FROM pg_replication_slots WHERE slot_name::text = ANY($1::text[])",
            &[&slots],
        )
        .map_err(|err| format!("WAL retained by the slots: {err}"))?;
    Ok((row.get(0), row.get(1)))
}

/// `confirmed_flush_lsn` of each of `slots`, and the server's WAL senders.
fn progress(bench: &mut Bench<'_>, slots: &[String]) -> (BTreeMap<String, u64>, i64) {
    let rows = bench
        .admin
        .query(
            "SELECT slot_name::text, confirmed_flush_lsn::text, \
                    (SELECT count(*) FROM pg_stat_replication) \
               FROM pg_replication_slots WHERE slot_name::text = ANY($1::text[])",
            &[&slots],
        )
        .unwrap_or_default();
    let senders = rows.first().map_or(0, |row| row.get::<_, i64>(2));
    let confirmed = rows
        .iter()
        .map(|row| {
            let lsn: Option<String> = row.get(1);
            (
                row.get::<_, String>(0),
                lsn.map_or(0, |lsn| outbox_relay_harness::lsn_to_u64(&lsn)),
            )
        })
        .collect();
    (confirmed, senders)
}

/// Runs `specs` at once, in one measurement window, until every slot is acknowledged
/// past `target`.
pub fn relays(
    bench: &mut Bench<'_>,
    id: &str,
    name: &str,
    specs: &[RelaySpec],
    target: u64,
    events: u64,
    tables: u32,
) -> Result<(Measured, ManyRun), String> {
    let slots: Vec<String> = specs.iter().map(|spec| spec.slot.clone()).collect();
    let mut commands = Vec::new();
    let mut dirs = Vec::new();
    for spec in specs {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-bench-many-")
            .tempdir()
            .map_err(|err| format!("temp dir: {err}"))?;
        commands.push(bench.relay_command_with(&spec.config, dir.path())?);
        dirs.push(dir);
    }
    let (wal_retained_sum_bytes, wal_retained_max_bytes) = wal_retained(bench, &slots)?;
    let bootstrap = bench.kafka.ok_or("(j) needs the Kafka broker")?.bootstrap();
    let records_before = setup::records_in_topics(&bootstrap)?;

    let window = bench.open();
    let mut running = Vec::new();
    for command in &mut commands {
        running.push(KillOnDrop(command.spawn().map_err(|err| {
            format!("starting {}: {err}", bench.relay_bin.display())
        })?));
    }
    let mut acknowledged_at: BTreeMap<String, f64> = BTreeMap::new();
    let mut wal_senders = 0;
    let mut exited = None;
    let done = poll_until(bench.timeout, || {
        if let Some((i, status)) = running
            .iter_mut()
            .enumerate()
            .find_map(|(i, relay)| relay.0.try_wait().ok().flatten().map(|s| (i, s)))
        {
            exited = Some((i, status));
            return Some(false);
        }
        let (confirmed, senders) = progress(bench, &slots);
        wal_senders = wal_senders.max(senders);
        for (slot, lsn) in confirmed {
            if lsn >= target {
                let now = window.started.elapsed().as_secs_f64();
                acknowledged_at.entry(slot).or_insert(now);
            }
        }
        (acknowledged_at.len() == slots.len()).then_some(true)
    });
    let seconds = window.started.elapsed().as_secs_f64();
    if done != Some(true) {
        let (why, log) = match exited {
            Some((i, status)) => (
                format!("the relay on {} exited ({status})", slots[i]),
                dirs[i].path().join("relay.log"),
            ),
            None => (
                format!(
                    "{} of {} slots acknowledged past the load after {:?}",
                    acknowledged_at.len(),
                    slots.len(),
                    bench.timeout
                ),
                dirs[0].path().join("relay.log"),
            ),
        };
        return Err(format!("{why}; relay log tail:\n{}", log_tail(&log)));
    }
    let pids: Vec<u32> = running.iter().map(|relay| relay.0.id()).collect();
    let process_cpu = CpuTime(pids.iter().map(|&pid| procstat::process_cpu(pid).0).sum());
    let rss: Vec<Option<u64>> = pids
        .iter()
        .map(|&pid| procstat::peak_rss_kib(pid))
        .collect();
    let rss: Option<Vec<u64>> = rss.into_iter().collect();
    // Asked to stop all at once, then waited for: their drains overlap.
    for relay in &running {
        relay.terminate();
    }
    for relay in &mut running {
        relay.wait_stopped(Duration::from_secs(60))?;
    }
    let costs = bench.close(&window);

    let mut notes = Vec::new();
    // At least once: every event in the topics, duplicates possible after a retry.
    let records = setup::records_in_topics(&bootstrap)? - records_before;
    if records != events as i64 {
        notes.push(format!(
            "{records} records reached the topics for {events} events{}",
            if records > events as i64 {
                " (duplicates, at least once)"
            } else {
                ": some are MISSING"
            }
        ));
    }
    for (spec, dir) in specs.iter().zip(&dirs) {
        let log = dir.path().join("relay.log");
        match stopped_events(&log) {
            Some(seen) if seen == spec.events => {}
            // The "stopped" line counts the last session's events only.
            Some(seen) => notes.push(format!(
                "the relay on {} reported events={seen}, expected {}, in {} sessions",
                spec.slot,
                spec.events,
                sessions(&log)
            )),
            None => notes.push(format!("no \"stopped\" line in the log of {}", spec.slot)),
        }
        let warnings = warning_lines(&log);
        if !warnings.is_empty() {
            notes.push(format!(
                "{}: {} WARN/ERROR lines, first: {}",
                spec.slot,
                warnings.len(),
                warnings[0]
            ));
        }
    }
    let times = acknowledged_at.values().copied();
    let run = ManyRun {
        id: id.to_owned(),
        tables,
        relays: specs.len(),
        slots: slots.len(),
        wal_senders,
        wal_retained_sum_bytes,
        wal_retained_max_bytes,
        peak_rss_sum_kib: rss.as_ref().map(|all| all.iter().sum()),
        peak_rss_max_kib: rss.as_ref().and_then(|all| all.iter().copied().max()),
        first_slot_s: times.clone().fold(f64::INFINITY, f64::min),
        last_slot_s: times.fold(0.0, f64::max),
    };
    let mut measured = bench.measured(
        id,
        name,
        events,
        seconds,
        process_cpu,
        run.peak_rss_sum_kib,
        &costs,
        notes,
    );
    // The relays' own CPU after the end condition (draining, exiting; 20 of them add up),
    // known once they are reaped, is not other processes' work.
    let after_end = costs.reaped_by_us.since(process_cpu).seconds();
    measured.other_cpu_s = (measured.other_cpu_s - after_end).max(0.0);
    Ok((measured, run))
}

/// The relay's replication sessions: its "starting replication" log lines.
fn sessions(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("\"message\":\"starting replication\"")
        .count()
}
