//! The side-by-side benchmark (issue 11): on one preloaded WAL, how fast each contender
//! gets the outbox events out, and what it costs PostgreSQL.
//!
//! ```text
//! cargo bench --bench side_by_side                       # the full run (500,000 events)
//! cargo bench --bench side_by_side -- --smoke            # every contender on ~2,000 events
//! cargo bench --bench side_by_side -- --json out.json    # the results as JSON too
//! ```
//!
//! A `cargo bench` target of the relay's package (harness = false), not a binary of the
//! harness crate: Cargo builds the relay binary with the same profile before a bench
//! target and names it in `CARGO_BIN_EXE_outbox-relay`, so the one command always runs
//! the release build of the current source. `cargo test --bench side_by_side --
//! --smoke` runs the same code against the debug build (CI's smoke: no second build).
//!
//! Order of a run, on one PostgreSQL cluster and one Kafka broker (the test harness's):
//!
//! ```text
//! set-up   outbox table (+ published_at, attempts, partial index), publication,
//!          topics outbox.event.{order,customer,payment} × 3 partitions
//! slots    bench_ceiling, bench_kafka, bench_stdout: created before the load
//! load     N events, transactions of 1, 10, 100, 1,000 rows; CHECKPOINT
//! (a)      pg_recvlogical on bench_ceiling                  the ceiling
//! (b)      relay → Kafka on bench_kafka, default settings
//! (c)      relay → stdout (/dev/null) on bench_stdout
//! (d)      Debezium: TODO hook (contenders::debezium_not_measured)
//! (e)      polling relay, 1 and 4 workers, each on a fresh copy of the loaded table
//! (f)      latency: TODO hook (contenders::latency_not_measured)
//! (g)      relay → Kafka on bench_large, one transaction of 1,000,000 rows
//! ```
//!
//! Each contender waits first until the machine is quiet (`--idle-max-busy`), and one
//! that started on a busy machine is flagged under the table.

mod contenders;
mod polling;
mod report;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use outbox_relay_harness::procstat;

use contenders::{Bench, Measured};
use report::{NotMeasured, Report};

/// The contenders a run can select (`--only`).
const CONTENDERS: &[&str] = &["ceiling", "kafka", "stdout", "polling", "large"];

#[derive(Debug, Parser)]
#[command(about = "outbox-relay side by side: the ceiling, the relay, the polling relay")]
struct Options {
    /// Every contender on a few thousand events, no idle wait: proves the benchmark
    /// works in well under a minute; its figures mean nothing.
    #[arg(long)]
    smoke: bool,
    /// Events of the preloaded WAL [default: 500000; smoke 2000].
    #[arg(long)]
    events: Option<u64>,
    /// Transaction sizes of the load, each carrying an equal share of the events
    /// [default: 1,10,100,1000; smoke 1,10,100].
    #[arg(long, value_delimiter = ',')]
    txn_sizes: Option<Vec<u32>>,
    /// Rows of the one transaction of (g) [default: 1000000; smoke 2000]; 0 skips it.
    #[arg(long)]
    large_txn: Option<u64>,
    /// Characters of filler in each payload (164 bytes of JSON in all at 100).
    #[arg(long, default_value_t = 100)]
    payload_pad: u32,
    /// Worker counts of the polling relay, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    polling_workers: Vec<usize>,
    /// Run only these contenders (ceiling, kafka, stdout, polling, large).
    #[arg(long, value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// Write the results as JSON to this file too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Before each contender, wait until the machine's CPUs are at most this % busy ...
    #[arg(long, default_value_t = 20.0)]
    idle_max_busy: f64,
    /// ... for at most this long [default: 1800; smoke 0 = do not wait].
    #[arg(long)]
    idle_wait_s: Option<u64>,
    /// Give up on a contender after this long.
    #[arg(long, default_value_t = 900)]
    timeout_s: u64,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(polling::WORKER_ARG) {
        return match polling::worker_main(&args[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("polling relay: {err}");
                ExitCode::FAILURE
            }
        };
    }
    let options = Options::parse();
    match run(&options) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("bench: error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn log(message: &str) {
    eprintln!("bench: {message}");
}

/// The relay binary: `OUTBOX_RELAY_BIN`, else the one Cargo built for this target.
fn relay_bin() -> PathBuf {
    std::env::var_os("OUTBOX_RELAY_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_outbox-relay")),
        PathBuf::from,
    )
}

