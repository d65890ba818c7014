//! The results: one markdown table on stdout (a row per contender, ratios to the ceiling
//! and to the 1-worker polling relay) and the same as JSON, with the machine's details.

use std::fmt::Write as _;

use crate::contenders::Measured;
use crate::setup::Load;

/// Where and on what the benchmark ran.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cpus: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub postgres_version: String,
    pub kafka_version: Option<String>,
    pub relay_commit: String,
    pub relay_binary: String,
    pub busy_before_run_pct: f64,
}

impl Machine {
    pub fn detect(
        postgres_version: String,
        kafka_version: Option<String>,
        relay_binary: &std::path::Path,
        busy_before_run_pct: f64,
    ) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map_or_else(
                || "unknown".to_owned(),
                |(_, model)| model.trim().to_owned(),
            );
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        let commit = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .current_dir(outbox_relay_harness::repo_root())
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map_or_else(
                || "unknown".to_owned(),
                |out| String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            );
        Machine {
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            memory_gib: memory_kib / 1024.0 / 1024.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            postgres_version,
            kafka_version,
            relay_commit: commit,
            relay_binary: relay_binary.display().to_string(),
            busy_before_run_pct,
        }
    }
}

/// A contender that has no figures (yet), and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NotMeasured {
    pub id: String,
    pub name: String,
    pub reason: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub smoke: bool,
    pub machine: Machine,
    pub settings: serde_json::Value,
    pub load: Load,
    pub contenders: Vec<Row>,
    pub not_measured: Vec<NotMeasured>,
    pub notes: Vec<String>,
}

/// A contender's figures with the ratios.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    #[serde(flatten)]
    pub measured: Measured,
    pub events_per_second: f64,
    pub ratio_to_ceiling: Option<f64>,
    pub ratio_to_polling_1: Option<f64>,
    pub process_cpu_s_per_million: f64,
    pub postgres_cpu_us_per_event: f64,
    pub wal_bytes_per_event: f64,
}

pub fn rows(measured: &[Measured]) -> Vec<Row> {
    let rate = |id: &str| {
        measured
            .iter()
            .find(|m| m.id == id)
            .map(Measured::events_per_second)
    };
    let (ceiling, polling) = (rate("ceiling"), rate("polling-1"));
    measured
        .iter()
        .map(|m| {
            let events = m.events.max(1) as f64;
            // Ratios compare readers of the same load; (g) has its own.
            let same_load = m.id != "relay-large";
            Row {
                events_per_second: m.events_per_second(),
                ratio_to_ceiling: ceiling
                    .filter(|_| same_load)
                    .map(|c| m.events_per_second() / c),
                ratio_to_polling_1: polling
                    .filter(|_| same_load)
                    .map(|p| m.events_per_second() / p),
                process_cpu_s_per_million: m.process_cpu_s / events * 1e6,
                postgres_cpu_us_per_event: m.postgres_cpu_s / events * 1e6,
                wal_bytes_per_event: m.wal_bytes as f64 / events,
                measured: m.clone(),
            }
        })
        .collect()
}

fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |r| format!("{r:.2}×"))
}

pub fn markdown(report: &Report) -> String {
    let m = &report.machine;
    let load = &report.load;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## outbox-relay side-by-side benchmark{}\n",
        if report.smoke {
            " (SMOKE: too small to mean anything)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        out,
        "relay {} ({}); PostgreSQL {} (fsync=off, autovacuum=off); {}; {} CPUs ({}), {:.0} GiB RAM, Linux {}; machine {:.0}% busy before the run.\n",
        m.relay_commit,
        m.relay_binary,
        m.postgres_version,
        m.kafka_version
            .as_deref()
            .map_or_else(|| "no Kafka".to_owned(), |v| format!("Apache Kafka {v} (single-node KRaft)")),
        m.cpus,
        m.cpu_model,
        m.memory_gib,
        m.kernel,
        m.busy_before_run_pct,
    );
    let _ = writeln!(
        out,
        "Preloaded WAL: {} events in transactions of {:?} rows (equal share of events per size), 3 topics × 3 partitions; inserted in {:.1} s, {:.0} WAL bytes per event.\n",
        load.events,
        load.txn_sizes,
        load.seconds,
        load.wal_bytes as f64 / load.events.max(1) as f64,
    );
    out.push_str(
        "| contender | events | time | events/s | × ceiling | × polling (1 worker) | peak RSS | CPU s / 1M events | PostgreSQL CPU µs / event | WAL bytes / event | dead tuples |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in &report.contenders {
        let r = &row.measured;
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} s | **{:.0}** | {} | {} | {} | {:.2} | {:.1} | {:.1} | {} |",
            r.name,
            r.events,
            r.seconds,
            row.events_per_second,
            ratio(row.ratio_to_ceiling),
            ratio(row.ratio_to_polling_1),
            r.peak_rss_kib.map_or_else(
                || "–".to_owned(),
                |kib| format!("{:.1} MiB", kib as f64 / 1024.0)
            ),
            row.process_cpu_s_per_million,
            row.postgres_cpu_us_per_event,
            row.wal_bytes_per_event,
            r.dead_tuples
                .map_or_else(|| "–".to_owned(), |d| d.to_string()),
        );
    }
    for missing in &report.not_measured {
        let _ = writeln!(
            out,
            "| {} | {} | | | | | | | | | |",
            missing.name, missing.reason
        );
    }
    let mut notes: Vec<String> = report.notes.clone();
    for row in &report.contenders {
        let r = &row.measured;
        for note in &r.notes {
            notes.push(format!("{}: {note}", r.id));
        }
        // Ticks are 10 ms: a short window needs a floor.
        if r.other_cpu_s > 0.2 && r.other_cpu_s > 0.05 * r.seconds * m.cpus as f64 {
            notes.push(format!(
                "{}: {:.1} s of CPU went to other processes during its {:.1} s (machine {:.0}% busy before it): not a quiet measurement",
                r.id, r.other_cpu_s, r.seconds, r.busy_before_pct
            ));
        }
    }
    if !notes.is_empty() {
        out.push('\n');
        for note in notes {
            let _ = writeln!(out, "- {note}");
        }
    }
    out
}
