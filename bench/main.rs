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
//! slots    bench_ceiling, bench_kafka, bench_eos, bench_eos_per_txn, bench_stdout:
//!          created before the load
//! load     N events, transactions of 1, 10, 100, 1,000 rows; CHECKPOINT
//! (a)      pg_recvlogical on bench_ceiling                  the ceiling
//! (b)      relay → Kafka on bench_kafka, default settings
//! (b2)     relay → Kafka exactly-once on bench_eos (transaction_ms = 100, the default)
//! (b3)     relay → Kafka exactly-once on bench_eos_per_txn (transaction_ms = 1: about
//!          one Kafka transaction per PostgreSQL transaction)
//! (c)      relay → stdout (/dev/null) on bench_stdout
//! (d)      Debezium (Kafka Connect + Outbox Event Router) on bench_debezium
//! (e)      polling relay, 1 and 4 workers, each on a fresh copy of the loaded table
//! (g)      relay → Kafka on bench_large, one transaction of 1,000,000 rows
//! (h)      the table-less outbox: the same events written with pg_logical_emit_message
//!          (its own load, on bench_messages), relay → Kafka; WAL per event of both loads
//! (i)      a backlog through a broker outage: 100,000 x ~4 KB and 2,000 x ~256 KB rows
//!          on slots of their own, the broker frozen 20 s; peak RSS (bench/outage.rs)
//! (j)      many outboxes: the load's events spread over 20 tables (tenant_i.outbox, its
//!          own load, the tables in turn), read by ONE relay ([[outbox]] × 20, one slot)
//!          and by 20 relays at once (a table, slot and publication each), both sets of
//!          slots created before that load (bench/many.rs)
//! (k)      decoding on a standby: a primary of PostgreSQL 16+ and a hot standby of
//!          their own, the load on the primary, then the relay → Kafka decoding on the
//!          primary and on the standby (primary_url), a slot on each created before the
//!          load; the primary's and the standby's CPU per event (bench/standby.rs)
//! (f)      latency: writers at 1k, 5k, 20k events/s for 30 s each, commit → consumer,
//!          for a plain producer, the relay, Debezium, the polling relay (100 ms, 1 s)
//! out      the markdown table on stdout; results.json and chart.png in --out-dir
//! ```
//!
//! Each contender waits first until the machine is quiet (`--idle-max-busy`), and one
//! that started on a busy machine is flagged under the table.
//!
//! The options are resolved and checked first (`plan.rs`), before anything starts; the
//! table, results.json and chart.png are written by `output.rs`.

mod contenders;
mod debezium;
mod latency;
mod latency_runs;
mod many;
mod many_run;
mod options;
mod outage;
mod output;
mod plan;
mod polling;
mod report;
mod setup;
mod standby;
mod standby_run;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use outbox_relay_harness::procstat;

use contenders::{Bench, Measured};
use latency_runs::LatencyPlan;
use options::Options;
use plan::Plan;
use report::Report;

