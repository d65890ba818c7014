//! (j) Many outboxes (issue 21): N outbox tables (a schema per tenant) through ONE relay
//! with one slot and one publication of them all, against N relays with a slot and a
//! publication each, on the same WAL.
//!
//! ```text
//! set-up   tenant_1.outbox … tenant_N.outbox (LIKE public.outbox INCLUDING ALL), each
//!          schema's outbox_relay_state (the relay's own DDL, as for public); publications
//!          bench_many (FOR TABLE all N) and bench_many_1 … bench_many_N (one table each)
//! slots    bench_many, bench_many_1 … bench_many_N: created before the load
//! load     --events events in transactions of --txn-sizes, each transaction into one
//!          table, the tables in turn (transaction k into tenant_(1 + k mod N)): every
//!          WAL sender decodes every table's changes; CHECKPOINT
//! one      relay → Kafka with defaults, [[outbox]] × N, on bench_many
//! each     N relays → Kafka with defaults, one table each, all started at once
//! until    every slot of the contender is acknowledged past the load
//! ```
//!
//! Per contender: the time, PostgreSQL's CPU (every WAL sender, as for the others), the
//! most WAL senders seen at once (`pg_stat_replication`), the WAL its slots retained
//! when it started (the sum of `pg_current_wal_lsn() - restart_lsn`: what each slot
//! holds back; the files themselves are shared, so the disk holds the largest), the
//! relays' CPU summed, their peak RSS summed and the largest one (`many_run.rs`). The
//! one relay runs first, the relays after it: the order of runs on one WAL has moved
//! figures before (docs/benchmarks.md), which one run cannot tell from the contenders.

use std::fmt::Write as _;
use std::time::Duration;

use outbox_relay::pg::sql::QualifiedName;
use outbox_relay::pg::state;

use crate::contenders::{Bench, Measured};
use crate::many_run::{relays, RelaySpec};
use crate::report::Row;
use crate::setup::{self, DATABASE};

pub use crate::many_run::ManyRun;

/// Row ids of the two contenders.
pub const ONE_RELAY: &str = "many-one-relay";
pub const RELAY_EACH: &str = "many-relay-each";

/// What (j) needs from the command line.
pub struct ManyPlan {
    pub tables: u32,
    pub events: u64,
    pub txn_sizes: Vec<u32>,
    pub pad: u32,
    pub idle_max_busy: f64,
    pub idle_wait: Duration,
}

fn schema(table: u32) -> String {
    format!("tenant_{table}")
}

fn outbox_of(table: u32) -> String {
    format!("{}.outbox", schema(table))
}

/// The one relay's slot and publication, and those of the relay of table `i`.
const ALL: &str = "bench_many";
fn own(table: u32) -> String {
    format!("bench_many_{table}")
}

/// The load's write: the standard load's rows, transaction `txn` into table
/// `1 + txn mod tables` (only numbers pasted in; `%%` is format()'s `%`).
fn load_write(tables: u32) -> String {
    format!(
        "EXECUTE format('INSERT INTO %I.outbox (aggregatetype, aggregateid, type, payload)
                 SELECT (ARRAY[''order'', ''customer'', ''payment''])[1 + g %% 3], ''agg-'' || (g %% 10000),
                        ''Created'',
                        jsonb_build_object(''seq'', g, ''customer'', ''customer-'' || (g %% 1000),
                                           ''total'', (g %% 1000) * 1.5, ''note'', repeat(''x'', $3))
                 FROM generate_series($1 + 1, $1 + $2) AS g', 'tenant_' || (1 + txn % {tables}))
                USING done, n, pad;"
    )
}

/// The tables, their state tables, the publications and the load procedure.
fn set_up(bench: &mut Bench<'_>, tables: u32) -> Result<(), String> {
    let mut sql = String::new();
    for i in 1..=tables {
        let state_table = QualifiedName {
            schema: schema(i),
            name: state::DEFAULT_STATE_TABLE.into(),
        };
        let _ = write!(
            sql,
            "CREATE SCHEMA {schema};
             CREATE TABLE {outbox} (LIKE public.outbox INCLUDING ALL);
             {state};
             CREATE PUBLICATION {publication} FOR TABLE {outbox} WITH (publish = 'insert');\n",
            schema = schema(i),
            outbox = outbox_of(i),
            state = state::create_table_sql(&state_table),
            publication = own(i),
        );
    }
    let all: Vec<String> = (1..=tables).map(outbox_of).collect();
    let _ = write!(
        sql,
        "CREATE PUBLICATION {ALL} FOR TABLE {} WITH (publish = 'insert');\n{}",
        all.join(", "),
        setup::load_procedure("bench_load_many", &load_write(tables))
    );
    bench
        .admin
        .batch_execute(&sql)
        .map_err(|err| format!("setting up {tables} outbox tables: {err}"))
}

/// The relay's config with defaults: the server, slot, publication, broker and tables.
fn config(bench: &Bench<'_>, slot: &str, outboxes: &str) -> Result<String, String> {
    let kafka = bench.kafka.ok_or("(j) needs the Kafka broker")?;
    Ok(format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{slot}\"\npublication = \"{slot}\"\n{outboxes}\
         [sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"{}\"\n",
        bench.pg.url("postgres", None, DATABASE),
        kafka.bootstrap()
    ))
}

