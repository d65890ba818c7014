//! Producer faults no single real broker can be made to produce (a fatal idempotence
//! error), injected with librdkafka's built-in mock cluster (hosted in this test
//! process; the relay binary connects to it over TCP).
//! The mock has no CreateTopics; it creates topics on first metadata request, so the
//! relay runs with `create_topics = false` here.

mod support;

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use support::kafka::consume;
use support::outbox::{cluster_with_outbox, kafka_config, start_streaming, SLOT, WAIT};
use support::PgOptions;

#[test]
fn a_fatal_producer_error_rebuilds_the_producer_and_resends() {
    let mock = MockCluster::new(1).expect("mock cluster");
    let pg = cluster_with_outbox(PgOptions::default());
    // The first producer id request fails with an error librdkafka treats as fatal for
    // an idempotent producer; the rebuilt producer gets one.
    mock.request_errors(
        RDKafkaApiKey::InitProducerId,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED],
    );
    let config = kafka_config(&pg, &mock.bootstrap_servers(), "", None, &[])
        .replace("[kafka]\n", "[kafka]\ncreate_topics = false\n");
    let relay = start_streaming(&config);
    pg.client_db("app")
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES ('00000000-0000-0000-0000-0000000000aa', 'fatal', 'o', 'T', '{\"n\": 1}')",
        )
        .unwrap();
    relay.wait_for_stderr(
        "streaming resumes from the slot's acknowledged position",
        WAIT,
    );
    let records = consume(&mock.bootstrap_servers(), &["outbox.event.fatal"], 1, WAIT);
    assert!(
        records
            .iter()
            .any(|r| r.header("id").as_deref() == Some("00000000-0000-0000-0000-0000000000aa")),
        "the event is delivered by the rebuilt producer: {records:?}"
    );
    let current = pg.current_wal_lsn();
    support::wait_until("the event is acknowledged after the restart", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= current
    });
    assert_eq!(relay.exit_status(), None, "the relay keeps running");
}
