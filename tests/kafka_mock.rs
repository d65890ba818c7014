//! Producer faults no single real broker can be made to produce (a fatal idempotence
//! error, a chosen error code in a produce response, one partition's leader down),
//! injected with librdkafka's built-in mock cluster (hosted in this test process; the
//! relay binary connects to it over TCP).
//! The mock has no CreateTopics, so the relay runs with `create_topics = false` here
//! and each test creates its topics in the mock first (the mock would also create a
//! topic on a metadata request that allows it, but the relay's admin client does not:
//! with `create_topics = false` it only looks).

use outbox_relay_harness as support;

use std::time::Duration;

use outbox_relay::metrics::{OLDEST_UNDELIVERED_SECONDS, RESTARTS_TOTAL};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use support::kafka::{consume, read_all};
use support::outbox::{
    cluster_with_outbox, kafka_config, metric, plain, start_streaming, with_metrics, SLOT, WAIT,
};
use support::{PgCluster, PgOptions, RelayProcess};

const DEAD_LETTER: &str = "outbox.dead-letter";

/// A mock cluster of `brokers` with `topics` (one partition each) already in it.
fn mock_with(brokers: i32, topics: &[&str]) -> MockCluster<'static, DefaultProducerContext> {
    let mock = MockCluster::new(brokers).expect("mock cluster");
    for topic in topics {
        mock.create_topic(topic, 1, 1)
            .unwrap_or_else(|e| panic!("creating {topic} in the mock: {e}"));
    }
    mock
}

/// A relay on `mock` (no topic creation), with `dead_letter` and extra `[outbox]` lines.
fn mock_config(pg: &PgCluster, bootstrap: &str, outbox: &str, dead_letter: Option<&str>) -> String {
    kafka_config(pg, bootstrap, outbox, dead_letter, &[])
        .replace("[kafka]\n", "[kafka]\ncreate_topics = false\n")
}

/// Waits until the relay has restarted its pipeline at least once (a rebuilt producer
/// resends from the acknowledged position).
fn wait_restarted(relay: &RelayProcess, metrics_port: u16) {
    relay.wait_metric(
        metrics_port,
        RESTARTS_TOTAL,
        "a restart (the producer rebuilt)",
        WAIT,
        |restarts| restarts >= 1,
    );
}

/// Inserts one event of aggregate type `kind` with id `id`.
fn insert(pg: &PgCluster, id: &str, kind: &str) {
    pg.client_db("app")
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES ($1::text::uuid, $2, 'o', 'T', '{\"n\": 1}')",
            &[&id, &kind],
        )
        .unwrap();
}

fn wait_acknowledged_through_now(pg: &PgCluster) {
    let current = pg.current_wal_lsn();
    support::wait_until("everything written so far is acknowledged", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= current
    });
}

/// The high watermark of one partition (the watermarks of all partitions, which
/// `read_all` needs, cannot be had while a leader is down).
fn high_watermark(bootstrap: &str, topic: &str, partition: i32) -> i64 {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("a metadata client");
    let (_, high) = client
        .fetch_watermarks(topic, partition, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("watermarks of {topic}/{partition}: {e}"));
    high
}

fn assert_running(relay: &RelayProcess) {
    assert_eq!(
        relay.exit_status(),
        None,
        "the relay keeps running; stderr:\n{}",
        relay.stderr_tail()
    );
}

#[test]
fn a_fatal_producer_error_rebuilds_the_producer_and_resends() {
    let mock = mock_with(1, &["outbox.event.fatal"]);
    let pg = cluster_with_outbox(PgOptions::default());
    // The first producer id request fails with an error librdkafka treats as fatal for
    // an idempotent producer; the rebuilt producer gets one.
    mock.request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED],
    );
    let (config, port) = with_metrics(&mock_config(&pg, &mock.bootstrap_servers(), "", None));
    let relay = start_streaming(&config);
    insert(&pg, "00000000-0000-0000-0000-0000000000aa", "fatal");
    wait_restarted(&relay, port);
    let records = consume(&mock.bootstrap_servers(), &["outbox.event.fatal"], 1, WAIT);
    assert!(
        records
            .iter()
            .any(|r| r.header("id").as_deref() == Some("00000000-0000-0000-0000-0000000000aa")),
        "the event is delivered by the rebuilt producer: {records:?}"
    );
    wait_acknowledged_through_now(&pg);
    assert_running(&relay);
}

