//! The table-less outbox end to end against a real PostgreSQL (PostgreSQL 14 or later;
//! `.ci/pg-versions` runs this file on each): events written with
//! `pg_logical_emit_message` come out of the relay's stdout sink routed by prefix, with
//! the envelope's key and headers, in transaction order among table events, never from a
//! rolled-back transaction, and nothing is lost across `kill -9`.

use outbox_relay_harness as support;

use std::collections::BTreeSet;

use serde_json::{json, Value};
use support::outbox::{cluster_with_outbox, with_metrics, PUBLICATION, SLOT, WAIT};
use support::{PgCluster, PgOptions, RelayProcess};

/// A relay config: the outbox table on unless `table_less`, and `[messages]` with `body`.
fn config(pg: &PgCluster, table_less: bool, body: &str) -> String {
    let outbox = if table_less {
        "[outbox]\nenabled = false\n"
    } else {
        "[outbox]\ntable = \"public.outbox\"\n"
    };
    format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"{PUBLICATION}\"\n\
         status_interval_ms = 200\n{outbox}[sink]\ntype = \"stdout\"\n[messages]\n{body}\n",
        pg.url("postgres", None, "app")
    )
}

const PREFIXES: &str =
    "prefixes = [\"orders\", \"sentinel\"]\ntopics = [\"payments=payments.v1\"]\n";