/// The contenders a run can select (`--only`).
const CONTENDERS: &[&str] = &[
    "ceiling", "kafka", "eos", "stdout", "debezium", "polling", "large", "messages", "outage",
    "many", "standby", "latency",
];

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
    let outcome = match &options.redraw {
        Some(results) => output::redraw(results, &options),
        None => run(&options),
    };
    match outcome {
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
    let plan = Plan::new(options)?;
    let Plan {
        smoke,
        events,
        large_txn,
        idle_wait,
        latency_seconds,
        ..
    } = plan;
    let (txn_sizes, outage_plan, relay_bin) = (&plan.txn_sizes, &plan.outage, &plan.relay_bin);
    let (latency_rates, latency_single_rates) = (&plan.latency_rates, &plan.latency_single_rates);
    let (latency_contenders, out_dir) = (&plan.latency_contenders, &plan.out_dir);
    let selected = |name: &str| plan.selected(name);
    let started = Instant::now();
    let busy_before_run = procstat::busy_percent(Duration::from_secs(if smoke { 1 } else { 3 }));

    log("starting PostgreSQL");
    let pg = setup::start_postgres(plan.extra_slots(), None);
    let kafka = plan.needs_kafka().then(|| {
        log("starting Apache Kafka");
        setup::start_kafka()
    });
    let mut admin = pg.client_db(setup::DATABASE);
    let postgres_version = setup::first_value(&mut admin, "SHOW server_version");

    // Every slot exists before the load: each contender reads the same WAL.
    let slots: Vec<(&str, &str)> = [
        ("ceiling", "bench_ceiling"),
        ("kafka", "bench_kafka"),
        ("eos", "bench_eos"),
        ("eos", "bench_eos_per_txn"),
        ("stdout", "bench_stdout"),
        ("debezium", "bench_debezium"),
    ]
    .into_iter()
    .filter(|(name, _)| selected(name))
    .collect();
    for (_, slot) in &slots {
        setup::create_slot(&mut admin, slot);
    }
    // With a baseline binary, (b) runs in the order relay, baseline, baseline, relay
    // (the first reader of a fresh WAL is slower, whichever binary it is), each on a
    // slot of its own.
    let baseline_kafka = options.baseline_bin.is_some() && selected("kafka");
    const BASELINE_SLOTS: [&str; 3] = [
        "bench_kafka_baseline",
        "bench_kafka_baseline_2",
        "bench_kafka_2",
    ];
    if baseline_kafka {
        for slot in BASELINE_SLOTS {
            setup::create_slot(&mut admin, slot);
        }
    }
    log(&format!(
        "loading {events} events in transactions of {txn_sizes:?}"
    ));
    let load = setup::load(&mut admin, events, txn_sizes, options.payload_pad);
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
        table_less: false,
        outage: None,
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
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
        let result = bench.ceiling("bench_ceiling", &load.target_lsn, events);
        setup::drop_slot(&mut bench.admin, "bench_ceiling");
        record("(a) ceiling", result, &mut measured)?;
    }
    if selected("kafka") {
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
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
    if baseline_kafka {
        let own_bin = bench.relay_bin.clone();
        let baseline_bin = options.baseline_bin.clone().unwrap_or_default();
        for ((id, name), slot) in [
            ("baseline-kafka", "relay → Kafka (defaults) [baseline]"),
            (
                "baseline-kafka-2",
                "relay → Kafka (defaults) [baseline, again]",
            ),
            ("relay-kafka-2", "relay → Kafka (defaults) [again]"),
        ]
        .into_iter()
        .zip(BASELINE_SLOTS)
        {
            bench.relay_bin = if id.starts_with("baseline") {
                baseline_bin.clone()
            } else {
                own_bin.clone()
            };
            bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
            let result = bench.relay(id, name, slot, "kafka", load.target, events);
            setup::drop_slot(&mut bench.admin, slot);
            record(&format!("(b) {name}"), result, &mut measured)?;
        }
        bench.relay_bin = own_bin;
    }
    if selected("eos") {
        // Exactly-once: batched (the default transaction_ms), then about one Kafka
        // transaction per PostgreSQL transaction (transaction_ms = 1).
        for (id, name, slot, sink, what) in [
            (
                "relay-eos",
                "relay → Kafka, exactly_once (transaction_ms = 100)",
                "bench_eos",
                "kafka-eos",
                "(b2) relay → Kafka exactly-once, batched",
            ),
            (
                "relay-eos-per-txn",
                "relay → Kafka, exactly_once, one Kafka transaction per PostgreSQL transaction",
                "bench_eos_per_txn",
                "kafka-eos-per-txn",
                "(b3) relay → Kafka exactly-once, per transaction",
            ),
        ] {
            bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
            let result = bench.relay(id, name, slot, sink, load.target, events);
            setup::drop_slot(&mut bench.admin, slot);
            record(what, result, &mut measured)?;
        }
    }
    if selected("stdout") {
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
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
    if selected("debezium") {
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
        let result = bench.debezium("bench_debezium", events);
        setup::drop_slot(&mut bench.admin, "bench_debezium");
        record("(d) Debezium", result, &mut measured)?;
    }
    if selected("polling") {
        for &workers in &options.polling_workers {
            bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
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
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
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

    if selected("messages") {
        setup::create_slot(&mut bench.admin, "bench_messages");
        log(&format!(
            "loading {events} events as pg_logical_emit_message in transactions of {txn_sizes:?}"
        ));
        let messages =
            setup::load_messages(&mut bench.admin, events, txn_sizes, options.payload_pad);
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
        bench.table_less = true;
        let result = bench.relay(
            "relay-messages",
            "relay → Kafka, table-less (pg_logical_emit_message)",
            "bench_messages",
            "kafka",
            messages.target,
            events,
        );
        bench.table_less = false;
        setup::drop_slot(&mut bench.admin, "bench_messages");
        record("(h) relay, table-less outbox", result, &mut measured)?;
        notes.push(format!(
            "relay-messages reads its own load: the same {events} events written with \
             pg_logical_emit_message (envelopes with id, key and type) in {:.1} s, {:.0} WAL \
             bytes per event, against {:.1} s and {:.0} WAL bytes per event for the outbox \
             table's load (which writes the index entries too); no ratios",
            messages.seconds,
            messages.wal_bytes as f64 / events as f64,
            load.seconds,
            load.wal_bytes as f64 / events as f64,
        ));
    }

    if selected("outage") {
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
        measured.extend(outage::run(&mut bench, outage_plan)?);
        notes.push(
            "the outage rows read their own loads (backlogs of large payloads, inserted after \
             the others ran) and include the broker's frozen seconds in their time: no ratios; \
             their peak RSS is the figure"
                .to_owned(),
        );
    }

    let mut many_runs = Vec::new();
    if selected("many") {
        let (rows, runs, load_note) = many::run(&mut bench, &plan.many)?;
        measured.extend(rows);
        many_runs = runs;
        notes.push(load_note);
    }

    let mut standby_report = None;
    if selected("standby") {
        let (rows, report) = standby::run(&bench, &plan.standby)?;
        measured.extend(rows);
        standby_report = Some(report);
    }

    let mut latency = Vec::new();
    if selected("latency") {
        bench.busy_before_pct = setup::wait_quiet(options.idle_max_busy, idle_wait);
        latency = bench
            .latency(&LatencyPlan {
                contenders: latency_contenders,
                rates: latency_rates,
                single_rates: latency_single_rates,
                seconds: latency_seconds,
                pad: options.payload_pad,
            })
            .map_err(|err| format!("(f) latency: {err}"))?;
        for run in &latency {
            if run.received < run.written {
                notes.push(format!(
                    "latency {} at {}/s{}: {} of {} events had not arrived {} s after the writer stopped",
                    run.contender,
                    run.rate,
                    if run.one_per_transaction { " (one event per transaction)" } else { "" },
                    run.written - run.received,
                    run.written,
                    latency::DRAIN.as_secs()
                ));
            }
        }
    }
    let rows = report::rows(&measured, &latency);
    let targets = report::targets(&rows, &latency);
    let report = Report {
        smoke,
        machine: report::Machine::detect(
            postgres_version,
            kafka
                .as_ref()
                .map(|_| outbox_relay_harness::kafka::kafka_version()),
            relay_bin,
            busy_before_run,
        ),
        settings: serde_json::json!({
            "events": events,
            "txn_sizes": txn_sizes,
            "large_txn": large_txn,
            "outage_events": outage_plan.events,
            "outage_large_events": outage_plan.large_events,
            "outage_s": outage_plan.length.as_secs(),
            "many_tables": plan.many.tables,
            "baseline_bin": options.baseline_bin,
            "payload_pad": options.payload_pad,
            "polling_workers": options.polling_workers,
            "polling_batch": polling::BATCH,
            "topics": setup::AGGREGATE_TYPES.iter().map(|k| setup::topic(k)).collect::<Vec<_>>(),
            "partitions": setup::PARTITIONS,
            "idle_max_busy_pct": options.idle_max_busy,
            "idle_wait_s": idle_wait.as_secs(),
        }),
        load,
        contenders: rows,
        latency,
        many: many_runs,
        standby: standby_report,
        targets,
        notes,
    };
    output::write(&report, out_dir, options.json.as_deref())?;
    log(&format!("done in {:.1} s", started.elapsed().as_secs_f64()));
    Ok(())
}