/// An error that is not the record's fault (here `NOT_CONTROLLER` in the produce
/// response, which librdkafka does not retry itself) rebuilds the producer and sends
/// the event again: it reaches its topic, and nothing goes to the dead-letter topic.
#[test]
fn a_transient_produce_error_is_retried_not_dead_lettered() {
    let mock = mock_with(1, &["outbox.event.transient", DEAD_LETTER]);
    let pg = cluster_with_outbox(PgOptions::default());
    let (config, port) = with_metrics(&mock_config(
        &pg,
        &mock.bootstrap_servers(),
        "",
        Some(DEAD_LETTER),
    ));
    let relay = start_streaming(&config);
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_CONTROLLER],
    );
    let id = "00000000-0000-0000-0000-0000000000b1";
    insert(&pg, id, "transient");
    wait_acknowledged_through_now(&pg);
    // Acknowledged means settled: the event, or its dead letter, is in Kafka now.
    let dead = read_all(&mock.bootstrap_servers(), &[DEAD_LETTER]);
    assert!(dead.is_empty(), "nothing is dead-lettered: {dead:?}");
    let records = read_all(&mock.bootstrap_servers(), &["outbox.event.transient"]);
    assert_eq!(
        records.first().and_then(|r| r.header("id")).as_deref(),
        Some(id),
        "the event reached its own topic: {records:?}"
    );
    // Retried by the relay (not silently by librdkafka): it rebuilt the producer.
    wait_restarted(&relay, port);
    assert_running(&relay);
}

/// Authorization is not the record's fault either, and no retry fixes it: the relay
/// stops, says which ACL to grant, and acknowledges nothing.
#[test]
fn topic_authorization_failed_stops_the_relay_unacknowledged() {
    let mock = mock_with(1, &["outbox.event.secret", DEAD_LETTER]);
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&mock_config(
        &pg,
        &mock.bootstrap_servers(),
        "",
        Some(DEAD_LETTER),
    ));
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    insert(&pg, "00000000-0000-0000-0000-0000000000c1", "secret");
    let after = pg.current_wal_lsn();
    let status = relay.wait_exit(WAIT);
    let stderr = plain(&relay.stderr());
    assert_eq!(status.code(), Some(1), "a definite error:\n{stderr}");
    assert!(
        stderr.contains("outbox.event.secret"),
        "names the topic:\n{stderr}"
    );
    assert!(
        stderr.contains("WRITE") && stderr.contains("principal"),
        "says which ACL to grant:\n{stderr}"
    );
    let confirmed = pg.slot_confirmed_flush_lsn(SLOT).unwrap();
    assert!(
        confirmed < after,
        "the event is not acknowledged ({confirmed:X}, written by {after:X})"
    );
    let dead = read_all(&mock.bootstrap_servers(), &[DEAD_LETTER]);
    assert!(dead.is_empty(), "nothing is dead-lettered: {dead:?}");
}

/// A dead-letter record refused for its size goes again without its value, and says
/// so in a `value.dropped` header; the original reason stays in `error`.
#[test]
fn a_dead_letter_refused_for_size_goes_without_its_value_saying_so() {
    let mock = mock_with(1, &["outbox.event.sized", DEAD_LETTER]);
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&mock_config(
        &pg,
        &mock.bootstrap_servers(),
        "",
        Some(DEAD_LETTER),
    ));
    // The event's produce request, then its dead-letter record's.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
        ],
    );
    let id = "00000000-0000-0000-0000-0000000000d1";
    insert(&pg, id, "sized");
    let dead = consume(&mock.bootstrap_servers(), &[DEAD_LETTER], 1, WAIT);
    let letter = &dead[0];
    assert_eq!(letter.header("id").as_deref(), Some(id));
    assert!(
        letter
            .header("error")
            .is_some_and(|e| e.contains("too large")),
        "{letter:?}"
    );
    assert_eq!(letter.value, None);
    let dropped = letter
        .header("value.dropped")
        .expect("a value.dropped header");
    assert!(dropped.contains("too large"), "says why: {dropped}");
    wait_acknowledged_through_now(&pg);
    assert_running(&relay);
}

