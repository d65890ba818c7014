//! (k)'s measurement: one relay run in one window on a primary and its hot standby
//! (`standby.rs` sets them up). The primary's costs are those of every contender
//! (`contenders.rs`: the cluster's CPU, the broker's, the machine's, the WAL), opened
//! on a [`Bench`] of the primary; the standby's CPU is counted the same way beside it.
//! Both servers are polled every 50 ms, whichever one the relay decodes on, so the
//! benchmark's own queries cost each server the same in both runs.
//!
//! ```text
//! open   both clusters' CPU (postmaster + reaped + live children), each live child's
//! run    the relay, until its slot (on the server it decodes on) is acknowledged past
//!        the load; every poll: each server's WAL senders (pg_stat_replication) and the
//!        pids of its active logical slots (pg_replication_slots.active_pid)
//! end    each live child's CPU since the opening, by kind (its process title; a WAL
//!        sender of a logical slot apart), before the relay stops
//! close  the relay stopped, both clusters' exited processes reaped, their CPU again
//! after  the records between the topics' offsets before and after, read back by seq
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use outbox_relay_harness::pg::SUPERUSER;
use outbox_relay_harness::procstat::{self, CpuTime};
use outbox_relay_harness::wait::poll_until;
use outbox_relay_harness::PgCluster;
use postgres::Client;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::contenders::{log_tail, stopped_events, warning_lines, Bench, KillOnDrop, Measured};
use crate::setup::{topic, AGGREGATE_TYPES, PARTITIONS};

/// How long the records of a run may take to be read back.
const READ_BACK: Duration = Duration::from_secs(300);

/// One server's costs in a run's window.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ServerCost {
    /// Every process of the cluster: the postmaster with its reaped children and the
    /// live ones, from the window's opening until its closing.
    pub cpu_s: f64,
    /// The live processes' CPU from the opening until the end condition, by kind: the
    /// process title's first word (`walsender`, `startup`, `walreceiver`,
    /// `checkpointer`, ...; `backend` for sessions), `walsender (logical)` for the WAL
    /// sender of a logical slot, `walsender (physical)` for the others.
    pub cpu_by_kind_s: BTreeMap<String, f64>,
    /// The most WAL senders seen at once (`pg_stat_replication`).
    pub wal_senders: i64,
}

impl ServerCost {
    /// CPU of one kind of process, 0 when there was none.
    pub fn kind_s(&self, kind: &str) -> f64 {
        self.cpu_by_kind_s.get(kind).copied().unwrap_or(0.0)
    }
}

/// What one run of (k) measured besides a row's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StandbyRun {
    /// The row ([`crate::standby::ON_PRIMARY`], [`crate::standby::ON_STANDBY`]).
    pub id: String,
    /// `primary` or `standby`: where the relay's slot and WAL sender were.
    pub decoded_on: String,
    pub primary: ServerCost,
    pub standby: ServerCost,
    /// Records the run added to the topics (read back between the offsets before and
    /// after it).
    pub records: u64,
    /// Events of the load (`seq` 1 ..= events) with no record, and records beyond one
    /// per event.
    pub missing: u64,
    pub duplicates: u64,
}

/// What one run is: the relay's config, the server its slot is on, the load's end.
pub struct RunSpec<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub on_standby: bool,
    pub slot: &'a str,
    pub config: String,
    pub target: u64,
    pub events: u64,
}

/// One cluster's CPU from a window's opening.
pub(crate) struct ServerWindow {
    postmaster: u32,
    total: CpuTime,
    children: Vec<u32>,
    live: HashMap<u32, CpuTime>,
}

impl ServerWindow {
    pub(crate) fn open(pg: &PgCluster) -> Self {
        let postmaster = pg.pid();
        let children = procstat::children_of(postmaster);
        let live = children
            .iter()
            .map(|&pid| (pid, procstat::process_cpu(pid)))
            .collect();
        ServerWindow {
            postmaster,
            total: procstat::postgres_cpu(postmaster),
            children,
            live,
        }
    }

    /// The live children's CPU since the opening, by kind (see [`ServerCost`]);
    /// `logical`: the pids of WAL senders of logical slots.
    pub(crate) fn by_kind(&self, logical: &BTreeSet<i32>) -> BTreeMap<String, f64> {
        let mut kinds = BTreeMap::new();
        for pid in procstat::children_of(self.postmaster) {
            let before = self.live.get(&pid).copied().unwrap_or_default();
            let cpu = procstat::process_cpu(pid).since(before).seconds();
            let kind = match process_kind(pid) {
                kind if kind != "walsender" => kind,
                _ if i32::try_from(pid).is_ok_and(|pid| logical.contains(&pid)) => {
                    "walsender (logical)".to_owned()
                }
                _ => "walsender (physical)".to_owned(),
            };
            *kinds.entry(kind).or_insert(0.0) += cpu;
        }
        kinds
    }

