//! The benchmark's PostgreSQL and Kafka: one throwaway cluster with the outbox table,
//! its publication and the load procedure; one Apache Kafka broker with the three
//! topics; the logical slots, created before the load so every contender reads the
//! same WAL.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use outbox_relay::pg::sql::QualifiedName;
use outbox_relay::pg::state;
use outbox_relay_harness::outbox::OUTBOX_SQL;
use outbox_relay_harness::procstat;

use crate::log;
use outbox_relay_harness::{create_topic, lsn_to_u64, produce, KafkaBroker, PgCluster, PgOptions};
use postgres::{Client, SimpleQueryMessage};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// Database, publication of the outbox table.
pub const DATABASE: &str = "bench";
pub const PUBLICATION: &str = "bench";
/// The routed values (`aggregatetype`), one topic each: `outbox.event.<value>`.
pub const AGGREGATE_TYPES: [&str; 3] = ["order", "customer", "payment"];
/// Partitions of each topic.
pub const PARTITIONS: i32 = 3;

/// The columns a polling relay needs (published mark, retry count) and its partial index
/// on unpublished rows. The logical contenders ignore them; they are there from the
/// start so every contender's rows (and WAL) are the same.
const POLLING_COLUMNS_SQL: &str = "
ALTER TABLE public.outbox ADD COLUMN published_at timestamptz,
                          ADD COLUMN attempts int NOT NULL DEFAULT 0;
CREATE INDEX outbox_unpublished ON public.outbox (created_at) WHERE published_at IS NULL;
";

/// The loop both loads share, as `CREATE PROCEDURE <name>(total, sizes, pad)`: `total`
/// events in rounds; each round writes `max(sizes)` events in transactions of each size
/// in turn (so every size carries the same share of events), one session, committing
/// each. `write` writes events `done + 1 ..= done + n` (`g` in `generate_series`) as
/// transaction `txn` (0, 1, 2, ...). Returns `pg_current_wal_lsn()` after the last
/// commit: every contender must get past it.
pub(crate) fn load_procedure(name: &str, write: &str) -> String {
    format!(
        "
CREATE PROCEDURE {name}(total bigint, sizes int[], pad int, INOUT target pg_lsn DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    block int := (SELECT max(s) FROM unnest(sizes) AS s);
    done bigint := 0;
    txn bigint := 0;
    size int;
    k bigint;
    n bigint;
BEGIN
    WHILE done < total LOOP
        FOREACH size IN ARRAY sizes LOOP
            k := 0;
            WHILE k < block AND done < total LOOP
                n := least(size, block - k, total - done);
                {write}
                COMMIT;
                txn := txn + 1;
                done := done + n;
                k := k + n;
            END LOOP;
        END LOOP;
    END LOOP;
    target := pg_current_wal_lsn();
END $$;
"
    )
}

/// `CALL bench_load(total, sizes, pad)`: the events as outbox rows.
const LOAD_WRITE: &str = "INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload)
                SELECT (ARRAY['order', 'customer', 'payment'])[1 + g % 3], 'agg-' || (g % 10000),
                       'Created',
                       jsonb_build_object('seq', g, 'customer', 'customer-' || (g % 1000),
                                          'total', (g % 1000) * 1.5, 'note', repeat('x', pad))
                FROM generate_series(done + 1, done + n) AS g;";

/// `CALL bench_load_messages(total, sizes, pad)`: the same events, in the same
/// transactions, written with `pg_logical_emit_message` (the table-less outbox) as
/// envelopes carrying the id, key and type the table's columns carry; prefix = the
/// routed value.
const MESSAGES_LOAD_WRITE: &str = "PERFORM pg_logical_emit_message(true, (ARRAY['order', 'customer', 'payment'])[1 + g % 3],
                       json_build_object('id', gen_random_uuid(), 'key', 'agg-' || (g % 10000),
                                         'headers', json_build_object('type', 'Created'),
                                         'payload', jsonb_build_object('seq', g, 'customer', 'customer-' || (g % 1000),
                                                                       'total', (g % 1000) * 1.5, 'note', repeat('x', pad)))::text)
                FROM generate_series(done + 1, done + n) AS g;";