/// Any other failure of a dead-letter record is not a reason to strip it: a transient
/// one is retried from the acknowledged position (and here the event then reaches its
/// own topic); the dead-letter topic never gets a record without its value.
#[test]
fn a_dead_letter_failing_transiently_is_retried_not_stripped() {
    let mock = mock_with(1, &["outbox.event.flaky", DEAD_LETTER]);
    let pg = cluster_with_outbox(PgOptions::default());
    let (config, port) = with_metrics(&mock_config(
        &pg,
        &mock.bootstrap_servers(),
        "",
        Some(DEAD_LETTER),
    ));
    let relay = start_streaming(&config);
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_CONTROLLER,
        ],
    );
    let id = "00000000-0000-0000-0000-0000000000e1";
    insert(&pg, id, "flaky");
    wait_acknowledged_through_now(&pg);
    for letter in read_all(&mock.bootstrap_servers(), &[DEAD_LETTER]) {
        assert!(
            letter.value.is_some(),
            "a dead-letter record lost its value: {letter:?}"
        );
    }
    let records = read_all(&mock.bootstrap_servers(), &["outbox.event.flaky"]);
    assert_eq!(
        records.first().and_then(|r| r.header("id")).as_deref(),
        Some(id),
        "resent from the acknowledged position, the event reached its own topic: {records:?}"
    );
    wait_restarted(&relay, port);
    assert_running(&relay);
}

/// One partition's leader is down while the other partition delivers: the oldest
/// undelivered event ages, the metric shows it, and after `stall_release_ms` the relay
/// lets the replication connection go, although deliveries never stopped elsewhere.
#[test]
fn a_stuck_partition_is_seen_while_others_deliver() {
    let mock = MockCluster::new(2).expect("mock cluster");
    let topic = "outbox.event.stuck";
    mock.create_topic(topic, 2, 1).expect("creating the topic");
    mock.partition_leader(topic, 0, Some(1))
        .expect("leader of 0");
    mock.partition_leader(topic, 1, Some(2))
        .expect("leader of 1");
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox ADD COLUMN part int NOT NULL DEFAULT 0")
        .unwrap();
    let (config, port) = with_metrics(
        &mock_config(
            &pg,
            &mock.bootstrap_servers(),
            "additional = [\"part:partition\"]",
            None,
        )
        .replace(
            "status_interval_ms = 200\n",
            "status_interval_ms = 200\n[relay]\nstall_release_ms = 3000\n",
        ),
    );
    let relay = start_streaming(&config);
    let mut client = pg.client_db("app");
    let mut insert_on = |partition: i32| {
        client
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, part)
                 VALUES ('stuck', 'o', 'T', '{}', $1)",
                &[&partition],
            )
            .unwrap();
    };
    insert_on(0);
    consume(&mock.bootstrap_servers(), &[topic], 1, WAIT);
    mock.broker_down(2).expect("broker 2 down");
    insert_on(1);
    let mut oldest_seen = 0;
    let mut delivered_meanwhile = 0;
    support::wait_until(
        "the relay releases the connection for the stuck partition",
        WAIT,
        || {
            // Partition 0 keeps delivering all along.
            insert_on(0);
            delivered_meanwhile += 1;
            if let Some(age) = metric(port, OLDEST_UNDELIVERED_SECONDS) {
                oldest_seen = oldest_seen.max(age);
            }
            // Releasing the connection restarts the pipeline.
            metric(port, RESTARTS_TOTAL).is_some_and(|restarts| restarts >= 1)
        },
    );
    assert!(
        oldest_seen >= 1,
        "{OLDEST_UNDELIVERED_SECONDS} showed the stuck event (max {oldest_seen})"
    );
    // What the operator reads: why the connection was let go (logged with the restart).
    relay.wait_for_stderr("the oldest undelivered event has waited", WAIT);
    let partition_0 = high_watermark(&mock.bootstrap_servers(), topic, 0);
    assert!(
        partition_0 > 1,
        "partition 0 delivered meanwhile ({partition_0} records, {delivered_meanwhile} written)"
    );
    // The stuck event is not acknowledged, and arrives once its partition is back.
    mock.broker_up(2).expect("broker 2 up");
    let end = pg.current_wal_lsn();
    support::wait_until(
        "everything acknowledged once the leader is back",
        WAIT,
        || pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end,
    );
    assert!(
        high_watermark(&mock.bootstrap_servers(), topic, 1) >= 1,
        "the stuck event arrived"
    );
    assert_running(&relay);
}
