//! The results: one markdown table on stdout (a row per contender, ratios to the ceiling
//! and to the 1-worker polling relay) and the same as JSON, with the machine's details.

use std::fmt::Write as _;

use crate::contenders::Measured;
use crate::latency::LatencyRun;
use crate::setup::Load;

/// The writer rate whose latency the main table shows (issue 11's reference rate).
pub const REFERENCE_RATE: u32 = 5_000;

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

#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub smoke: bool,
    pub machine: Machine,
    pub settings: serde_json::Value,
    pub load: Load,
    pub contenders: Vec<Row>,
    pub latency: Vec<LatencyRun>,
    /// (j)'s figures beside its rows' ([`crate::many`]).
    pub many: Vec<crate::many::ManyRun>,
    /// (k)'s set-up and runs ([`crate::standby`]), when it ran.
    pub standby: Option<crate::standby::StandbyReport>,
    pub targets: Vec<Target>,
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
    pub ratio_to_debezium: Option<f64>,
    /// Commit → consumer at [`REFERENCE_RATE`], when this contender's latency was measured.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub process_cpu_s_per_million: f64,
    pub postgres_cpu_us_per_event: f64,
    pub wal_bytes_per_event: f64,
}

/// The latency contender whose figures go in a throughput row.
fn latency_of(row_id: &str) -> Option<&'static str> {
    match row_id {
        "relay-kafka" => Some("relay"),
        "debezium" => Some("debezium"),
        "polling-1" => Some("polling-100ms"),
        _ => None,
    }
}

fn at_reference_rate<'a>(latency: &'a [LatencyRun], contender: &str) -> Option<&'a LatencyRun> {
    latency.iter().find(|run| {
        run.contender == contender && run.rate == REFERENCE_RATE && !run.one_per_transaction
    })
}

/// The contenders that read a load of their own ((g), (h), (i), (j), (k)): no ratios,
/// not in the throughput chart.
fn own_load(id: &str) -> bool {
    matches!(id, "relay-large" | "relay-messages")
        || id.contains("-outage-")
        || id.starts_with("many-")
        || id.starts_with("standby-")
}

pub fn rows(measured: &[Measured], latency: &[LatencyRun]) -> Vec<Row> {
    let rate = |id: &str| {
        measured
            .iter()
            .find(|m| m.id == id)
            .map(Measured::events_per_second)
    };
    let (ceiling, polling, debezium) = (rate("ceiling"), rate("polling-1"), rate("debezium"));
    measured
        .iter()
        .map(|m| {
            let events = m.events.max(1) as f64;
            // Ratios compare readers of the same load; (g), (h) and (i) have their own.
            let same_load = !own_load(&m.id);
            Row {
                events_per_second: m.events_per_second(),
                ratio_to_ceiling: ceiling
                    .filter(|_| same_load)
                    .map(|c| m.events_per_second() / c),
                ratio_to_polling_1: polling
                    .filter(|_| same_load)
                    .map(|p| m.events_per_second() / p),
                ratio_to_debezium: debezium
                    .filter(|_| same_load)
                    .map(|d| m.events_per_second() / d),
                p50_ms: latency_of(&m.id)
                    .and_then(|c| at_reference_rate(latency, c))
                    .and_then(|run| run.p50_ms),
                p99_ms: latency_of(&m.id)
                    .and_then(|c| at_reference_rate(latency, c))
                    .and_then(|run| run.p99_ms),
                process_cpu_s_per_million: m.process_cpu_s / events * 1e6,
                postgres_cpu_us_per_event: m.postgres_cpu_s / events * 1e6,
                wal_bytes_per_event: m.wal_bytes as f64 / events,
                measured: m.clone(),
            }
        })
        .collect()
}

/// One of issue 11's targets, judged on this run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Target {
    pub target: String,
    pub measured: String,
    /// `None` when this run did not measure what the target needs.
    pub met: Option<bool>,
}

