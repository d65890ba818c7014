//! Tests of the Kafka side of the integration-test harness (`harness/src/kafka.rs`)
//! against a real Apache Kafka broker: if these fail, the relay's Kafka tests cannot be
//! trusted.

use outbox_relay_harness as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::kafka::{kafka_libs_dir, read_all};
use support::{
    consume, create_topic, list_topics, produce, produce_records, Delivered, KafkaBroker,
    OutgoingRecord, Record,
};

/// Generous deadline for reading records that are known to be there.
const READ_DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn broker_starts_and_creates_topics() {
    assert!(kafka_libs_dir().is_dir());
    let broker = KafkaBroker::shared();
    assert_eq!(broker.bootstrap(), format!("127.0.0.1:{}", broker.port()));
    assert!(broker.is_running());

    let before = list_topics(&broker.bootstrap());
    assert!(!before.contains(&"orders".to_owned()), "{before:?}");
    // Auto-creation is off, as on a production cluster: producing to a missing topic
    // fails instead of creating it.
    let refused = support::try_produce_records(
        &broker.bootstrap(),
        &[OutgoingRecord {
            topic: "never-created",
            value: Some(b"v"),
            ..OutgoingRecord::default()
        }],
    );
    assert!(refused[0].is_err(), "{refused:?}");
    assert!(!list_topics(&broker.bootstrap()).contains(&"never-created".to_owned()));
    create_topic(&broker.bootstrap(), "orders", 3);
    create_topic(&broker.bootstrap(), "payments", 1);
    let after = list_topics(&broker.bootstrap());
    assert!(
        after.contains(&"orders".to_owned()) && after.contains(&"payments".to_owned()),
        "{after:?}"
    );

    // A fresh topic reads back empty, promptly.
    let started = Instant::now();
    let records = consume(
        &broker.bootstrap(),
        &["orders", "payments"],
        0,
        READ_DEADLINE,
    );
    assert!(records.is_empty(), "{records:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn records_round_trip_with_keys_values_headers_and_timestamps() {
    let broker = KafkaBroker::shared();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "events", 3);
    create_topic(&bootstrap, "audit", 1);

    const N: usize = 40;
    let base_ts: i64 = 1_700_000_000_000;
    let keys: Vec<String> = (0..N).map(|i| format!("key-{i}")).collect();
    let values: Vec<String> = (0..N).map(|i| format!("{{\"n\":{i}}}")).collect();
    let ids: Vec<String> = (0..N).map(|i| format!("id-{i}")).collect();
    let mut outgoing: Vec<OutgoingRecord<'_>> = (0..N)
        .map(|i| OutgoingRecord {
            topic: "events",
            partition: None,
            key: Some(keys[i].as_bytes()),
            value: Some(values[i].as_bytes()),
            headers: vec![
                ("id", Some(ids[i].as_bytes())),
                ("type", Some(b"OrderCreated".as_slice())),
                ("empty", Some(b"".as_slice())),
                ("null", None),
            ],
            timestamp_ms: Some(base_ts + i64::try_from(i).unwrap()),
        })
        .collect();
    // Null key, tombstone (null value), no headers, explicit partition.
    outgoing.push(OutgoingRecord {
        topic: "audit",
        partition: Some(0),
        key: None,
        value: Some(b"no key"),
        headers: Vec::new(),
        timestamp_ms: Some(base_ts),
    });
    outgoing.push(OutgoingRecord {
        topic: "audit",
        partition: Some(0),
        key: Some(b"gone"),
        value: None,
        headers: Vec::new(),
        timestamp_ms: Some(base_ts + 1),
    });

    let delivered = produce_records(&bootstrap, &outgoing);
    let records = consume(
        &bootstrap,
        &["events", "audit"],
        outgoing.len(),
        READ_DEADLINE,
    );
    assert_eq!(records.len(), outgoing.len(), "{records:#?}");

    let by_position: BTreeMap<(String, i32, i64), &Record> = records
        .iter()
        .map(|r| ((r.topic.clone(), r.partition, r.offset), r))
        .collect();
    assert_eq!(by_position.len(), records.len(), "no record read twice");
    for (sent, Delivered { partition, offset }) in outgoing.iter().zip(&delivered) {
        let got = by_position
            .get(&(sent.topic.to_owned(), *partition, *offset))
            .unwrap_or_else(|| panic!("{sent:?} at {partition}/{offset} not read back"));
        assert_eq!(got.key.as_deref(), sent.key, "{got:?}");
        assert_eq!(got.value.as_deref(), sent.value, "{got:?}");
        assert_eq!(got.timestamp_ms, sent.timestamp_ms, "{got:?}");
        let sent_headers: Vec<(String, Option<Vec<u8>>)> = sent
            .headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(got.headers, sent_headers, "{got:?}");
    }

    // Helpers.
    let first = by_position[&(
        "events".to_owned(),
        delivered[0].partition,
        delivered[0].offset,
    )];
    assert_eq!(first.key_str().as_deref(), Some("key-0"));
    assert_eq!(first.value_str().as_deref(), Some("{\"n\":0}"));
    assert_eq!(first.header("id").as_deref(), Some("id-0"));
    assert_eq!(first.header("empty").as_deref(), Some(""));
    assert_eq!(first.header("null"), None);
    assert_eq!(first.header("absent"), None);
    let audit: Vec<&Record> = records.iter().filter(|r| r.topic == "audit").collect();
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[0].key_str(), None);
    assert_eq!(audit[1].value_str(), None);

    // Same key → same partition; per partition, offsets 0.. without gaps, in order.
    let mut per_partition: BTreeMap<(String, i32), Vec<i64>> = BTreeMap::new();
    for r in &records {
        per_partition
            .entry((r.topic.clone(), r.partition))
            .or_default()
            .push(r.offset);
    }
    for (partition, offsets) in &per_partition {
        let want: Vec<i64> = (0..i64::try_from(offsets.len()).unwrap()).collect();
        assert_eq!(offsets, &want, "{partition:?}");
    }
    let events_partitions = per_partition.keys().filter(|(t, _)| t == "events").count();
    assert!(
        events_partitions > 1,
        "40 keys should spread over 3 partitions"
    );
}

