//! Several outbox tables through one relay into a real Apache Kafka broker: dead letters
//! name the table the event came from (a row that cannot be routed, a record Kafka
//! refuses), and exactly-once delivers every table's events once to a read_committed
//! consumer. Event ids are compared, not counts.

use outbox_relay_harness as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::kafka::{read_committed, KafkaBroker, Record};
use support::outbox::{cluster_with_app_db, start_streaming, OUTBOX_SQL, SLOT, WAIT};
use support::PgCluster;

const DLQ: &str = "outbox.dead-letter";

/// `public.outbox` (Debezium's shape) and `billing.outbox`, whose route-by column may
/// be NULL (a row that cannot be routed).
fn cluster() -> PgCluster {
    let pg = cluster_with_app_db();
    let mut client = pg.client_db("app");
    client.batch_execute(OUTBOX_SQL).expect("public.outbox");
    client
        .batch_execute(
            "CREATE SCHEMA billing;
             CREATE TABLE billing.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
               aggregatetype text, aggregateid text NOT NULL, type text NOT NULL, payload jsonb);",
        )
        .expect("billing.outbox");
    pg
}

fn config(pg: &PgCluster, bootstrap: &str, kafka: &str) -> String {
    format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [[outbox]]\ntable = \"public.outbox\"\n\
         [[outbox]]\ntable = \"billing.outbox\"\ntopic = \"billing.${{routedByValue}}\"\n\
         [sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"{bootstrap}\"\n{kafka}\n\
         [dead_letter]\ntopic = \"{DLQ}\"\n",
        pg.url("postgres", None, "app")
    )
}

fn insert(pg: &PgCluster, table: &str, kind: Option<&str>, payload: &str) -> String {
    pg.client_db("app")
        .query_one(
            &format!(
                "INSERT INTO {table} (aggregatetype, aggregateid, type, payload)
                 VALUES ($1, 'a-1', 'T', {payload}) RETURNING id::text"
            ),
            &[&kind],
        )
        .unwrap_or_else(|e| panic!("inserting into {table}: {e}"))
        .get(0)
}

/// Reads `topics` read_committed until `done` holds for what was read (or the deadline).
fn read_until(bootstrap: &str, topics: &[&str], done: impl Fn(&[Record]) -> bool) -> Vec<Record> {
    let end = Instant::now() + WAIT;
    loop {
        let records = read_committed(bootstrap, topics);
        if done(&records) || Instant::now() >= end {
            return records;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Event id → (topic, times seen).
fn by_id(records: &[Record]) -> BTreeMap<String, (String, usize)> {
    let mut seen: BTreeMap<String, (String, usize)> = BTreeMap::new();
    for record in records {
        if let Some(id) = record.header("id") {
            seen.entry(id)
                .or_insert_with(|| (record.topic.clone(), 0))
                .1 += 1;
        }
    }
    seen
}

#[test]
fn dead_letters_name_the_table_each_event_came_from() {
    let broker = KafkaBroker::shared();
    let pg = cluster();
    // Kafka refuses records over 20,000 bytes: a record's own failure, a dead letter.
    let relay = start_streaming(&config(
        &pg,
        &broker.bootstrap(),
        "[kafka.properties]\n\"message.max.bytes\" = \"20000\"\n\"linger.ms\" = \"5\"",
    ));
    let fine = insert(&pg, "billing.outbox", Some("invoice"), "'{}'");
    let unroutable = insert(&pg, "billing.outbox", None, "'{}'");
    let oversize = insert(
        &pg,
        "billing.outbox",
        Some("invoice"),
        "jsonb_build_object('pad', repeat('x', 50000))",
    );
    let public = insert(&pg, "public.outbox", Some("order"), "'{}'");
    let letters = read_until(&broker.bootstrap(), &[DLQ], |records| records.len() >= 2);
    assert_eq!(letters.len(), 2, "{letters:?}");
    for letter in &letters {
        assert_eq!(
            letter.header("source.table").as_deref(),
            Some("billing.outbox"),
            "{letter:?}"
        );
    }
    let refused = letters
        .iter()
        .find(|l| l.header("id").as_deref() == Some(oversize.as_str()))
        .expect("the oversize event's dead letter carries its id");
    assert_eq!(
        refused.header("source.topic").as_deref(),
        Some("billing.invoice")
    );
    let row = letters
        .iter()
        .find(|l| l.header("id").is_none())
        .expect("the unroutable row's dead letter");
    assert!(
        row.value_str().unwrap_or_default().contains(&unroutable),
        "the raw row, with its id: {row:?}"
    );
    let events = read_until(
        &broker.bootstrap(),
        &["billing.invoice", "outbox.event.order"],
        |records| records.len() >= 2,
    );
    let seen = by_id(&events);
    assert_eq!(
        seen.get(&fine).map(|s| s.0.as_str()),
        Some("billing.invoice")
    );
    assert_eq!(
        seen.get(&public).map(|s| s.0.as_str()),
        Some("outbox.event.order")
    );
    assert_eq!(relay.exit_status(), None, "the relay runs on");
}

#[test]
fn exactly_once_delivers_every_tables_events_once() {
    let broker = KafkaBroker::shared();
    let pg = cluster();
    let _relay = start_streaming(&config(
        &pg,
        &broker.bootstrap(),
        "exactly_once = true\ntransaction_ms = 100",
    ));
    let mut expected = BTreeMap::new();
    for n in 0..20 {
        let (table, kind, topic) = if n % 2 == 0 {
            ("public.outbox", "order", "outbox.event.order")
        } else {
            ("billing.outbox", "invoice", "billing.invoice")
        };
        expected.insert(insert(&pg, table, Some(kind), "'{}'"), topic.to_owned());
    }
    let records = read_until(
        &broker.bootstrap(),
        &["outbox.event.order", "billing.invoice"],
        |records| records.len() >= expected.len(),
    );
    let seen = by_id(&records);
    let got: BTreeMap<String, String> = seen
        .iter()
        .map(|(id, (topic, times))| {
            assert_eq!(*times, 1, "{id} delivered {times} times");
            (id.clone(), topic.clone())
        })
        .collect();
    assert_eq!(got, expected, "every event once, in its table's topic");
}