/// Issue 11's targets for this 2-core machine, as ratios from one run.
pub fn targets(rows: &[Row], latency: &[LatencyRun]) -> Vec<Target> {
    let row = |id: &str| rows.iter().find(|r| r.measured.id == id);
    let relay = row("relay-kafka");
    let mut targets = Vec::new();
    let mut judge = |target: &str, value: Option<(String, bool)>| {
        targets.push(Target {
            target: target.to_owned(),
            measured: value
                .as_ref()
                .map_or_else(|| "not measured".to_owned(), |(text, _)| text.clone()),
            met: value.map(|(_, met)| met),
        });
    };
    judge(
        "relay → Kafka ≥ 0.9× the ceiling",
        relay
            .and_then(|r| r.ratio_to_ceiling)
            .map(|x| (format!("{x:.2}×"), x >= 0.9)),
    );
    judge(
        "relay → Kafka ≥ 2× Debezium's throughput",
        relay
            .and_then(|r| r.ratio_to_debezium)
            .map(|x| (format!("{x:.2}×"), x >= 2.0)),
    );
    let rss = |r: &Row| r.measured.peak_rss_kib.map(|kib| kib as f64);
    judge(
        "… at ≤ 1/20 of Debezium's memory (peak RSS)",
        relay
            .and_then(rss)
            .zip(row("debezium").and_then(rss))
            .map(|(ours, theirs)| {
                (
                    format!(
                        "1/{:.0} ({:.0} MiB against {:.0} MiB)",
                        theirs / ours,
                        ours / 1024.0,
                        theirs / 1024.0
                    ),
                    ours * 20.0 <= theirs,
                )
            }),
    );
    judge(
        "relay → Kafka ≥ 10× the 1-worker polling relay",
        relay
            .and_then(|r| r.ratio_to_polling_1)
            .map(|x| (format!("{x:.1}×"), x >= 10.0)),
    );
    let p99 = |contender: &str| at_reference_rate(latency, contender).and_then(|run| run.p99_ms);
    judge(
        "the relay adds ≤ 1 ms p99 over the plain producer at 5k events/s",
        p99("relay").zip(p99("producer")).map(|(relay, floor)| {
            (
                format!(
                    "+{:.1} ms ({relay:.1} ms against {floor:.1} ms)",
                    relay - floor
                ),
                relay - floor <= 1.0,
            )
        }),
    );
    judge(
        "peak RSS ≤ 64 MB in the 1,000,000-row transaction",
        row("relay-large")
            .filter(|r| r.measured.events >= 1_000_000)
            .and_then(rss)
            .map(|kib| {
                (
                    format!("{:.1} MB", kib * 1024.0 / 1e6),
                    kib * 1024.0 <= 64e6,
                )
            }),
    );
    for (id, what) in [("relay-outage-4k", "4 KB"), ("relay-outage-256k", "256 KB")] {
        judge(
            &format!("peak RSS ≤ 64 MB through a broker outage, a backlog of {what} payloads"),
            row(id).and_then(rss).map(|kib| {
                (
                    format!("{:.1} MB", kib * 1024.0 / 1e6),
                    kib * 1024.0 <= 64e6,
                )
            }),
        );
    }
    // Two runs of each binary (relay, baseline, baseline, relay): the mean rate of each.
    let mean_rate = |ids: [&str; 2]| {
        let rates: Vec<f64> = ids
            .iter()
            .filter_map(|id| row(id).map(|r| r.events_per_second))
            .collect();
        (rates.len() == 2).then(|| (rates[0] + rates[1]) / 2.0)
    };
    if let Some(baseline) = mean_rate(["baseline-kafka", "baseline-kafka-2"]) {
        judge(
            "relay → Kafka on the standard load: no loss of throughput against the baseline binary (mean of two runs each)",
            mean_rate(["relay-kafka", "relay-kafka-2"]).map(|ours| {
                (
                    format!("{:.2}× ({ours:.0} against {baseline:.0} events/s)", ours / baseline),
                    // Within the run-to-run noise of one machine.
                    ours >= 0.95 * baseline,
                )
            }),
        );
    }
    judge(
        "relay CPU ≤ 5 s per million events",
        relay.map(|r| {
            (
                format!("{:.2} s", r.process_cpu_s_per_million),
                r.process_cpu_s_per_million <= 5.0,
            )
        }),
    );
    targets
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
        "| contender | events | time | events/s | × ceiling | × polling (1 worker) | × Debezium | p50 / p99 at 5k/s | peak RSS | CPU s / 1M events | PostgreSQL CPU µs / event | WAL bytes / event | dead tuples |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in &report.contenders {
        let r = &row.measured;
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} s | **{:.0}** | {} | {} | {} | {} | {} | {:.2} | {:.1} | {:.1} | {} |",
            r.name,
            r.events,
            r.seconds,
            row.events_per_second,
            ratio(row.ratio_to_ceiling),
            ratio(row.ratio_to_polling_1),
            ratio(row.ratio_to_debezium),
            match (row.p50_ms, row.p99_ms) {
                (Some(p50), Some(p99)) => format!("{p50:.1} / {p99:.1} ms"),
                _ => "–".to_owned(),
            },
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
    out.push_str(&crate::many::markdown(&report.many, &report.contenders));
    out.push_str(&crate::standby::markdown(
        report.standby.as_ref(),
        &report.contenders,
    ));
    if !report.latency.is_empty() {
        out.push_str(
            "\nLatency, commit → record read by a consumer (writers at fixed rates):\n\n\
             | contender | writer | rate asked | written/s | written | received | p50 | p99 | max |\n\
             |---|---|---|---|---|---|---|---|---|\n",
        );
        let ms = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1} ms"));
        for run in &report.latency {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
                run.name,
                if run.one_per_transaction {
                    "one event per transaction"
                } else {
                    "a transaction every 10 ms"
                },
                run.rate,
                run.written_per_second,
                run.written,
                run.received,
                ms(run.p50_ms),
                ms(run.p99_ms),
                ms(run.max_ms),
            );
        }
    }
    if !report.targets.is_empty() {
        out.push_str("\nTargets (issue 11, this run):\n\n| target | measured | |\n|---|---|---|\n");
        for target in &report.targets {
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                target.target,
                target.measured,
                match target.met {
                    Some(true) => "met",
                    Some(false) => "**missed**",
                    None => "–",
                }
            );
        }
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