/// (j): set-up, slots, load, then the one relay and the relays, one table each.
pub fn run(
    bench: &mut Bench<'_>,
    plan: &ManyPlan,
) -> Result<(Vec<Measured>, Vec<ManyRun>, String), String> {
    let tables = plan.tables;
    set_up(bench, tables)?;
    setup::create_slot(&mut bench.admin, ALL);
    for i in 1..=tables {
        setup::create_slot(&mut bench.admin, &own(i));
    }
    crate::log(&format!(
        "loading {} events into {tables} outbox tables, transactions of {:?}, the tables in turn",
        plan.events, plan.txn_sizes
    ));
    let load = setup::load_with(
        &mut bench.admin,
        "bench_load_many",
        plan.events,
        &plan.txn_sizes,
        plan.pad,
    );
    let per_table: Vec<u64> = (1..=tables)
        .map(|i| {
            let sql = format!("SELECT count(*) FROM {}", outbox_of(i));
            setup::first_value(&mut bench.admin, &sql)
                .parse()
                .unwrap_or(0)
        })
        .collect();
    let load_note = format!(
        "(j) reads its own load: {} events into {tables} tables (each transaction into one, \
         the tables in turn; {}–{} events per table) in {:.1} s, {:.0} WAL bytes per event",
        plan.events,
        per_table.iter().min().unwrap_or(&0),
        per_table.iter().max().unwrap_or(&0),
        load.seconds,
        load.wal_bytes as f64 / plan.events.max(1) as f64
    );

    let entries: String = (1..=tables)
        .map(|i| format!("[[outbox]]\ntable = \"{}\"\n", outbox_of(i)))
        .collect();
    let one = vec![RelaySpec {
        slot: ALL.to_owned(),
        config: config(
            bench,
            ALL,
            &format!("[outbox_defaults]\ntopic = \"outbox.event.${{routedByValue}}\"\n{entries}"),
        )?,
        events: plan.events,
    }];
    let each = (1..=tables)
        .zip(&per_table)
        .map(|(i, &events)| {
            Ok(RelaySpec {
                slot: own(i),
                config: config(
                    bench,
                    &own(i),
                    &format!("[outbox]\ntable = \"{}\"\n", outbox_of(i)),
                )?,
                events,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;

    let mut measured = Vec::new();
    let mut runs = Vec::new();
    for (id, name, specs) in [
        (
            ONE_RELAY,
            format!("one relay → Kafka, {tables} tables ([[outbox]] × {tables}), one slot"),
            one,
        ),
        (
            RELAY_EACH,
            format!("{tables} relays → Kafka, one table each, {tables} slots (RSS: sum)"),
            each,
        ),
    ] {
        bench.busy_before_pct = setup::wait_quiet(plan.idle_max_busy, plan.idle_wait);
        let result = relays(bench, id, &name, &specs, load.target, plan.events, tables);
        for spec in &specs {
            setup::drop_slot(&mut bench.admin, &spec.slot);
        }
        let (m, run) = result.map_err(|err| format!("(j) {name}: {err}"))?;
        crate::log(&format!(
            "(j) {name}: {:.2} s, {:.0} events/s, {} WAL senders",
            m.seconds,
            m.events_per_second(),
            run.wal_senders
        ));
        measured.push(m);
        runs.push(run);
    }
    Ok((measured, runs, load_note))
}
fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(
        || "–".to_owned(),
        |kib| format!("{:.1} MiB", kib as f64 / 1024.0),
    )
}

/// The table of (j) under the main one, with (b)'s row of the same run for reference.
pub fn markdown(runs: &[ManyRun], rows: &[Row]) -> String {
    if runs.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nMany outboxes (j): {} tables, the same load through one relay or a relay per table \
         (every slot created before that load):\n\n\
         | contender | relays | WAL senders | time (first / last slot) | events/s | PostgreSQL CPU µs / event | WAL retained at start: sum over its slots (largest) | relay CPU s / 1M events | peak RSS: sum (largest) | busy before |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        runs[0].tables
    );
    if let Some(b) = rows.iter().find(|row| row.measured.id == "relay-kafka") {
        let m = &b.measured;
        let _ = writeln!(
            out,
            "| (b) relay → Kafka, one table, the standard load | 1 | 1 | {:.2} s | {:.0} | {:.1} | – | {:.2} | {} | {:.0} % |",
            m.seconds,
            b.events_per_second,
            b.postgres_cpu_us_per_event,
            b.process_cpu_s_per_million,
            mib(m.peak_rss_kib),
            m.busy_before_pct
        );
    }
    for run in runs {
        let Some(row) = rows.iter().find(|row| row.measured.id == run.id) else {
            continue;
        };
        let m = &row.measured;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} s ({:.2} / {:.2} s) | **{:.0}** | {:.1} | {:.1} MB ({:.1} MB) | {:.2} | {} ({}) | {:.0} % |",
            m.name,
            run.relays,
            run.wal_senders,
            m.seconds,
            run.first_slot_s,
            run.last_slot_s,
            row.events_per_second,
            row.postgres_cpu_us_per_event,
            run.wal_retained_sum_bytes as f64 / 1e6,
            run.wal_retained_max_bytes as f64 / 1e6,
            row.process_cpu_s_per_million,
            mib(run.peak_rss_sum_kib),
            mib(run.peak_rss_max_kib),
            m.busy_before_pct
        );
    }
    out
}
