//! A `partition` placement beyond the topic's partitions, against a real PostgreSQL and
//! a real Apache Kafka broker: the one record is a dead letter naming the column, the
//! partition asked and the topic's partition count (or, without a dead-letter topic,
//! the relay stops with that and the fix, the row unacknowledged); the rows around it
//! are delivered once, and the producer is not rebuilt over and over.

use outbox_relay_harness as support;

use outbox_relay::metrics::RESTARTS_TOTAL;
use support::kafka::{consume, read_all, KafkaBroker};
use support::outbox::{
    cluster_with_outbox, kafka_config, start_streaming, with_metrics, SLOT, WAIT,
};
use support::{PgCluster, PgOptions, RelayProcess};

const TOPIC: &str = "outbox.event.placed";
const DEAD_LETTER: &str = "placement.dead-letter";

/// A cluster whose outbox has a `shard` column.
fn cluster_with_shards() -> PgCluster {
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox ADD COLUMN shard int NOT NULL DEFAULT 0")
        .unwrap();
    pg
}

/// The relay's config: `shard` gives the partition, the topic has one partition.
fn placement_config(pg: &PgCluster, bootstrap: &str, dead_letter: Option<&str>) -> String {
    kafka_config(
        pg,
        bootstrap,
        "additional = [\"shard:partition\"]",
        dead_letter,
        &[],
    )
    .replace("[kafka]\n", "[kafka]\ntopic_partitions = 1\n")
}

/// Insert one event (its own transaction) with `shard`; returns its id.
fn insert(pg: &PgCluster, shard: i32) -> String {
    pg.client_db("app")
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, shard)
             VALUES ('placed', 'a', 'T', '{}', $1) RETURNING id::text",
            &[&shard],
        )
        .unwrap()
        .get(0)
}

#[test]
fn a_partition_beyond_the_topic_is_a_dead_letter_and_the_rest_flows_once() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_shards();
    let (config, port) = with_metrics(&placement_config(
        &pg,
        &broker.bootstrap(),
        Some(DEAD_LETTER),
    ));
    let relay = start_streaming(&config);
    let first = insert(&pg, 0);
    consume(&broker.bootstrap(), &[TOPIC], 1, WAIT);
    let bad = insert(&pg, 5);
    let after = insert(&pg, 0);
    let last_commit = pg.current_wal_lsn();

    let dead = consume(&broker.bootstrap(), &[DEAD_LETTER], 1, WAIT);
    let dead_ids: Vec<_> = dead.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(
        dead_ids,
        std::slice::from_ref(&bad),
        "the shard-5 event is the dead letter"
    );
    let reason = dead[0].header("error").expect("an error header");
    for needle in ["partition 5", "1 partition", "\"shard\"", TOPIC] {
        assert!(
            reason.contains(needle),
            "{needle:?} in the reason: {reason}"
        );
    }
    assert_eq!(dead[0].header("source.topic").as_deref(), Some(TOPIC));

    support::wait_until("the slot passes the last event", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= last_commit
    });
    let delivered: Vec<_> = read_all(&broker.bootstrap(), &[TOPIC])
        .iter()
        .filter_map(|r| r.header("id"))
        .collect();
    assert_eq!(
        delivered,
        [first, after],
        "the other events, each once (no producer rebuilds resending them)"
    );
    assert_eq!(
        support::outbox::metric(port, RESTARTS_TOTAL),
        Some(0),
        "no pipeline restart for one record's placement"
    );
    assert_eq!(relay.exit_status(), None, "the relay keeps running");
}

#[test]
fn without_a_dead_letter_topic_a_partition_beyond_the_topic_stops_with_the_fix() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_shards();
    let relay = start_streaming(&placement_config(&pg, &broker.bootstrap(), None));
    let first = insert(&pg, 0);
    consume(&broker.bootstrap(), &[TOPIC], 1, WAIT);
    support::wait_until("the first event is acknowledged", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= pg.current_wal_lsn()
    });
    let before_bad = pg.current_wal_lsn();
    insert(&pg, 5);
    let status = relay.wait_exit(WAIT);
    assert!(!status.success(), "{status}");
    let stderr = relay.stderr();
    for needle in [
        "\"shard\"",
        "partition 5",
        TOPIC,
        "1 partition",
        "partitions",
        "dead_letter",
    ] {
        assert!(stderr.contains(needle), "{needle:?} in: {stderr}");
    }
    assert!(
        !stderr.contains("rebuilding the producer"),
        "a definite error, not a retry: {stderr}"
    );
    let confirmed = pg.slot_confirmed_flush_lsn(SLOT).unwrap();
    assert!(
        confirmed <= before_bad,
        "the shard-5 event is not acknowledged ({confirmed:X} > {before_bad:X})"
    );
    let delivered: Vec<_> = read_all(&broker.bootstrap(), &[TOPIC])
        .iter()
        .filter_map(|r| r.header("id"))
        .collect();
    assert_eq!(delivered, [first]);
    // Not acknowledged means it comes again: a restarted relay stops on the same row.
    let again = RelayProcess::start(&placement_config(&pg, &broker.bootstrap(), None));
    assert!(!again.wait_exit(WAIT).success());
    assert!(again.stderr().contains("partition 5"), "{}", again.stderr());
}