/// Short labels: five groups share the latency panel's width.
fn latency_label(contender: &str) -> String {
    match contender {
        "producer" => "plain producer",
        "debezium" => "Debezium",
        "polling-100ms" => "polling 100 ms",
        "polling-1s" => "polling 1 s",
        other => other,
    }
    .to_owned()
}

/// The chart's inputs from a results.json (`--redraw`); `None` when it lacks them.
pub fn chart_from_json(
    report: &serde_json::Value,
) -> Option<(
    String,
    Vec<outbox_relay_harness::chart::Throughput>,
    Vec<outbox_relay_harness::chart::Latency>,
)> {
    let machine = &report["machine"];
    let title = format!(
        "outbox-relay side by side{}: {} events; relay {}; PostgreSQL {}; {} CPUs ({})",
        if report["smoke"].as_bool()? {
            " (SMOKE)"
        } else {
            ""
        },
        report["load"]["events"].as_u64()?,
        machine["relay_commit"].as_str()?,
        machine["postgres_version"].as_str()?,
        machine["cpus"].as_u64()?,
        machine["cpu_model"].as_str()?,
    );
    let throughput = report["contenders"]
        .as_array()?
        .iter()
        // One bar per contender: not the baseline binary's rows nor the repeated run.
        .filter(|row| {
            row["id"].as_str().is_some_and(|id| {
                !own_load(id) && !id.starts_with("baseline") && !id.ends_with("-2")
            })
        })
        .map(|row| {
            Some(outbox_relay_harness::chart::Throughput {
                name: row["name"].as_str()?.to_owned(),
                events_per_second: row["events_per_second"].as_f64()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    // The chart shows the batched writer's runs (one bar per contender and rate).
    let latency = report["latency"]
        .as_array()?
        .iter()
        .filter(|run| run["one_per_transaction"].as_bool() != Some(true))
        .map(|run| {
            Some(outbox_relay_harness::chart::Latency {
                contender: latency_label(run["contender"].as_str()?),
                rate: u32::try_from(run["rate"].as_u64()?).ok()?,
                p50_ms: run["p50_ms"].as_f64(),
                p99_ms: run["p99_ms"].as_f64(),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some((title, throughput, latency))
}
