//! The Debezium runner of the harness (`harness/src/debezium.rs`), the benchmark's
//! side-by-side contender: Kafka Connect standalone with Debezium 3.6's PostgreSQL
//! connector and Outbox Event Router streams the same outbox rows as the relay, from the
//! same database and WAL into the same broker, and produces the same records: per event
//! id the same topic, partition, key and JSON value.

use outbox_relay_harness as support;

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use serde_json::{json, Value};
use support::debezium::{prepare_slot, DebeziumConnect, DebeziumOptions, PgEndpoint};
use support::kafka::{consume, create_topic, KafkaBroker, Record};
use support::outbox::{
    cluster_with_outbox, kafka_config, peak_rss_kib, report, start_streaming, WAIT,
};
use support::PgOptions;

const TYPES: [&str; 2] = ["order", "customer"];
const PARTITIONS: i32 = 3;
/// Events written before Debezium starts (after its slot exists: the benchmark's
/// preloaded WAL), and after it streams.
const BEFORE: usize = 60;
const AFTER: usize = 60;

/// Inserts `n` events, 10 per transaction, alternating types and aggregates, payloads with
/// nested objects, arrays, floats and non-ASCII text. Returns id -> payload.
fn insert(pg: &support::PgCluster, first: usize, n: usize) -> BTreeMap<String, Value> {
    let mut client = pg.client_db("app");
    let mut events = BTreeMap::new();
    for chunk in (first..first + n).collect::<Vec<_>>().chunks(10) {
        let mut tx = client.transaction().expect("begin");
        for &i in chunk {
            let kind = TYPES[i % TYPES.len()];
            let payload = json!({
                "n": i,
                "items": [{"sku": format!("A-{i}"), "qty": 2}, {"sku": "B", "qty": 1}],
                "total": 12.5,
                "note": "grüße, 注文",
                "flags": {"paid": i % 3 == 0},
            });
            let id: String = tx
                .query_one(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                     VALUES ($1, $2, 'Created', $3::text::jsonb) RETURNING id::text",
                    &[&kind, &format!("agg-{}", i % 7), &payload.to_string()],
                )
                .expect("insert")
                .get(0);
            events.insert(id, payload);
        }
        tx.commit().expect("commit");
    }
    events
}

fn by_id(records: &[Record]) -> BTreeMap<String, &Record> {
    let mut map = BTreeMap::new();
    for record in records {
        let id = record
            .header("id")
            .unwrap_or_else(|| panic!("record without an id header: {record:?}"));
        assert!(
            map.insert(id.clone(), record).is_none(),
            "event {id} delivered twice"
        );
    }
    map
}

fn value_json(record: &Record) -> Value {
    let value = record.value.as_deref().expect("a value");
    serde_json::from_slice(value).unwrap_or_else(|e| {
        panic!(
            "value is not JSON ({e}): {}",
            String::from_utf8_lossy(value)
        )
    })
}

#[test]
fn debezium_streams_the_same_records_as_the_relay() {
    // Fails first, naming ./deploy/dev-deps.sh, when the jars are missing.
    support::debezium::debezium_libs_dir();
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    let pg = cluster_with_outbox(PgOptions::default());
    for kind in TYPES {
        create_topic(&bootstrap, &format!("outbox.event.{kind}"), PARTITIONS);
        create_topic(
            &bootstrap,
            &format!("relay.outbox.event.{kind}"),
            PARTITIONS,
        );
    }

    // Debezium's slot first, so the rows written before it starts are in its stream.
    let endpoint = PgEndpoint::superuser(&pg, "app");
    let options = DebeziumOptions::default();
    prepare_slot(&mut pg.client_db("app"), &options);
    // The relay on the same WAL, keyed like Debezium, into topics of its own.
    let relay = start_streaming(&kafka_config(
        &pg,
        &bootstrap,
        "key_column = \"aggregateid\"\ntopic = \"relay.outbox.event.${routedByValue}\"",
        None,
        &[],
    ));
    let mut expected = insert(&pg, 0, BEFORE);

    let started = Instant::now();
    let debezium = DebeziumConnect::start(&endpoint, &bootstrap, &options);
    debezium.wait_streaming(&endpoint, WAIT);
    let ready = started.elapsed();
    expected.extend(insert(&pg, BEFORE, AFTER));

    let topics: Vec<String> = TYPES.iter().map(|k| format!("outbox.event.{k}")).collect();
    let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
    let from_debezium = consume(&bootstrap, &topics, expected.len(), WAIT);
    let relay_topics: Vec<String> = topics.iter().map(|t| format!("relay.{t}")).collect();
    let relay_topics: Vec<&str> = relay_topics.iter().map(String::as_str).collect();
    let from_relay = consume(&bootstrap, &relay_topics, expected.len(), WAIT);
    let rss_mib = peak_rss_kib(debezium.pid()).unwrap_or(0) / 1024;

    let debezium_by_id = by_id(&from_debezium);
    let relay_by_id = by_id(&from_relay);
    let ids: HashSet<&String> = expected.keys().collect();
    assert_eq!(
        debezium_by_id.keys().collect::<HashSet<_>>(),
        ids,
        "debezium's event ids (header id) are the inserted ones; log tail:\n{}",
        debezium.log_tail()
    );
    assert_eq!(
        relay_by_id.keys().collect::<HashSet<_>>(),
        ids,
        "relay's event ids"
    );
    for (id, payload) in &expected {
        let (dbz, ours) = (debezium_by_id[id], relay_by_id[id]);
        assert_eq!(format!("relay.{}", dbz.topic), ours.topic, "topic of {id}");
        assert_eq!(dbz.partition, ours.partition, "partition of {id}");
        assert_eq!(dbz.key_str(), ours.key_str(), "key of {id}");
        assert_eq!(&value_json(dbz), payload, "debezium's value of {id}");
        assert_eq!(&value_json(ours), payload, "relay's value of {id}");
    }
    // Per partition, both in commit order: the same id sequence.
    let order = |records: &[Record], prefix: &str| {
        let mut seqs: BTreeMap<(String, i32), Vec<String>> = BTreeMap::new();
        for r in records {
            let topic = r.topic.strip_prefix(prefix).unwrap_or(&r.topic).to_owned();
            seqs.entry((topic, r.partition))
                .or_default()
                .push(r.header("id").unwrap_or_default());
        }
        seqs
    };
    assert_eq!(
        order(&from_debezium, ""),
        order(&from_relay, "relay."),
        "per-partition order"
    );

    debezium.stop();
    drop(relay);
    report(&format!(
        "debezium_harness: {} events, Debezium and the relay agree on topic, partition, key, \
         value and order; Connect ready in {ready:.1?}, peak RSS {rss_mib} MiB",
        expected.len()
    ));
}
