//! The Kafka sink against a real PostgreSQL and a real Apache Kafka broker:
//! Debezium-shaped records, router options, and invalid events that never vanish.

use outbox_relay_harness as support;

use std::collections::{BTreeMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::kafka::{consume, KafkaBroker, Record};
use support::outbox::{
    cluster_with_app_db, cluster_with_outbox, kafka_config, start_streaming, SLOT, WAIT,
};
use support::PgOptions;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

#[test]
fn debezium_default_table_routes_2000_events_over_5_types() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    let types = ["order", "customer", "invoice", "shipment", "payment"];
    let mut client = pg.client_db("app");
    let before = now_ms();
    let mut expected: BTreeMap<String, (String, String)> = BTreeMap::new();
    for txn in 0..40 {
        let mut tx = client.transaction().unwrap();
        for i in 0..50 {
            let n = txn * 50 + i;
            let kind = types[n % 5];
            let row = tx
                .query_one(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                     VALUES ($1, $2, 'Created', jsonb_build_object('n', $3::int, 'text', 'ünïcode ✓')) \
                     RETURNING id::text, payload::text",
                    &[&kind, &format!("agg-{}", n % 13), &(n as i32)],
                )
                .unwrap();
            expected.insert(row.get(0), (kind.to_string(), row.get(1)));
        }
        tx.commit().unwrap();
    }
    let after = now_ms();
    let topics: Vec<String> = types.iter().map(|t| format!("outbox.event.{t}")).collect();
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = consume(&broker.bootstrap(), &topic_refs, 2000, WAIT);
    assert_eq!(
        records.len(),
        2000,
        "exactly the 2000 events, no duplicates on a clean run"
    );
    let mut seen = HashSet::new();
    for record in &records {
        let id = record.header("id").expect("header id");
        let (kind, payload) = expected
            .get(&id)
            .unwrap_or_else(|| panic!("unknown id {id}"));
        assert_eq!(record.topic, format!("outbox.event.{kind}"));
        assert_eq!(
            record.key_str().as_deref(),
            Some(id.as_str()),
            "key = event id"
        );
        assert_eq!(
            record.value_str().as_deref(),
            Some(payload.as_str()),
            "value = the payload bytes as stored, JSON not escaped"
        );
        let ts = record.timestamp_ms.expect("record timestamp");
        assert!(
            ts >= before - 1000 && ts <= after + 1000,
            "commit time {ts} in [{before}, {after}]"
        );
        assert!(seen.insert(id), "duplicate record");
    }
    drop(relay);
}

#[test]
fn lesson_shaped_table_is_mapped_by_config() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_app_db();
    pg.client_db("app")
        .batch_execute(
            "CREATE TABLE events (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), type text NOT NULL, \
             user_id bigint NOT NULL, data jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
        )
        .unwrap();
    let outbox = "table = \"public.events\"\nid_column = \"event_id\"\nkey_column = \"user_id\"\n\
                  route_by_column = \"type\"\npayload_column = \"data\"\ntimestamp_column = \"created_at\"\n\
                  topic = \"users.${routedByValue}\"";
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), outbox, None, &[]));
    let mut client = pg.client_db("app");
    let mut expected = Vec::new();
    for (n, kind) in ["UserRegistered", "EmailChanged", "UserRegistered"]
        .iter()
        .enumerate()
    {
        let row = client
            .query_one(
                "INSERT INTO events (type, user_id, data, created_at) \
                 VALUES ($1, $2::bigint, jsonb_build_object('user', $2::bigint), timestamptz '2026-01-02 03:04:05.678+02') \
                 RETURNING event_id::text, data::text",
                &[kind, &(100 + n as i64)],
            )
            .unwrap();
        expected.push((
            row.get::<_, String>(0),
            kind.to_string(),
            100 + n as i64,
            row.get::<_, String>(1),
        ));
    }
    let records = consume(
        &broker.bootstrap(),
        &["users.UserRegistered", "users.EmailChanged"],
        3,
        WAIT,
    );
    assert_eq!(records.len(), 3);
    for (id, kind, user, data) in expected {
        let record = records
            .iter()
            .find(|r| r.header("id").as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("event {id} missing"));
        assert_eq!(record.topic, format!("users.{kind}"));
        assert_eq!(record.key_str(), Some(user.to_string()));
        assert_eq!(record.value_str(), Some(data));
        // 2026-01-02 03:04:05.678+02 = 01:04:05.678 UTC
        assert_eq!(record.timestamp_ms, Some(1_767_315_845_678));
    }
    drop(relay);
}

