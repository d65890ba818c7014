//! The contenders and how each is timed and costed (the polling relay's run, (e), is
//! with the polling relay in `polling.rs`). Each run is one measurement window:
//!
//! ```text
//! open   machine busy, PostgreSQL CPU (postmaster + reaped + live children),
//!        broker CPU, pg_current_wal_lsn(), the postmaster's live children
//! run    the contender, until its own end condition (below); that time is `seconds`
//! close  the contender's processes stopped, PostgreSQL's exited backends reaped
//!        (wait until no child is left that was not there at `open`), then the same
//!        counters again
//! ```
//!
//! End conditions: (a) `pg_recvlogical --endpos` exits; (b), (c), (g) the relay's slot
//! `confirmed_flush_lsn` reaches the load's target LSN (polled every 50 ms on
//! one session); (e) the
//! polling relay finds no unpublished row. Every window starts with the contender's
//! process start, so connection set-up is included (milliseconds).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_relay_harness::procstat::{self, CpuTime};
use outbox_relay_harness::wait::{poll_until, wait_child};
use outbox_relay_harness::{KafkaBroker, PgCluster};
use postgres::Client;

use crate::outage::Outage;
use crate::setup::{self, DATABASE, PUBLICATION};

/// What a contender cost, measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Measured {
    /// Short id: `ceiling`, `relay-kafka`, `relay-stdout`, `polling-1`, ...
    pub id: String,
    pub name: String,
    pub events: u64,
    pub seconds: f64,
    /// CPU of the contender's own process (pg_recvlogical, the relay, the polling relay).
    pub process_cpu_s: f64,
    pub peak_rss_kib: Option<u64>,
    /// Every PostgreSQL process over the window (walsender or backends, checkpointer, ...).
    pub postgres_cpu_s: f64,
    /// WAL written over the window.
    pub wal_bytes: u64,
    pub broker_cpu_s: Option<f64>,
    /// The machine's busy time over the window minus all of the above: other work on
    /// the machine (should be near 0 on a quiet machine).
    pub other_cpu_s: f64,
    /// Percent of all CPUs busy just before the window opened.
    pub busy_before_pct: f64,
    /// Dead tuples the contender left in its table (the polling relay's UPDATEs).
    pub dead_tuples: Option<i64>,
    pub notes: Vec<String>,
}

impl Measured {
    pub fn events_per_second(&self) -> f64 {
        self.events as f64 / self.seconds
    }
}

/// What every contender runs against.
pub struct Bench<'a> {
    pub pg: &'a PgCluster,
    pub kafka: Option<&'a KafkaBroker>,
    /// Superuser session on the benchmark's database: slot polls, LSNs, statistics.
    pub admin: Client,
    pub relay_bin: PathBuf,
    pub timeout: Duration,
    pub busy_before_pct: f64,
    /// The relay contenders run table-less: `[outbox] enabled = false`, `[messages]`
    /// with the routed values as prefixes, the publication without tables.
    pub table_less: bool,
    /// (i): freeze the broker this long once the relay acknowledged something
    /// ([`crate::outage::Outage`]).
    pub outage: Option<Duration>,
}

/// The counters at the opening of a window.
pub(crate) struct Window {
    pub(crate) started: Instant,
    machine: CpuTime,
    postgres: CpuTime,
    broker: CpuTime,
    wal: u64,
    children: Vec<u32>,
    reaped_by_us: CpuTime,
}

/// The window's costs, at its closing.
pub(crate) struct Costs {
    postgres: CpuTime,
    broker: Option<CpuTime>,
    machine: CpuTime,
    wal_bytes: u64,
    /// CPU of our own children reaped in the window (pg_recvlogical; (j)'s relays).
    pub(crate) reaped_by_us: CpuTime,
}

/// CPU of the children this process has waited for (cutime + cstime).
fn reaped_by_us() -> CpuTime {
    let me = std::process::id();
    procstat::process_cpu_with_reaped(me).since(procstat::process_cpu(me))
}