#[test]
fn consume_returns_duplicates_beyond_expected() {
    let broker = KafkaBroker::shared();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "dups", 1);
    for i in 0..5 {
        produce(&bootstrap, "dups", "same-key", &format!("copy {i}"));
    }
    let records = consume(&bootstrap, &["dups"], 3, READ_DEADLINE);
    let values: Vec<String> = records.iter().filter_map(Record::value_str).collect();
    assert_eq!(
        values,
        ["copy 0", "copy 1", "copy 2", "copy 3", "copy 4"],
        "all 5 records, though 3 were expected"
    );
    let offsets: Vec<i64> = records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, [0, 1, 2, 3, 4]);

    // Exactly up to the high watermark seen: a record produced afterwards is not in an
    // earlier read, and is in the next one.
    let before = read_all(&bootstrap, &["dups"]);
    produce(&bootstrap, "dups", "same-key", "copy 5");
    assert_eq!(before.len(), 5);
    let after = read_all(&bootstrap, &["dups"]);
    assert_eq!(after.len(), 6);
    assert_eq!(after[5].value_str().as_deref(), Some("copy 5"));
    assert!(read_all(&bootstrap, &["no-such-topic"]).is_empty());
}

#[test]
fn shared_broker_is_emptied_for_each_lease() {
    {
        let broker = KafkaBroker::shared();
        create_topic(&broker.bootstrap(), "left-behind", 2);
        produce(&broker.bootstrap(), "left-behind", "k", "v");
    }
    let broker = KafkaBroker::shared();
    let topics = list_topics(&broker.bootstrap());
    assert!(
        topics.iter().all(|t| t.starts_with("__")),
        "only internal topics remain: {topics:?}"
    );
    // The same name can be created again, and starts empty.
    create_topic(&broker.bootstrap(), "left-behind", 1);
    assert!(read_all(&broker.bootstrap(), &["left-behind"]).is_empty());
}