#[test]
fn additional_placements_topic_regex_and_tombstones() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox ADD COLUMN shard int NOT NULL DEFAULT 0, ALTER COLUMN payload DROP NOT NULL")
        .unwrap();
    let outbox =
        "additional = [\"type:header:eventType\", \"aggregateid:envelope\", \"shard:partition\"]\n\
                  topic = \"events.${routedByValue}\"\n\
                  topic_regex = \"(?<routedByValue>[a-z]+)_v[0-9]+\"\n\
                  tombstone_on_empty_payload = true";
    let mut config = kafka_config(&pg, &broker.bootstrap(), outbox, None, &[]);
    config = config.replace("[kafka]\n", "[kafka]\ntopic_partitions = 3\n");
    let relay = start_streaming(&config);
    pg.client_db("app")
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, shard) VALUES
               ('00000000-0000-0000-0000-000000000001', 'order_v2', 'o-1', 'OrderCreated', '{\"total\": 5}', 2),
               ('00000000-0000-0000-0000-000000000002', 'order_v10', 'o-1', 'OrderDeleted', NULL, 1),
               ('00000000-0000-0000-0000-000000000003', 'Unmatched', 'u-1', 'Other', '[1]', 0)",
        )
        .unwrap();
    let records = consume(&broker.bootstrap(), &["events.order", "Unmatched"], 3, WAIT);
    assert_eq!(records.len(), 3, "{records:?}");
    let by_id = |id: &str| -> &Record {
        records
            .iter()
            .find(|r| r.header("id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("record {id} missing: {records:?}"))
    };
    let created = by_id("00000000-0000-0000-0000-000000000001");
    assert_eq!(
        created.topic, "events.order",
        "regex group replaces ${{routedByValue}}"
    );
    assert_eq!(created.partition, 2, "shard:partition");
    assert_eq!(
        created.header("eventType").as_deref(),
        Some("OrderCreated"),
        "type:header:eventType"
    );
    assert_eq!(
        json(created.value.as_deref().unwrap()),
        serde_json::json!({"payload": {"total": 5}, "aggregateid": "o-1"}),
        "aggregateid:envelope"
    );
    let deleted = by_id("00000000-0000-0000-0000-000000000002");
    assert_eq!(deleted.partition, 1);
    assert_eq!(
        deleted.value, None,
        "NULL payload with tombstone_on_empty_payload → tombstone"
    );
    assert_eq!(
        deleted.key_str().as_deref(),
        Some("00000000-0000-0000-0000-000000000002")
    );
    let unmatched = by_id("00000000-0000-0000-0000-000000000003");
    assert_eq!(
        unmatched.topic, "Unmatched",
        "a value the regex does not match is the topic as it is"
    );
    drop(relay);
}

/// The table for invalid events: no constraints, so every bad value can be written.
fn loose_outbox(pg: &support::PgCluster) {
    pg.client_db("app")
        .batch_execute(
            "CREATE TABLE outbox (id text, aggregatetype text, aggregateid text, type text, payload text)",
        )
        .unwrap();
}

#[test]
fn invalid_events_go_to_the_dead_letter_topic_with_their_reason() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_app_db();
    loose_outbox(&pg);
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "",
        Some("outbox.dead-letter"),
        &[("message.max.bytes", "100000")],
    ));
    let big = "x".repeat(200_000);
    let mut client = pg.client_db("app");
    for (id, route, payload) in [
        (Some("ok-1"), Some("good"), "{\"n\":1}".to_string()),
        (None, Some("good"), "{}".to_string()),
        (Some("no-route"), None, "{}".to_string()),
        (Some("oversize"), Some("good"), big.clone()),
        (Some("bad-topic"), Some("not a topic!"), "{}".to_string()),
        (Some("unicode-topic"), Some("注文"), "{}".to_string()),
        (Some("ok-2"), Some("good"), "{\"n\":2}".to_string()),
    ] {
        client
            .execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'a', 't', $3)",
                &[&id, &route, &payload],
            )
            .unwrap();
    }
    let good = consume(&broker.bootstrap(), &["outbox.event.good"], 2, WAIT);
    let ids: Vec<_> = good.iter().map(|r| r.header("id").unwrap()).collect();
    assert_eq!(
        ids,
        ["ok-1", "ok-2"],
        "valid events around the invalid ones are delivered"
    );
    let dead = consume(&broker.bootstrap(), &["outbox.dead-letter"], 5, WAIT);
    assert_eq!(dead.len(), 5, "{dead:?}");
    for record in &dead {
        assert_eq!(
            record.header("source.table").as_deref(),
            Some("public.outbox")
        );
        let lsn = record.header("source.lsn").expect("source.lsn header");
        assert!(lsn.contains('/'), "source.lsn is an LSN: {lsn}");
        assert!(record.header("error").is_some(), "error header: {record:?}");
    }
    let reason = |needle: &str| {
        dead.iter()
            .filter_map(|r| r.header("error"))
            .find(|e| e.contains(needle))
            .unwrap_or_else(|| {
                panic!(
                    "no dead-letter record whose error mentions {needle:?}: {:?}",
                    dead.iter().map(|r| r.header("error")).collect::<Vec<_>>()
                )
            })
    };
    reason("\"id\"");
    reason("\"aggregatetype\"");
    reason("too large");
    // The oversize event's dead letter is too large as well: it goes without its value,
    // saying so, and keeps the event's identity and where it was headed.
    let oversize = dead
        .iter()
        .find(|r| r.header("id").as_deref() == Some("oversize"))
        .expect("the oversize event's dead letter");
    assert_eq!(oversize.value, None, "{oversize:?}");
    assert!(
        oversize
            .header("value.dropped")
            .is_some_and(|why| why.contains("too large")),
        "{oversize:?}"
    );
    assert_eq!(
        oversize.header("source.topic").as_deref(),
        Some("outbox.event.good")
    );
    reason("not a topic!");
    reason("注文");
    // The row that could not be routed is kept, as JSON, for reprocessing.
    let null_id = dead
        .iter()
        .find(|r| r.header("error").is_some_and(|e| e.contains("\"id\"")))
        .unwrap();
    assert_eq!(json(null_id.value.as_deref().unwrap())["id"], Value::Null);
    assert_eq!(relay.exit_status(), None, "the relay keeps running");
    // Everything, dead letters included, is acknowledged.
    let current = pg.current_wal_lsn();
    support::wait_until("slot passes the invalid events", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= current
    });
}