fn run(options: &Options) -> Result<(), String> {
    let smoke = options.smoke;
    let events = options
        .events
        .unwrap_or(if smoke { 2_000 } else { 500_000 });
    let txn_sizes = options.txn_sizes.clone().unwrap_or_else(|| {
        if smoke {
            vec![1, 10, 100]
        } else {
            vec![1, 10, 100, 1000]
        }
    });
    if events == 0 || txn_sizes.is_empty() || txn_sizes.contains(&0) {
        return Err("--events and every --txn-sizes must be positive".into());
    }
    let large_txn = options
        .large_txn
        .unwrap_or(if smoke { 2_000 } else { 1_000_000 });
    let idle_wait =
        Duration::from_secs(options.idle_wait_s.unwrap_or(if smoke { 0 } else { 1800 }));
    let selected = |name: &str| {
        options
            .only
            .as_ref()
            .map_or(true, |only| only.iter().any(|o| o == name))
    };
    if let Some(only) = &options.only {
        if let Some(unknown) = only.iter().find(|o| !CONTENDERS.contains(&o.as_str())) {
            return Err(format!("--only {unknown}: choose from {CONTENDERS:?}"));
        }
    }
    let relay_bin = relay_bin();
    if !relay_bin.is_file() {
        return Err(format!(
            "no relay binary at {} (cargo builds it for `cargo bench --bench side_by_side`; or set OUTBOX_RELAY_BIN)",
            relay_bin.display()
        ));
    }
    let started = Instant::now();
    let busy_before_run = procstat::busy_percent(Duration::from_secs(if smoke { 1 } else { 3 }));

    log("starting PostgreSQL");
    let pg = setup::start_postgres();
    let needs_kafka =
        selected("kafka") || selected("polling") || (selected("large") && large_txn > 0);
    let kafka = needs_kafka.then(|| {
        log("starting Apache Kafka");
        setup::start_kafka()
    });
    let mut admin = pg.client_db(setup::DATABASE);
    let postgres_version = setup::first_value(&mut admin, "SHOW server_version");

    // Every slot exists before the load: each contender reads the same WAL.
    let slots: Vec<(&str, &str)> = [
        ("ceiling", "bench_ceiling"),
        ("kafka", "bench_kafka"),
        ("stdout", "bench_stdout"),
    ]
    .into_iter()
    .filter(|(name, _)| selected(name))
    .collect();
    for (_, slot) in &slots {
        setup::create_slot(&mut admin, slot);
    }
    log(&format!(
        "loading {events} events in transactions of {txn_sizes:?}"
    ));
    let load = setup::load(&mut admin, events, &txn_sizes, options.payload_pad);
    log(&format!(
        "loaded in {:.1} s, {} WAL bytes, target {}",
        load.seconds, load.wal_bytes, load.target_lsn
    ));

    let mut bench = Bench {
        pg: &pg,
        kafka: kafka.as_ref(),
        admin,
        relay_bin: relay_bin.clone(),
        timeout: Duration::from_secs(options.timeout_s),
        busy_before_pct: 0.0,
    };
    let mut measured: Vec<Measured> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let record =
        |what: &str, result: Result<Measured, String>, measured: &mut Vec<Measured>| match result {
            Ok(m) => {
                log(&format!(
                    "{what}: {:.2} s, {:.0} events/s",
                    m.seconds,
                    m.events_per_second()
                ));
                measured.push(m);
                Ok(())
            }
            Err(err) => Err(format!("{what}: {err}")),
        };

    if selected("ceiling") {
        bench.busy_before_pct = wait_quiet(options.idle_max_busy, idle_wait);
        let result = bench.ceiling("bench_ceiling", &load.target_lsn, events);
        setup::drop_slot(&mut bench.admin, "bench_ceiling");
        record("(a) ceiling", result, &mut measured)?;
    }
    if selected("kafka") {
        bench.busy_before_pct = wait_quiet(options.idle_max_busy, idle_wait);
        let result = bench.relay(
            "relay-kafka",
            "relay → Kafka (defaults)",
            "bench_kafka",
            "kafka",
            load.target,
            events,
        );
        setup::drop_slot(&mut bench.admin, "bench_kafka");
        record("(b) relay → Kafka", result, &mut measured)?;
    }
    if selected("stdout") {
        bench.busy_before_pct = wait_quiet(options.idle_max_busy, idle_wait);
        let result = bench.relay(
            "relay-stdout",
            "relay → stdout (/dev/null)",
            "bench_stdout",
            "stdout",
            load.target,
            events,
        );
        setup::drop_slot(&mut bench.admin, "bench_stdout");
        record("(c) relay → stdout", result, &mut measured)?;
    }
    if selected("polling") {
        for &workers in &options.polling_workers {
            bench.busy_before_pct = wait_quiet(options.idle_max_busy, idle_wait);
            let result = bench.polling(workers, events);
            record(
                &format!("(e) polling relay, {workers} workers"),
                result,
                &mut measured,
            )?;
        }
    }
    if selected("large") && large_txn > 0 {
        setup::create_slot(&mut bench.admin, "bench_large");
        log(&format!("loading one transaction of {large_txn} rows"));
        let large = setup::load(
            &mut bench.admin,
            large_txn,
            &[u32::try_from(large_txn).map_err(|_| "--large-txn too large")?],
            options.payload_pad,
        );
        bench.busy_before_pct = wait_quiet(options.idle_max_busy, idle_wait);
        let result = bench.relay(
            "relay-large",
            &format!("relay → Kafka, one {large_txn}-row transaction"),
            "bench_large",
            "kafka",
            large.target,
            large_txn,
        );
        setup::drop_slot(&mut bench.admin, "bench_large");
        record("(g) relay, one large transaction", result, &mut measured)?;
        notes.push(
            "relay-large reads its own load (one transaction, inserted after the others \
             ran): no ratios; its peak RSS is the figure (g) asks for"
                .to_owned(),
        );
    }

    let not_measured = vec![
        NotMeasured {
            id: "debezium".into(),
            name: "(d) Debezium (Kafka Connect + Outbox Event Router)".into(),
            reason: contenders::debezium_not_measured().into(),
        },
        NotMeasured {
            id: "latency".into(),
            name: "(f) latency, commit → consumer".into(),
            reason: contenders::latency_not_measured().into(),
        },
    ];
    let report = Report {
        smoke,
        machine: report::Machine::detect(
            postgres_version,
            kafka
                .as_ref()
                .map(|_| outbox_relay_harness::kafka::kafka_version()),
            &relay_bin,
            busy_before_run,
        ),
        settings: serde_json::json!({
            "events": events,
            "txn_sizes": txn_sizes,
            "large_txn": large_txn,
            "payload_pad": options.payload_pad,
            "polling_workers": options.polling_workers,
            "polling_batch": polling::BATCH,
            "topics": setup::AGGREGATE_TYPES.iter().map(|k| setup::topic(k)).collect::<Vec<_>>(),
            "partitions": setup::PARTITIONS,
            "idle_max_busy_pct": options.idle_max_busy,
            "idle_wait_s": idle_wait.as_secs(),
        }),
        load,
        contenders: report::rows(&measured),
        not_measured,
        notes,
    };
    print!("{}", report::markdown(&report));
    if let Some(path) = &options.json {
        let json = serde_json::to_string_pretty(&report).map_err(|err| err.to_string())?;
        std::fs::write(path, json).map_err(|err| format!("writing {}: {err}", path.display()))?;
        log(&format!("wrote {}", path.display()));
    }
    log(&format!("done in {:.1} s", started.elapsed().as_secs_f64()));
    Ok(())
}

/// Waits until the machine's CPUs are at most `max_busy` % busy (sampled over 3 s), for
/// at most `max_wait`; returns the last sample (0 when not waiting at all).
fn wait_quiet(max_busy: f64, max_wait: Duration) -> f64 {
    if max_wait.is_zero() {
        return procstat::busy_percent(Duration::from_millis(200));
    }
    let deadline = Instant::now() + max_wait;
    loop {
        let busy = procstat::busy_percent(Duration::from_secs(3));
        if busy <= max_busy || Instant::now() >= deadline {
            return busy;
        }
        log(&format!(
            "machine {busy:.0}% busy (limit {max_busy:.0}%); waiting"
        ));
        std::thread::sleep(Duration::from_secs(7));
    }
}