fn start(pg: &PgCluster, config: &str) -> RelayProcess {
    let relay = RelayProcess::start(config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    relay
}

fn parse(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"))
}

/// `SELECT pg_logical_emit_message(true, prefix, content)` as a statement.
fn emit(prefix: &str, content: &str) -> String {
    format!(
        "SELECT pg_logical_emit_message(true, '{}', '{}');",
        prefix.replace('\'', "''"),
        content.replace('\'', "''")
    )
}

/// A sentinel message, then wait for it: every line before it is all the relay had to
/// say (no fixed sleeps).
fn sentinel(pg: &PgCluster, relay: &RelayProcess, expected_before: usize) -> Vec<Value> {
    pg.client_db("app")
        .batch_execute(&emit("sentinel", r#"{"id":"sentinel","payload":{}}"#))
        .unwrap();
    let lines = relay.wait_for_lines(expected_before + 1, WAIT);
    assert_eq!(
        lines.len(),
        expected_before + 1,
        "expected exactly {expected_before} lines before the sentinel: {lines:#?}"
    );
    let values: Vec<Value> = lines.iter().map(|l| parse(l)).collect();
    assert_eq!(values.last().unwrap()["headers"]["id"], "sentinel");
    values
}

#[test]
fn messages_are_routed_by_prefix_with_the_envelopes_key_and_headers() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start(&pg, &config(&pg, false, PREFIXES));
    let mut client = pg.client_db("app");
    client
        .batch_execute(&format!(
            "BEGIN; {} {} {} {} COMMIT;",
            emit(
                "orders",
                r#"{"id":"e1","key":"order-7","headers":{"type":"OrderCreated","v":2},"payload":{"total":12.5,"big":123456789012345678901234567890}}"#
            ),
            emit("unrelated", r#"{"id":"x","payload":1}"#),
            emit("payments", "plain text, no envelope"),
            emit("orders.sub", r#"{"id":"not-relayed","payload":1}"#),
        ))
        .unwrap();
    let lines = sentinel(&pg, &relay, 2);
    let order = &lines[0];
    assert_eq!(order["topic"], "outbox.event.orders");
    assert_eq!(order["key"], "order-7");
    assert_eq!(
        order["headers"],
        json!({"id": "e1", "type": "OrderCreated", "v": "2"})
    );
    assert_eq!(order["value"]["total"], json!(12.5));
    let raw = relay.lines()[0].clone();
    assert!(
        raw.contains("123456789012345678901234567890"),
        "the payload is written as it was, big numbers intact: {raw}"
    );
    let payment = &lines[1];
    assert_eq!(payment["topic"], "payments.v1");
    assert_eq!(payment["value"], "plain text, no envelope");
    let id = payment["headers"]["id"].as_str().unwrap();
    assert!(
        id.contains('/'),
        "no envelope: the id is the message's LSN: {id}"
    );
    assert_eq!(payment["key"], id, "the key defaults to the event id");
    assert_eq!(payment["lsn"], id);
}

#[test]
fn rolled_back_messages_are_never_delivered() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start(&pg, &config(&pg, false, PREFIXES));
    let mut client = pg.client_db("app");
    client
        .batch_execute(&format!(
            "BEGIN; {} ROLLBACK;",
            emit("orders", r#"{"id":"rolled-1","payload":1}"#)
        ))
        .unwrap();
    // A subtransaction rolled back inside a committed transaction: its message too.
    client
        .batch_execute(&format!(
            "BEGIN; {} SAVEPOINT s; {} ROLLBACK TO SAVEPOINT s; COMMIT;",
            emit("orders", r#"{"id":"kept","payload":1}"#),
            emit("orders", r#"{"id":"rolled-2","payload":1}"#),
        ))
        .unwrap();
    let lines = sentinel(&pg, &relay, 1);
    assert_eq!(lines[0]["headers"]["id"], "kept");
}

#[test]
fn table_events_and_messages_in_one_transaction_keep_their_order() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start(&pg, &config(&pg, false, PREFIXES));
    let mut client = pg.client_db("app");
    let mut expected = Vec::new();
    let mut sql = String::from("BEGIN;");
    for n in 0..10 {
        if n % 3 == 0 {
            sql.push_str(&format!(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('00000000-0000-0000-0000-{n:012}', 'table', 'a', 'T', '{{}}');"
            ));
            expected.push(format!("00000000-0000-0000-0000-{n:012}"));
        } else {
            sql.push_str(&emit(
                "orders",
                &format!(r#"{{"id":"m{n}","payload":{n}}}"#),
            ));
            expected.push(format!("m{n}"));
        }
    }
    sql.push_str("COMMIT;");
    client.batch_execute(&sql).unwrap();
    let lines = sentinel(&pg, &relay, 10);
    let ids: Vec<&str> = lines[..10]
        .iter()
        .map(|v| v["headers"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, expected, "in the order written");
}

#[test]
fn non_transactional_messages_are_refused_by_default_and_the_stream_goes_on() {
    let pg = cluster_with_outbox(PgOptions::default());
    let (config, port) = with_metrics(&config(&pg, false, PREFIXES));
    let relay = start(&pg, &config);
    let mut client = pg.client_db("app");
    client
        .batch_execute(&format!(
            "{} SELECT pg_logical_emit_message(false, 'orders', '{{\"id\":\"nontx\",\"payload\":1}}'); {}",
            emit("orders", r#"{"id":"before","payload":1}"#),
            emit("orders", r#"{"id":"after","payload":1}"#),
        ))
        .unwrap();
    let lines = sentinel(&pg, &relay, 2);
    assert_eq!(lines[0]["headers"]["id"], "before");
    assert_eq!(lines[1]["headers"]["id"], "after");
    relay.wait_metric(
        port,
        outbox_relay::metrics::MESSAGES_REFUSED_TOTAL,
        "one refused message",
        WAIT,
        |n| n == 1,
    );
    relay.wait_for_stderr("non-transactional message refused", WAIT);
    let written = pg.current_wal_lsn();
    support::wait_until(
        "the slot is acknowledged past the refused message",
        WAIT,
        || pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= written,
    );
}

#[test]
fn non_transactional_messages_are_delivered_when_opted_in_and_not_replayed() {
    let pg = cluster_with_outbox(PgOptions::default());
    let config = config(
        &pg,
        true,
        &format!("{PREFIXES}non_transactional = \"deliver\"\n"),
    );
    let relay = start(&pg, &config);
    let mut client = pg.client_db("app");
    // Delivered even though the writer's transaction rolls back: the documented caveat.
    client
        .batch_execute(
            "BEGIN; SELECT pg_logical_emit_message(false, 'orders', '{\"id\":\"nontx\",\"payload\":1}'); ROLLBACK;",
        )
        .unwrap();
    let lines = sentinel(&pg, &relay, 1);
    assert_eq!(lines[0]["headers"]["id"], "nontx");
    assert_eq!(lines[0]["topic"], "outbox.event.orders");
    let written = pg.current_wal_lsn();
    support::wait_until("the slot is acknowledged past the messages", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= written
    });
    relay.kill9();
    relay.wait_exit(WAIT);
    let relay = start(&pg, &config);
    let lines = sentinel(&pg, &relay, 0);
    assert_eq!(lines.len(), 1, "nothing replayed: {lines:?}");
}

#[test]
fn malformed_envelopes_and_oversize_messages_become_dead_letters() {
    let pg = cluster_with_outbox(PgOptions::default());
    let config = format!(
        "{}max_bytes = 100\n[dead_letter]\ntopic = \"dead\"\n",
        config(&pg, false, PREFIXES)
    );
    let relay = start(&pg, &config);
    pg.client_db("app")
        .batch_execute(&format!(
            "{} {}",
            emit("orders", r#"{"id":"bad","payload":1,"header":{}}"#),
            emit("orders", &"x".repeat(101)),
        ))
        .unwrap();
    let lines = sentinel(&pg, &relay, 2);
    for line in &lines[..2] {
        assert_eq!(line["topic"], "dead", "{line}");
    }
    let stderr = relay.stderr();
    assert!(
        stderr.contains("\\\"header\\\"") || stderr.contains("\"header\""),
        "{stderr}"
    );
    assert!(stderr.contains("max_bytes"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Messages only, no outbox table: the relay creates an empty publication. Writers keep
/// writing while the relay is killed with `kill -9` twice; every event id arrives.
#[test]
fn a_table_less_relay_loses_nothing_across_kill_9() {
    let pg = PgCluster::start_with(PgOptions::default());
    pg.batch_execute("CREATE DATABASE app");
    let config = config(&pg, true, PREFIXES);
    let mut relay = start(&pg, &config);
    let mut client = pg.client_db("app");
    let mut written = Vec::new();
    let mut seen = BTreeSet::new();
    for round in 0..3 {
        for txn in 0..40 {
            let mut sql = String::from("BEGIN;");
            for n in 0..5 {
                let id = format!("r{round}-t{txn}-n{n}");
                sql.push_str(&emit(
                    "orders",
                    &format!(r#"{{"id":"{id}","payload":{n}}}"#),
                ));
                written.push(id);
            }
            sql.push_str("COMMIT;");
            client.batch_execute(&sql).unwrap();
            if txn == 15 && round < 2 {
                // Stopped, then killed: what is written meanwhile is unacknowledged.
                relay.pause();
            }
            if txn == 20 && round < 2 {
                relay.kill9();
                relay.wait_exit(WAIT);
                seen.extend(ids(&relay.lines()));
                relay = RelayProcess::start(&config);
            }
        }
    }
    let lines = sentinel_lines(&pg, &relay);
    seen.extend(ids(&lines));
    let missing: Vec<&String> = written.iter().filter(|id| !seen.contains(*id)).collect();
    assert!(missing.is_empty(), "lost across kill -9: {missing:?}");
    let publication_tables: i64 = pg
        .client_db("app")
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1",
            &[&PUBLICATION],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        publication_tables, 0,
        "the relay's publication has no table"
    );
}

/// The sentinel, waited for by id (the relay may replay what it had not acknowledged).
fn sentinel_lines(pg: &PgCluster, relay: &RelayProcess) -> Vec<String> {
    pg.client_db("app")
        .batch_execute(&emit("sentinel", r#"{"id":"sentinel","payload":{}}"#))
        .unwrap();
    support::wait_until("the sentinel arrives", WAIT, || {
        relay.lines().iter().any(|l| l.contains("\"sentinel\""))
    });
    relay.lines()
}

fn ids(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["headers"]["id"].as_str().map(str::to_owned))
        .collect()
}

/// PostgreSQL 13's pgoutput has no messages option: the relay says so, naming the
/// version, instead of streaming without them.
#[test]
fn postgresql_13_is_refused_with_the_version_named() {
    let pg = PgCluster::start_with(PgOptions {
        bindir: Some(PgCluster::bindir_of_major(13)),
        ..PgOptions::default()
    });
    pg.batch_execute("CREATE DATABASE app");
    let (status, _stdout, stderr) = support::run_relay_to_exit(&config(&pg, true, PREFIXES), WAIT);
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("PostgreSQL 13") && stderr.contains("PostgreSQL 14 or later"),
        "{stderr}"
    );
}

/// `init --apply`, `check` and `run` agree on a messages-only deployment: init creates
/// the state table, a publication without tables and the roles, and takes
/// `pg_logical_emit_message` from PUBLIC for the app role alone; check finds nothing to
/// fix; the relay runs on it and relays the app role's message.
#[test]
fn init_check_and_run_agree_on_a_table_less_deployment() {
    let pg = PgCluster::start_with(PgOptions::default());
    pg.batch_execute("CREATE DATABASE app");
    let config = config(&pg, true, PREFIXES);
    let admin = pg.url("postgres", None, "app");
    let (status, stdout, stderr) =
        support::relay::run_command(&["init", "--apply", "--admin-url", &admin], &config, WAIT);
    assert!(status.success(), "init: {stdout}\n{stderr}");
    let (status, stdout, stderr) = support::relay::run_command(&["check"], &config, WAIT);
    assert!(status.success(), "check: {stdout}\n{stderr}");
    assert!(
        stdout.contains("publishes no table") || stdout.contains("will create it"),
        "{stdout}"
    );
    let mut client = pg.client_db("app");
    client.batch_execute("CREATE ROLE other LOGIN").unwrap();
    let denied = client.batch_execute(
        "SET ROLE other; SELECT pg_logical_emit_message(true, 'orders', 'x'); RESET ROLE",
    );
    assert!(
        matches!(&denied, Err(e) if format!("{e:?}").contains("permission denied")),
        "PUBLIC may no longer emit messages (postgres::Error shows the server's message in Debug): {denied:?}"
    );
    let mut client = pg.client_db("app");
    let relay = start(&pg, &config);
    client
        .batch_execute(&format!(
            "SET ROLE app_writer; {} RESET ROLE",
            emit("orders", r#"{"id":"from-app","payload":1}"#)
        ))
        .unwrap();
    let lines = sentinel(&pg, &relay, 1);
    assert_eq!(lines[0]["headers"]["id"], "from-app");
}