#[test]
fn consume_returns_what_it_has_by_the_deadline() {
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();

    // A topic that does not exist: empty, no hang, no panic.
    let deadline = Duration::from_secs(3);
    let started = Instant::now();
    let records = consume(&bootstrap, &["missing"], 1, deadline);
    let elapsed = started.elapsed();
    assert!(records.is_empty(), "{records:?}");
    assert!(
        elapsed >= deadline && elapsed < deadline + Duration::from_secs(3),
        "{elapsed:?}"
    );

    // Fewer records than expected: the ones there are, at the deadline.
    create_topic(&bootstrap, "short", 2);
    produce(&bootstrap, "short", "a", "1");
    produce(&bootstrap, "short", "b", "2");
    let deadline = Duration::from_secs(4);
    let started = Instant::now();
    let records = consume(&bootstrap, &["short", "missing"], 5, deadline);
    let elapsed = started.elapsed();
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(
        elapsed >= deadline && elapsed < deadline + Duration::from_secs(3),
        "{elapsed:?}"
    );

    // A paused broker answers nothing: still back by the deadline.
    broker.pause();
    let deadline = Duration::from_secs(2);
    let started = Instant::now();
    let records = consume(&bootstrap, &["short"], 2, deadline);
    let elapsed = started.elapsed();
    broker.resume();
    assert!(records.is_empty(), "{records:?}");
    assert!(elapsed < deadline + Duration::from_secs(3), "{elapsed:?}");
}

#[test]
fn consume_picks_up_a_topic_created_after_it_started() {
    let broker = KafkaBroker::shared();
    let bootstrap = broker.bootstrap();
    let reader = std::thread::spawn({
        let bootstrap = bootstrap.clone();
        move || consume(&bootstrap, &["late"], 1, READ_DEADLINE)
    });
    // Let the consumer see the topic missing first.
    std::thread::sleep(Duration::from_secs(1));
    create_topic(&bootstrap, "late", 1);
    produce(&bootstrap, "late", "k", "arrived late");
    let records = reader.join().expect("consumer thread");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].value_str().as_deref(), Some("arrived late"));
}

#[test]
fn paused_broker_stalls_produce_until_resumed() {
    let broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "stall", 1);
    produce(&bootstrap, "stall", "k", "before");

    broker.pause();
    let producer = std::thread::spawn({
        let bootstrap = bootstrap.clone();
        move || produce(&bootstrap, "stall", "k", "during pause")
    });
    // Nothing can complete while the broker is stopped.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !producer.is_finished(),
        "produce completed against a paused broker"
    );

    broker.resume();
    let started = Instant::now();
    support::wait_until(
        "produce completes after resume",
        Duration::from_secs(30),
        || producer.is_finished(),
    );
    let delivered = producer.join().expect("producer thread");
    assert_eq!(delivered.offset, 1);
    assert!(started.elapsed() < Duration::from_secs(30));

    let records = consume(&bootstrap, &["stall"], 2, READ_DEADLINE);
    let values: Vec<String> = records.iter().filter_map(Record::value_str).collect();
    assert_eq!(values, ["before", "during pause"]);
}

#[test]
fn broker_keeps_acknowledged_records_across_kill9_and_restart() {
    let mut broker = KafkaBroker::start();
    let bootstrap = broker.bootstrap();
    assert!(
        broker.dir().join("data/meta.properties").exists(),
        "log directory formatted in the broker's temp dir"
    );
    create_topic(&bootstrap, "durable", 1);
    produce(&bootstrap, "durable", "k1", "first");
    produce(&bootstrap, "durable", "k2", "second");

    let old_pid = broker.pid();
    broker.kill9();
    assert!(!broker.is_running());
    broker.restart();
    assert!(broker.is_running());
    assert_ne!(broker.pid(), old_pid);
    assert_eq!(broker.bootstrap(), bootstrap, "same port after restart");

    assert!(
        list_topics(&bootstrap).contains(&"durable".to_owned()),
        "topic survives; log:\n{}",
        broker.log_tail()
    );
    let records = consume(&bootstrap, &["durable"], 2, READ_DEADLINE);
    let values: Vec<String> = records.iter().filter_map(Record::value_str).collect();
    assert_eq!(values, ["first", "second"], "log:\n{}", broker.log_tail());
    assert_eq!(records[0].key_str().as_deref(), Some("k1"));

    // The log continues where it was.
    let delivered = produce(&bootstrap, "durable", "k3", "third");
    assert_eq!(delivered.offset, 2);

    // A controlled shutdown (SIGTERM) and a restart of a paused broker keep it too.
    broker.stop();
    assert!(!broker.is_running());
    broker.restart();
    broker.pause();
    broker.restart();
    assert!(broker.log_tail().contains("broker restarted"));
    let records = consume(&bootstrap, &["durable"], 3, READ_DEADLINE);
    let values: Vec<String> = records.iter().filter_map(Record::value_str).collect();
    assert_eq!(values, ["first", "second", "third"]);
}