/// The publication of the table-less contender: no table (messages are not filtered by
/// publication; pgoutput needs one to start).
pub const MESSAGES_PUBLICATION: &str = "bench_messages";

/// Replication slots and WAL senders the harness allows.
const HARNESS_MAX_SLOTS: u32 = 10;

/// Starts the cluster: the harness's settings (fsync=off among them) plus
/// autovacuum=off (no background work inside a measurement) and a large max_wal_size
/// (no checkpoint forced by WAL volume). `slots`: the slots (and WAL senders) a
/// contender needs at once beyond the harness's 10 ((j) has one per table): both limits
/// are raised by that much; with 0 they stay the harness's. `bindir`: the server binaries
/// when not the harness's default ((k) needs PostgreSQL 16 or later).
pub fn start_postgres(slots: u32, bindir: Option<PathBuf>) -> PgCluster {
    let mut extra_conf: Vec<(String, String)> = vec![
        ("autovacuum".into(), "off".into()),
        ("max_wal_size".into(), "8GB".into()),
    ];
    if slots > 0 {
        let limit = (HARNESS_MAX_SLOTS + slots).to_string();
        // Later -c options win over the harness's.
        extra_conf.push(("max_wal_senders".into(), limit.clone()));
        extra_conf.push(("max_replication_slots".into(), limit));
    }
    let pg = PgCluster::start_with(PgOptions {
        extra_conf,
        bindir,
        ..PgOptions::default()
    });
    pg.batch_execute(&format!("CREATE DATABASE {DATABASE}"));
    let mut client = pg.client_db(DATABASE);
    client
        .batch_execute(OUTBOX_SQL)
        .and_then(|()| client.batch_execute(POLLING_COLUMNS_SQL))
        .and_then(|()| client.batch_execute(&load_procedure("bench_load", LOAD_WRITE)))
        .and_then(|()| {
            client.batch_execute(&load_procedure("bench_load_messages", MESSAGES_LOAD_WRITE))
        })
        .and_then(|()| {
            client.batch_execute(&format!(
                "CREATE PUBLICATION {MESSAGES_PUBLICATION} WITH (publish = 'insert')"
            ))
        })
        .and_then(|()| {
            client.batch_execute(&format!(
                "CREATE PUBLICATION {PUBLICATION} FOR TABLE public.outbox \
                 WITH (publish = 'insert')"
            ))
        })
        // The relay's state table, with the relay's own DDL: created here, the first
        // relay contender does not pay catalog writes the others do not.
        .and_then(|()| {
            client.batch_execute(&state::create_table_sql(&QualifiedName {
                schema: "public".into(),
                name: state::DEFAULT_STATE_TABLE.into(),
            }))
        })
        .unwrap_or_else(|err| panic!("setting up database {DATABASE}: {err}"));
    pg
}

/// A `pgoutput` slot created now: it streams everything written after this.
pub fn create_slot(client: &mut Client, slot: &str) {
    client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .unwrap_or_else(|err| panic!("creating slot {slot}: {err}"));
}

pub fn drop_slot(client: &mut Client, slot: &str) {
    client
        .execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
             WHERE slot_name = $1",
            &[&slot],
        )
        .unwrap_or_else(|err| panic!("dropping slot {slot}: {err}"));
}

/// What a load wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Load {
    pub events: u64,
    pub txn_sizes: Vec<u32>,
    pub seconds: f64,
    /// WAL from before the first insert to after the last commit.
    pub wal_bytes: u64,
    /// `pg_current_wal_lsn()` after the last commit.
    #[serde(skip)]
    pub target: u64,
    pub target_lsn: String,
}

/// Runs `bench_load` and takes a CHECKPOINT after it (so dirty buffers of the load are
/// not written inside a contender's window).
pub fn load(client: &mut Client, events: u64, txn_sizes: &[u32], pad: u32) -> Load {
    load_with(client, "bench_load", events, txn_sizes, pad)
}