    /// Waits (at most 10 s) until the cluster has reaped every process that was not
    /// there at the opening, then returns its CPU since the opening.
    pub(crate) fn close(&self) -> CpuTime {
        poll_until(Duration::from_secs(10), || {
            procstat::children_of(self.postmaster)
                .iter()
                .all(|child| self.children.contains(child))
                .then_some(())
        });
        procstat::postgres_cpu(self.postmaster).since(self.total)
    }
}

/// A PostgreSQL process's kind: the first word of its title (`postgres: walsender …`,
/// `postgres: startup recovering …`, `postgres: background writer`); a session's title
/// starts with its user.
fn process_kind(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let title = String::from_utf8_lossy(&cmdline);
    match title
        .strip_prefix("postgres: ")
        .and_then(|rest| rest.split_whitespace().next())
    {
        Some(SUPERUSER) => "backend".to_owned(),
        Some("background") => "background writer".to_owned(),
        Some(word) => word.to_owned(),
        None => "other".to_owned(),
    }
}

/// One poll of a server: `slot`'s `confirmed_flush_lsn` (0 when it has none), its WAL
/// senders, the pids of its active logical slots.
fn poll(client: &mut Client, slot: &str) -> (u64, i64, Vec<i32>) {
    let Ok(row) = client.query_one(
        "SELECT (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1), \
                (SELECT count(*) FROM pg_stat_replication), \
                (SELECT coalesce(array_agg(active_pid), '{}') FROM pg_replication_slots \
                  WHERE slot_type = 'logical' AND active_pid IS NOT NULL)",
        &[&slot],
    ) else {
        return (0, 0, Vec::new());
    };
    let lsn: Option<String> = row.get(0);
    (
        lsn.map_or(0, |lsn| outbox_relay_harness::lsn_to_u64(&lsn)),
        row.get(1),
        row.get(2),
    )
}

/// What both servers showed over a run's polls.
#[derive(Default)]
struct Polled {
    wal_senders: [i64; 2],
    logical: [BTreeSet<i32>; 2],
}

/// Runs the relay of `spec` in one window on `bench` (the primary's) and `standby`,
/// until its slot is acknowledged past the load; `slots` are the slot names polled on
/// the primary and on the standby.
pub fn relay(
    bench: &mut Bench<'_>,
    standby: &PgCluster,
    standby_admin: &mut Client,
    slots: [&str; 2],
    spec: &RunSpec<'_>,
) -> Result<(Measured, StandbyRun), String> {
    let dir = tempfile::Builder::new()
        .prefix("outbox-relay-bench-standby-")
        .tempdir()
        .map_err(|err| format!("temp dir: {err}"))?;
    let log_path = dir.path().join("relay.log");
    let mut command = bench.relay_command_with(&spec.config, dir.path())?;
    let bootstrap = bench.kafka.ok_or("(k) needs the Kafka broker")?.bootstrap();
    let reader = RecordReader::new(&bootstrap)?;
    let offsets_before = reader.high_watermarks()?;

    let window = bench.open();
    let primary_window = ServerWindow::open(bench.pg);
    let standby_window = ServerWindow::open(standby);
    let mut relay = KillOnDrop(
        command
            .spawn()
            .map_err(|err| format!("starting {}: {err}", bench.relay_bin.display()))?,
    );
    let pid = relay.0.id();
    let mut polled = Polled::default();
    let mut exited = None;
    let acknowledged = poll_until(bench.timeout, || {
        if let Ok(Some(status)) = relay.0.try_wait() {
            exited = Some(status);
            return Some(false);
        }
        let mut confirmed = [0; 2];
        for (i, client) in [&mut bench.admin, &mut *standby_admin]
            .into_iter()
            .enumerate()
        {
            let (lsn, senders, logical) = poll(client, slots[i]);
            confirmed[i] = lsn;
            polled.wal_senders[i] = polled.wal_senders[i].max(senders);
            polled.logical[i].extend(logical);
        }
        (confirmed[usize::from(spec.on_standby)] >= spec.target).then_some(true)
    });
    let seconds = window.started.elapsed().as_secs_f64();
    if acknowledged != Some(true) {
        let why = match exited {
            Some(status) => format!("the relay exited ({status})"),
            None => format!(
                "slot {} not acknowledged past the load after {:?}",
                spec.slot, bench.timeout
            ),
        };
        return Err(format!("{why}; relay log tail:\n{}", log_tail(&log_path)));
    }
    let process_cpu = procstat::process_cpu(pid);
    let peak_rss = procstat::peak_rss_kib(pid);
    let primary_kinds = primary_window.by_kind(&polled.logical[0]);
    let standby_kinds = standby_window.by_kind(&polled.logical[1]);
    relay.stop(Duration::from_secs(60))?;
    let standby_cpu = standby_window.close();
    let costs = bench.close(&window);

    let mut notes = Vec::new();
    match stopped_events(&log_path) {
        Some(seen) if seen == spec.events => {}
        Some(seen) => notes.push(format!(
            "the relay reported events={seen}, expected {}",
            spec.events
        )),
        None => notes.push("no \"stopped\" line in the relay's log".to_owned()),
    }
    let warnings = warning_lines(&log_path);
    if !warnings.is_empty() {
        notes.push(format!(
            "{} WARN/ERROR lines, first: {}",
            warnings.len(),
            warnings[0]
        ));
    }
    let offsets_after = reader.high_watermarks()?;
    let seqs = reader.seqs(&offsets_before, &offsets_after, spec.events)?;
    if seqs.missing > 0 || seqs.duplicates > 0 {
        notes.push(format!(
            "{} records for {} events: {} events MISSING, {} duplicates",
            seqs.records, spec.events, seqs.missing, seqs.duplicates
        ));
    }
    let mut measured = bench.measured(
        spec.id,
        spec.name,
        spec.events,
        seconds,
        process_cpu,
        peak_rss,
        &costs,
        notes,
    );
    // The standby's CPU, and the relay's after the end condition (draining, exiting;
    // known once it is reaped), are not other processes' work.
    let after_end = costs.reaped_by_us.since(process_cpu).seconds();
    measured.other_cpu_s = (measured.other_cpu_s - after_end - standby_cpu.seconds()).max(0.0);
    let run = StandbyRun {
        id: spec.id.to_owned(),
        decoded_on: if spec.on_standby {
            "standby"
        } else {
            "primary"
        }
        .to_owned(),
        primary: ServerCost {
            cpu_s: measured.postgres_cpu_s,
            cpu_by_kind_s: primary_kinds,
            wal_senders: polled.wal_senders[0],
        },
        standby: ServerCost {
            cpu_s: standby_cpu.seconds(),
            cpu_by_kind_s: standby_kinds,
            wal_senders: polled.wal_senders[1],
        },
        records: seqs.records,
        missing: seqs.missing,
        duplicates: seqs.duplicates,
    };
    Ok((measured, run))
}