#[test]
fn without_a_dead_letter_topic_an_invalid_event_stops_the_relay_unacknowledged() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_app_db();
    loose_outbox(&pg);
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    let mut client = pg.client_db("app");
    client
        .execute(
            "INSERT INTO outbox VALUES ('ok-1', 'good', 'a', 't', '{}')",
            &[],
        )
        .unwrap();
    consume(&broker.bootstrap(), &["outbox.event.good"], 1, WAIT);
    support::wait_until("the valid event is acknowledged", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= pg.current_wal_lsn()
    });
    client
        .execute(
            "INSERT INTO outbox VALUES ('bad', NULL, 'a', 't', '{}')",
            &[],
        )
        .unwrap();
    let after_bad = pg.current_wal_lsn();
    let status = relay.wait_exit(WAIT);
    assert!(!status.success());
    let stderr = relay.stderr();
    assert!(
        stderr.contains("aggregatetype"),
        "names the column: {stderr}"
    );
    assert!(
        stderr.contains("dead_letter"),
        "says how to keep going: {stderr}"
    );
    let confirmed = pg.slot_confirmed_flush_lsn(SLOT).unwrap();
    assert!(
        confirmed < after_bad,
        "the invalid event's transaction is not acknowledged ({confirmed} >= {after_bad})"
    );
    // Not acknowledged means it comes again: a restarted relay stops on the same row.
    let again =
        support::RelayProcess::start(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    assert!(!again.wait_exit(WAIT).success());
    assert!(
        again.stderr().contains("aggregatetype"),
        "{}",
        again.stderr()
    );
}

#[test]
fn a_missing_additional_column_sends_the_event_to_the_dead_letter_topic() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "additional = [\"tenant:header\"]",
        Some("dlq"),
        &[],
    ));
    pg.client_db("app")
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'o', 'T', '{\"x\": 1}')",
        )
        .unwrap();
    let dead = consume(&broker.bootstrap(), &["dlq"], 1, WAIT);
    assert_eq!(dead.len(), 1);
    let error = dead[0].header("error").unwrap();
    assert!(
        error.contains("tenant") && error.contains("outbox.additional"),
        "{error}"
    );
    assert_eq!(
        json(dead[0].value.as_deref().unwrap())["aggregatetype"],
        "order"
    );
    // Once the column exists, the same configuration routes normally.
    pg.client_db("app")
        .batch_execute(
            "ALTER TABLE outbox ADD COLUMN tenant text;
             INSERT INTO outbox (aggregatetype, aggregateid, type, payload, tenant) VALUES ('order', 'o', 'T', '{}', 'acme')",
        )
        .unwrap();
    let routed = consume(&broker.bootstrap(), &["outbox.event.order"], 1, WAIT);
    assert_eq!(routed[0].header("tenant").as_deref(), Some("acme"));
    drop(relay);
}