/// [`load`] of the same events as messages (`bench_load_messages`).
pub fn load_messages(client: &mut Client, events: u64, txn_sizes: &[u32], pad: u32) -> Load {
    load_with(client, "bench_load_messages", events, txn_sizes, pad)
}

/// Runs `procedure` (made by [`load_procedure`]) and takes a CHECKPOINT after it.
pub(crate) fn load_with(
    client: &mut Client,
    procedure: &str,
    events: u64,
    txn_sizes: &[u32],
    pad: u32,
) -> Load {
    let before = wal_lsn(client);
    let sizes = txn_sizes
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let started = Instant::now();
    // A simple query: a procedure that commits must not run inside the extended
    // protocol's implicit transaction. Only numbers are pasted in.
    let target_lsn = first_value(
        client,
        &format!("CALL {procedure}({events}, ARRAY[{sizes}], {pad})"),
    );
    let seconds = started.elapsed().as_secs_f64();
    client
        .batch_execute("CHECKPOINT")
        .unwrap_or_else(|err| panic!("CHECKPOINT: {err}"));
    let target = lsn_to_u64(&target_lsn);
    Load {
        events,
        txn_sizes: txn_sizes.to_vec(),
        seconds,
        wal_bytes: target.saturating_sub(before),
        target,
        target_lsn,
    }
}

/// `pg_current_wal_lsn()`.
pub fn wal_lsn(client: &mut Client) -> u64 {
    lsn_to_u64(&first_value(client, "SELECT pg_current_wal_lsn()"))
}

/// The first column of the first row of a simple query, as text.
pub fn first_value(client: &mut Client, sql: &str) -> String {
    client
        .simple_query(sql)
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
        .into_iter()
        .find_map(|message| match message {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no value"))
}

/// A topic outside the measured ones, for the warm-up record.
const WARM_UP_TOPIC: &str = "bench.warm-up";

/// The broker with the benchmark's topics, created up front (3 partitions each) so every
/// Kafka contender writes to the same topics; warmed up with one idempotent record, so
/// the first contender does not wait for a broker still loading its coordinators
/// ("Failed to acquire idempotence PID ... Coordinator load in progress").
pub fn start_kafka() -> KafkaBroker {
    let broker = KafkaBroker::start();
    for kind in AGGREGATE_TYPES {
        create_topic(&broker.bootstrap(), &topic(kind), PARTITIONS);
    }
    create_topic(&broker.bootstrap(), WARM_UP_TOPIC, 1);
    produce(&broker.bootstrap(), WARM_UP_TOPIC, "warm-up", "{}");
    broker
}

pub fn topic(kind: &str) -> String {
    format!("outbox.event.{kind}")
}

/// Records in the benchmark's topics (sum of high watermarks), to check that a
/// contender delivered every event.
pub fn records_in_topics(bootstrap: &str) -> Result<i64, String> {
    TopicCounter::new(bootstrap)?.total()
}

/// One consumer kept for repeated counts of the records in the benchmark's topics (a
/// contender timed until its records are all in Kafka).
pub struct TopicCounter(BaseConsumer);

impl TopicCounter {
    pub fn new(bootstrap: &str) -> Result<Self, String> {
        ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .create()
            .map(TopicCounter)
            .map_err(|err| format!("creating a consumer: {err}"))
    }

    /// The sum of the high watermarks of every partition.
    pub fn total(&self) -> Result<i64, String> {
        let mut total = 0;
        for kind in AGGREGATE_TYPES {
            for partition in 0..PARTITIONS {
                let (_, high) = self
                    .0
                    .fetch_watermarks(&topic(kind), partition, Duration::from_secs(10))
                    .map_err(|err| format!("watermarks of {}/{partition}: {err}", topic(kind)))?;
                total += high;
            }
        }
        Ok(total)
    }
}

/// Waits until the machine's CPUs are at most `max_busy` % busy (sampled over 3 s), for
/// at most `max_wait`; returns the last sample (0 when not waiting at all).
pub fn wait_quiet(max_busy: f64, max_wait: Duration) -> f64 {
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