/// The records of a run, counted by the payload's `seq`.
struct Seqs {
    records: u64,
    missing: u64,
    duplicates: u64,
}

/// Reads the benchmark's topics between two sets of offsets.
struct RecordReader(BaseConsumer);

/// Each partition of the benchmark's topics with an offset.
type Offsets = Vec<(String, i32, i64)>;

impl RecordReader {
    fn new(bootstrap: &str) -> Result<Self, String> {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "bench-standby")
            .set("enable.auto.commit", "false")
            .create()
            .map(RecordReader)
            .map_err(|err| format!("creating a consumer: {err}"))
    }

    fn high_watermarks(&self) -> Result<Offsets, String> {
        let mut offsets = Vec::new();
        for kind in AGGREGATE_TYPES {
            for partition in 0..PARTITIONS {
                let (_, high) = self
                    .0
                    .fetch_watermarks(&topic(kind), partition, Duration::from_secs(10))
                    .map_err(|err| format!("watermarks of {}/{partition}: {err}", topic(kind)))?;
                offsets.push((topic(kind), partition, high));
            }
        }
        Ok(offsets)
    }

    /// Every record from `from` up to `to`, counted by `seq` (1 ..= `events`).
    fn seqs(&self, from: &Offsets, to: &Offsets, events: u64) -> Result<Seqs, String> {
        let mut assignment = TopicPartitionList::new();
        let mut left: HashMap<(String, i32), i64> = HashMap::new();
        for ((topic, partition, start), (_, _, end)) in from.iter().zip(to) {
            if end > start {
                assignment
                    .add_partition_offset(topic, *partition, Offset::Offset(*start))
                    .map_err(|err| format!("assigning {topic}/{partition}: {err}"))?;
                left.insert((topic.clone(), *partition), *end);
            }
        }
        let mut counts = vec![0u32; usize::try_from(events).unwrap_or(0) + 1];
        let mut records = 0u64;
        if !left.is_empty() {
            self.0
                .assign(&assignment)
                .map_err(|err| format!("assigning the reader: {err}"))?;
        }
        let deadline = std::time::Instant::now() + READ_BACK;
        while !left.is_empty() {
            if std::time::Instant::now() >= deadline {
                return Err(format!(
                    "reading the run's records back: {} partitions unfinished after {READ_BACK:?}",
                    left.len()
                ));
            }
            let Some(message) = self.0.poll(Duration::from_millis(100)) else {
                continue;
            };
            let message = message.map_err(|err| format!("reading the records: {err}"))?;
            let key = (message.topic().to_owned(), message.partition());
            let Some(&end) = left.get(&key) else {
                continue;
            };
            if message.offset() >= end {
                continue;
            }
            records += 1;
            let seq = message
                .payload()
                .and_then(|value| serde_json::from_slice::<serde_json::Value>(value).ok())
                .and_then(|value| value["seq"].as_u64())
                .and_then(|seq| usize::try_from(seq).ok());
            if let Some(count) = seq.and_then(|seq| counts.get_mut(seq)) {
                *count += 1;
            }
            if message.offset() + 1 >= end {
                left.remove(&key);
            }
        }
        let _ = self.0.unassign();
        Ok(Seqs {
            records,
            missing: counts.iter().skip(1).filter(|&&c| c == 0).count() as u64,
            duplicates: counts
                .iter()
                .skip(1)
                .map(|&c| u64::from(c.saturating_sub(1)))
                .sum(),
        })
    }
}