#[test]
fn a_topic_that_cannot_be_created_stops_the_relay_naming_it() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let config = kafka_config(&pg, &broker.bootstrap(), "", None, &[])
        .replace("[kafka]\n", "[kafka]\ncreate_topics = false\n");
    let relay = start_streaming(&config);
    pg.client_db("app")
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('nowhere', 'o', 'T', '{}')",
        )
        .unwrap();
    let status = relay.wait_exit(WAIT);
    assert!(!status.success());
    let stderr = relay.stderr();
    assert!(
        stderr.contains("outbox.event.nowhere"),
        "names the topic: {stderr}"
    );
    assert!(
        stderr.contains("create_topics"),
        "says how to fix it: {stderr}"
    );
    assert!(
        pg.slot_confirmed_flush_lsn(SLOT).unwrap() < pg.current_wal_lsn(),
        "the event is not acknowledged"
    );
}

/// Runs Kafka's Java producer (`harness/java/KeyProducer.java`, in Java's
/// source-file mode on the test broker's jars) on `keys` into `topic`; returns the
/// partition it picked for each key.
fn java_producer_partitions(
    bootstrap: &str,
    topic: &str,
    keys: &[String],
) -> BTreeMap<String, i32> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let source =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("harness/java/KeyProducer.java");
    let java = std::env::var_os("JAVA_HOME")
        .map(|home| std::path::PathBuf::from(home).join("bin/java"))
        .filter(|java| java.is_file())
        .unwrap_or_else(|| "java".into());
    let mut child = Command::new(java)
        .arg("-cp")
        .arg(format!("{}/*", support::kafka::kafka_libs_dir().display()))
        .arg(&source)
        .args([bootstrap, topic])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running java (a JDK is needed for the test broker anyway)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(keys.join("\n").as_bytes())
        .expect("writing the keys");
    // Bounded by the producer's own delivery timeout (2 minutes by default).
    let output = child.wait_with_output().expect("waiting for java");
    assert!(
        output.status.success(),
        "the Java producer failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let (key, partition) = line.split_once('\t')?;
            Some((key.to_owned(), partition.trim().parse().ok()?))
        })
        .collect()
}

/// The relay's default partitioner is Kafka's Java one (murmur2 of the key): the same
/// keys land on the same partitions as with Kafka's Java producer, Kafka Connect or
/// Debezium, so switching relays keeps per-key order. librdkafka's own default
/// (CRC32) puts most keys elsewhere.
#[test]
fn a_key_lands_on_the_partition_kafkas_java_producer_picks() {
    const PARTITIONS: i32 = 6;
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let config = kafka_config(
        &pg,
        &broker.bootstrap(),
        "key_column = \"aggregateid\"",
        None,
        &[],
    )
    .replace(
        "[kafka]\n",
        &format!("[kafka]\ntopic_partitions = {PARTITIONS}\n"),
    );
    let relay = start_streaming(&config);
    let keys: Vec<String> = (0..120)
        .map(|i| format!("customer-{i}"))
        .chain(
            [
                "ü-ñ-ключ",
                "a-much-longer-aggregate-id-0123456789-abcdefghij",
            ]
            .map(String::from),
        )
        .collect();
    let mut client = pg.client_db("app");
    for key in &keys {
        client
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('keyed', $1, 'T', '{}')",
                &[key],
            )
            .unwrap();
    }
    let relayed = consume(
        &broker.bootstrap(),
        &["outbox.event.keyed"],
        keys.len(),
        WAIT,
    );
    assert_eq!(relayed.len(), keys.len());
    let relay_partitions: BTreeMap<String, i32> = relayed
        .iter()
        .map(|r| (r.key_str().expect("a key"), r.partition))
        .collect();
    support::create_topic(&broker.bootstrap(), "java.keyed", PARTITIONS);
    let java_partitions = java_producer_partitions(&broker.bootstrap(), "java.keyed", &keys);
    assert_eq!(
        java_partitions.len(),
        keys.len(),
        "one line per key from Java"
    );
    let differing: Vec<_> = keys
        .iter()
        .filter(|key| relay_partitions.get(*key) != java_partitions.get(*key))
        .map(|key| (key, relay_partitions.get(key), java_partitions.get(key)))
        .collect();
    assert!(
        differing.is_empty(),
        "{} of {} keys land elsewhere than with Kafka's Java producer (key, relay, java): {:?}",
        differing.len(),
        keys.len(),
        &differing[..differing.len().min(5)]
    );
    let used: HashSet<i32> = relay_partitions.values().copied().collect();
    assert_eq!(
        used.len(),
        PARTITIONS as usize,
        "the keys spread over every partition"
    );
    drop(relay);
}