impl Bench<'_> {
    fn broker_cpu(&self) -> CpuTime {
        self.kafka
            .map(|broker| procstat::process_cpu(broker.pid()))
            .unwrap_or_default()
    }

    pub(crate) fn open(&mut self) -> Window {
        let postmaster = self.pg.pid();
        Window {
            machine: procstat::machine_busy().0,
            postgres: procstat::postgres_cpu(postmaster),
            broker: self.broker_cpu(),
            wal: setup::wal_lsn(&mut self.admin),
            children: procstat::children_of(postmaster),
            reaped_by_us: reaped_by_us(),
            started: Instant::now(),
        }
    }

    /// Waits (at most 10 s) until PostgreSQL has reaped every process that was not
    /// there at `open` (the walsender, the polling relay's backends), so their CPU is in
    /// the postmaster's counters, then reads the counters.
    pub(crate) fn close(&mut self, window: &Window) -> Costs {
        let postmaster = self.pg.pid();
        poll_until(Duration::from_secs(10), || {
            procstat::children_of(postmaster)
                .iter()
                .all(|child| window.children.contains(child))
                .then_some(())
        });
        let wal = setup::wal_lsn(&mut self.admin);
        Costs {
            postgres: procstat::postgres_cpu(postmaster).since(window.postgres),
            broker: self.kafka.map(|_| self.broker_cpu().since(window.broker)),
            machine: procstat::machine_busy().0.since(window.machine),
            wal_bytes: wal.saturating_sub(window.wal),
            reaped_by_us: reaped_by_us().since(window.reaped_by_us),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn measured(
        &self,
        id: &str,
        name: &str,
        events: u64,
        seconds: f64,
        process_cpu: CpuTime,
        peak_rss_kib: Option<u64>,
        costs: &Costs,
        notes: Vec<String>,
    ) -> Measured {
        let ours = process_cpu.0 + costs.postgres.0 + costs.broker.unwrap_or_default().0;
        Measured {
            id: id.to_owned(),
            name: name.to_owned(),
            events,
            seconds,
            process_cpu_s: process_cpu.seconds(),
            peak_rss_kib,
            postgres_cpu_s: costs.postgres.seconds(),
            wal_bytes: costs.wal_bytes,
            broker_cpu_s: costs.broker.map(CpuTime::seconds),
            other_cpu_s: CpuTime(costs.machine.0.saturating_sub(ours)).seconds(),
            busy_before_pct: self.busy_before_pct,
            dead_tuples: None,
            notes,
        }
    }

    /// (a) The ceiling: `pg_recvlogical` (pgoutput, proto_version 1, the publication)
    /// drains `slot` to /dev/null until `--endpos` = the load's target LSN.
    pub fn ceiling(
        &mut self,
        slot: &str,
        target_lsn: &str,
        events: u64,
    ) -> Result<Measured, String> {
        let program = self.pg.bindir().join("pg_recvlogical");
        let mut command = Command::new(&program);
        command
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                DATABASE,
                "--no-loop",
            ])
            .args(["-p", &self.pg.port().to_string(), "--slot", slot])
            .args([
                "--start",
                "--endpos",
                target_lsn,
                "-F",
                "0",
                "-f",
                "/dev/null",
            ])
            .args(["-o", "proto_version=1"])
            .args(["-o", &format!("publication_names={PUBLICATION}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let window = self.open();
        let mut child = command
            .spawn()
            .map_err(|err| format!("starting {}: {err}", program.display()))?;
        let status = wait_child(&mut child, self.timeout);
        let seconds = window.started.elapsed().as_secs_f64();
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "pg_recvlogical still running after {:?}",
                self.timeout
            ));
        };
        if !status.success() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            return Err(format!("pg_recvlogical failed ({status}): {stderr}"));
        }
        let costs = self.close(&window);
        let notes = vec!["peak RSS not measured (pg_recvlogical exits at --endpos)".to_owned()];
        Ok(self.measured(
            "ceiling",
            "ceiling: pg_recvlogical → /dev/null",
            events,
            seconds,
            costs.reaped_by_us,
            None,
            &costs,
            notes,
        ))
    }

    /// (b), (c), (g) The relay with its default settings on `slot`, `sink` = `kafka` or
    /// `stdout` (into /dev/null), until the slot is acknowledged past `target`.
    pub fn relay(
        &mut self,
        id: &str,
        name: &str,
        slot: &str,
        sink: &str,
        target: u64,
        events: u64,
    ) -> Result<Measured, String> {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-bench-")
            .tempdir()
            .map_err(|err| format!("temp dir: {err}"))?;
        let log_path = dir.path().join("relay.log");
        let mut command = self.relay_command(slot, sink, dir.path())?;
        let start_lsn = confirmed_flush_lsn(&mut self.admin, slot);
        let mut outage = match (self.outage, self.kafka) {
            (Some(length), Some(broker)) => Some(Outage::new(broker, length)),
            (Some(_), None) => return Err("an outage needs the Kafka broker".into()),
            (None, _) => None,
        };

        let window = self.open();
        let mut relay = KillOnDrop(
            command
                .spawn()
                .map_err(|err| format!("starting {}: {err}", self.relay_bin.display()))?,
        );
        let pid = relay.0.id();
        let mut exited = None;
        let acknowledged = poll_until(self.timeout, || {
            if let Ok(Some(status)) = relay.0.try_wait() {
                exited = Some(status);
                return Some(false);
            }
            let confirmed = confirmed_flush_lsn(&mut self.admin, slot);
            let outage_over = outage.as_mut().map_or(true, |outage| {
                outage.step(confirmed > start_lsn, confirmed.saturating_sub(start_lsn))
            });
            // A load acknowledged before the broker was frozen ends the run too (the
            // note says so).
            let never_frozen = outage.as_ref().is_some_and(|o| !o.frozen());
            (confirmed >= target && (outage_over || never_frozen)).then_some(true)
        });
        let seconds = window.started.elapsed().as_secs_f64();
        if acknowledged != Some(true) {
            let why = match exited {
                Some(status) => format!("the relay exited ({status})"),
                None => format!(
                    "slot {slot} not acknowledged past the load after {:?}",
                    self.timeout
                ),
            };
            return Err(format!("{why}; relay log tail:\n{}", log_tail(&log_path)));
        }
        let process_cpu = procstat::process_cpu(pid);
        let peak_rss = procstat::peak_rss_kib(pid);
        relay.stop(Duration::from_secs(60))?;
        let costs = self.close(&window);
        let mut notes = Vec::new();
        if let Some(outage) = outage.take() {
            notes.push(outage.note(target.saturating_sub(start_lsn)));
        }
        match stopped_events(&log_path) {
            Some(seen) if seen == events => {}
            Some(seen) => notes.push(format!(
                "the relay reported events={seen}, expected {events}"
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
        Ok(self.measured(
            id,
            name,
            events,
            seconds,
            process_cpu,
            peak_rss,
            &costs,
            notes,
        ))
    }

    /// The relay with its default settings on `slot` into `sink`, its config and JSON log
    /// (`relay.log`) in `dir`, stdout into /dev/null; not started yet.
    pub(crate) fn relay_command(
        &self,
        slot: &str,
        sink: &str,
        dir: &Path,
    ) -> Result<Command, String> {
        self.relay_command_with(&self.relay_config(slot, sink)?, dir)
    }

    /// [`Bench::relay_command`] with the config `config`.
    pub(crate) fn relay_command_with(&self, config: &str, dir: &Path) -> Result<Command, String> {
        let config_path = dir.join("relay.toml");
        std::fs::write(&config_path, config).map_err(|err| format!("writing config: {err}"))?;
        let log = std::fs::File::create(dir.join("relay.log"))
            .map_err(|err| format!("relay log: {err}"))?;
        let mut command = Command::new(&self.relay_bin);
        command
            .args(["--log-format", "json", "run", "--config"])
            .arg(&config_path)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        Ok(command)
    }

    /// The relay's config: defaults everywhere (no `status_interval_ms`, no Kafka
    /// property), only what names the server, slot, publication and broker. `sink` is
    /// `stdout`, `kafka`, or one of the exactly-once variants of the Kafka sink:
    /// `kafka-eos` (`exactly_once = true`, batched by the default `transaction_ms`) and
    /// `kafka-eos-per-txn` (`transaction_ms = 1`: about one Kafka transaction per
    /// PostgreSQL transaction).
    fn relay_config(&self, slot: &str, sink: &str) -> Result<String, String> {
        let (kind, exactly_once) = match sink {
            "kafka-eos" => ("kafka", "exactly_once = true\n"),
            "kafka-eos-per-txn" => ("kafka", "exactly_once = true\ntransaction_ms = 1\n"),
            other => (other, ""),
        };
        let (publication, source) = if self.table_less {
            (
                setup::MESSAGES_PUBLICATION,
                format!(
                    "[outbox]\nenabled = false\n[messages]\nprefixes = {:?}\n",
                    setup::AGGREGATE_TYPES
                ),
            )
        } else {
            (
                PUBLICATION,
                "[outbox]\ntable = \"public.outbox\"\n".to_owned(),
            )
        };
        let mut config = format!(
            "[postgres]\nurl = \"{}\"\nslot = \"{slot}\"\npublication = \"{publication}\"\n\
             {source}[sink]\ntype = \"{kind}\"\n",
            self.pg.url("postgres", None, DATABASE)
        );
        if kind == "kafka" {
            let kafka = self.kafka.ok_or("no Kafka broker for the kafka sink")?;
            config.push_str(&format!(
                "[kafka]\nbrokers = \"{}\"\n{exactly_once}",
                kafka.bootstrap()
            ));
        }
        Ok(config)
    }
}

/// `confirmed_flush_lsn` of `slot`, 0 when it has none (or the query failed).
pub(crate) fn confirmed_flush_lsn(client: &mut Client, slot: &str) -> u64 {
    client
        .query_opt(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .ok()
        .flatten()
        .and_then(|row| row.get::<_, Option<String>>(0))
        .map_or(0, |lsn| outbox_relay_harness::lsn_to_u64(&lsn))
}

/// A child process killed (and reaped) on drop unless stopped first.
pub(crate) struct KillOnDrop(pub(crate) Child);

impl KillOnDrop {
    /// SIGTERM (the relay drains and sends a final status update), then waits.
    pub(crate) fn stop(&mut self, timeout: Duration) -> Result<(), String> {
        self.terminate();
        self.wait_stopped(timeout)
    }

    /// SIGTERM without waiting (several relays asked to stop at once). Once only: a
    /// second signal makes the relay exit without draining.
    pub(crate) fn terminate(&self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    }

    /// Waits for the relay to exit after [`KillOnDrop::terminate`].
    pub(crate) fn wait_stopped(&mut self, timeout: Duration) -> Result<(), String> {
        match wait_child(&mut self.0, timeout) {
            Some(_) => Ok(()),
            None => Err(format!(
                "the relay did not stop within {timeout:?} after SIGTERM"
            )),
        }
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A field of a JSON log line (`--log-format json` flattens the event's fields into the
/// line; tracing-subscriber's default nests them under `fields`).
fn field<'a>(line: &'a serde_json::Value, key: &str) -> &'a serde_json::Value {
    match &line[key] {
        serde_json::Value::Null => &line["fields"][key],
        value => value,
    }
}

/// The relay's JSON log lines.
fn log_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// `events` of the relay's "stopped" line.
pub(crate) fn stopped_events(path: &Path) -> Option<u64> {
    log_lines(path)
        .iter()
        .rev()
        .find(|line| field(line, "message") == "stopped")
        .and_then(|line| field(line, "events").as_u64())
}

pub(crate) fn warning_lines(path: &Path) -> Vec<String> {
    log_lines(path)
        .into_iter()
        .filter(|line| matches!(line["level"].as_str(), Some("WARN" | "ERROR")))
        .map(|line| format!("{} {}", field(&line, "level"), field(&line, "message")))
        .collect()
}

pub(crate) fn log_tail(path: &Path) -> String {
    outbox_relay_harness::wait::tail_lines(&std::fs::read_to_string(path).unwrap_or_default(), 20)
}
