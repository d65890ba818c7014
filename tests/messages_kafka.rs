//! The table-less outbox into a real Apache Kafka: messages written with
//! `pg_logical_emit_message` arrive with the envelope's key and headers, and nothing is
//! lost when the relay is killed with `kill -9` while writers go on.

use outbox_relay_harness as support;

use std::collections::HashSet;

use serde_json::Value;
use support::kafka::{consume, KafkaBroker};
use support::outbox::{kafka_config, start_streaming, SLOT, WAIT};
use support::{PgCluster, PgOptions, RelayProcess};

/// A messages-only relay on Kafka (`[outbox] enabled = false`).
fn config(pg: &PgCluster, bootstrap: &str, messages: &str) -> String {
    format!(
        "{}[messages]\n{messages}\n",
        kafka_config(pg, bootstrap, "enabled = false", None, &[])
    )
}

fn app_cluster() -> PgCluster {
    let pg = PgCluster::start_with(PgOptions::default());
    pg.batch_execute("CREATE DATABASE app");
    pg
}

fn emit(prefix: &str, content: &str) -> String {
    format!(
        "SELECT pg_logical_emit_message(true, '{prefix}', '{}');",
        content.replace('\'', "''")
    )
}

#[test]
fn messages_reach_kafka_with_the_envelopes_key_and_headers() {
    let broker = KafkaBroker::shared();
    let pg = app_cluster();
    let relay = start_streaming(&config(
        &pg,
        &broker.bootstrap(),
        "prefixes = [\"mk_orders\"]\ntopics = [\"mk_payments=msgs.payments\"]",
    ));
    pg.client_db("app")
        .batch_execute(&format!(
            "BEGIN; {} {} {} COMMIT;",
            emit(
                "mk_orders",
                r#"{"id":"o1","key":"order-1","headers":{"type":"OrderCreated"},"payload":{"n":1}}"#
            ),
            emit("mk_other", r#"{"id":"x","payload":1}"#),
            emit("mk_payments", "raw bytes"),
        ))
        .unwrap();
    let records = consume(
        &broker.bootstrap(),
        &["outbox.event.mk_orders", "msgs.payments"],
        2,
        WAIT,
    );
    assert_eq!(records.len(), 2, "{records:?}\n{}", relay.stderr_tail());
    let order = records
        .iter()
        .find(|r| r.topic == "outbox.event.mk_orders")
        .unwrap();
    assert_eq!(order.key_str().as_deref(), Some("order-1"));
    assert_eq!(order.header("id").as_deref(), Some("o1"));
    assert_eq!(order.header("type").as_deref(), Some("OrderCreated"));
    let value: Value = serde_json::from_slice(order.value.as_deref().unwrap()).unwrap();
    assert_eq!(value, serde_json::json!({"n": 1}));
    let payment = records.iter().find(|r| r.topic == "msgs.payments").unwrap();
    assert_eq!(payment.value_str().as_deref(), Some("raw bytes"));
    let id = payment.header("id").unwrap();
    assert!(id.contains('/'), "the LSN as event id: {id}");
    assert_eq!(payment.key_str(), Some(id));
}

/// 6,000 messages in 300 transactions; the relay is killed twice mid-stream (stopped
/// ten transactions before each kill). Every event id reaches Kafka (duplicates
/// allowed: at-least-once).
#[test]
fn kill_9_mid_stream_loses_no_message() {
    let broker = KafkaBroker::start();
    let pg = app_cluster();
    let config = config(&pg, &broker.bootstrap(), "prefixes = [\"kill\"]");
    let mut relay = start_streaming(&config);
    let mut client = pg.client_db("app");
    let mut written = Vec::new();
    for txn in 0..300 {
        let mut sql = String::from("BEGIN;");
        for n in 0..20 {
            let id = format!("t{txn}-n{n}");
            sql.push_str(&emit("kill", &format!(r#"{{"id":"{id}","payload":{n}}}"#)));
            written.push(id);
        }
        sql.push_str("COMMIT;");
        client.batch_execute(&sql).unwrap();
        if txn == 90 || txn == 190 {
            // Stopped, then killed: the transactions written meanwhile are sure to be
            // unacknowledged at the kill.
            relay.pause();
        }
        if txn == 100 || txn == 200 {
            assert!(
                pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) < pg.current_wal_lsn(),
                "messages are unacknowledged at the kill"
            );
            relay.kill9();
            relay.wait_exit(WAIT);
            relay = RelayProcess::start(&config);
        }
    }
    let end = pg.current_wal_lsn();
    support::wait_until("everything acknowledged", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end
    });
    let records = consume(
        &broker.bootstrap(),
        &["outbox.event.kill"],
        written.len(),
        WAIT,
    );
    let seen: HashSet<String> = records.iter().filter_map(|r| r.header("id")).collect();
    let missing: Vec<&String> = written.iter().filter(|id| !seen.contains(*id)).collect();
    support::outbox::report(&format!(
        "messages kill -9 twice: {} messages, {} records, {} duplicates",
        written.len(),
        records.len(),
        records.len() - seen.len()
    ));
    assert!(
        missing.is_empty(),
        "lost: {} e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    drop(relay);
}
