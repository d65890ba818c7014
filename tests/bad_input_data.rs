//! The bad-input catalogue, part 2: bad rows. Each case writes one kind of bad outbox
//! row between good ones and asserts that the event is delivered as specified or
//! dead-lettered with its reason, that nothing is lost (the good rows around it arrive,
//! the slot moves past it only once it is settled), and that the relay keeps running
//! where it should. Part 1 (`bad_input_config.rs`) covers configuration and connection.

use outbox_relay_harness as support;

use std::time::Duration;

use serde_json::Value;
use support::kafka::{consume, KafkaBroker, Record};
use support::outbox::{
    cluster_with_app_db, cluster_with_outbox, kafka_config, plain, start_streaming, stdout_config,
    SLOT, WAIT,
};
use support::{wait_until, PgCluster, PgOptions, RelayProcess};

const DEAD_LETTER: &str = "outbox.dead-letter";
/// Exit code of a relay that stopped on a definite error (a panic would be 101).
const EXIT_FAILURE: i32 = 1;
/// A payload well over librdkafka's default `message.max.bytes` (1,000,000).
const BIG_PAYLOAD_BYTES: usize = 5 * 1024 * 1024;

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(bytes)))
}

/// The outbox table without constraints, so every bad value can be written.
fn loose_outbox(pg: &PgCluster) {
    pg.client_db("app")
        .batch_execute(
            "CREATE TABLE outbox (id text, aggregatetype text, aggregateid text, type text, payload text)",
        )
        .unwrap();
}

/// Inserts one row into the default outbox table; returns its generated id.
fn insert(pg: &PgCluster, aggregatetype: &str, payload_sql: &str) -> String {
    pg.client_db("app")
        .query_one(
            &format!(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
                 VALUES ($1, 'agg-1', 'Happened', {payload_sql}) RETURNING id::text"
            ),
            &[&aggregatetype],
        )
        .unwrap_or_else(|e| panic!("inserting a {aggregatetype:?} row: {e}"))
        .get(0)
}

/// Inserts into the loose table (every column text, NULLs allowed).
fn insert_loose(pg: &PgCluster, id: Option<&str>, route: Option<&str>, payload: Option<&str>) {
    pg.client_db("app")
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'agg-1', 'Happened', $3)",
            &[&id, &route, &payload],
        )
        .unwrap();
}

/// The good events before and after the bad one both arrive, in order.
fn assert_good_events_around(broker: &KafkaBroker, topic: &str, ids: &[&str]) {
    let records = consume(&broker.bootstrap(), &[topic], ids.len(), WAIT);
    let got: Vec<String> = records.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(
        got, ids,
        "the good events around the bad one, once each, in order"
    );
}

/// The dead-letter records, exactly `n` of them, each with the standard headers.
fn dead_letters(broker: &KafkaBroker, n: usize) -> Vec<Record> {
    let dead = consume(&broker.bootstrap(), &[DEAD_LETTER], n, WAIT);
    assert_eq!(dead.len(), n, "dead-letter records: {dead:?}");
    for record in &dead {
        assert_eq!(
            record.header("source.table").as_deref(),
            Some("public.outbox")
        );
        let lsn = record.header("source.lsn").expect("source.lsn header");
        assert!(lsn.contains('/'), "source.lsn is an LSN: {lsn}");
        assert!(record.header("error").is_some(), "error header: {record:?}");
    }
    dead
}

/// Waits until the slot has acknowledged everything written so far: the bad event was
/// settled (by its dead-letter record) and did not block the stream.
fn assert_acknowledged_through_now(pg: &PgCluster) {
    let now = pg.current_wal_lsn();
    wait_until("the slot acknowledges past the bad event", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= now
    });
}

fn assert_running(relay: &RelayProcess) {
    assert_eq!(
        relay.exit_status(),
        None,
        "the relay keeps running; stderr:\n{}",
        relay.stderr_tail()
    );
}

// ---------------------------------------------------------------------------------
// A configured column the table lacks
// ---------------------------------------------------------------------------------

#[test]
fn missing_payload_column_with_a_dead_letter_topic_dead_letters_the_row() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "payload_column = \"body\"",
        Some(DEAD_LETTER),
        &[],
    ));
    insert(&pg, "order", "'{\"n\": 1}'");
    let dead = dead_letters(&broker, 1);
    let error = dead[0].header("error").unwrap();
    for needle in [
        "\"body\"",
        "outbox.payload_column",
        "add the column or change the setting",
    ] {
        assert!(
            error.contains(needle),
            "error header mentions {needle:?}: {error}"
        );
    }
    // The row is kept, as JSON, for reprocessing.
    let row = json(dead[0].value.as_deref().expect("the raw row"));
    assert_eq!(row["aggregatetype"], "order");
    assert_eq!(row["payload"], "{\"n\": 1}");
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

// ---------------------------------------------------------------------------------
// Payloads
// ---------------------------------------------------------------------------------

#[test]
fn null_payload_is_delivered_as_a_null_value_record() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    let before = insert(&pg, "order", "'{\"n\": 1}'");
    let null = insert(&pg, "order", "NULL");
    let after = insert(&pg, "order", "'{\"n\": 3}'");
    let records = consume(&broker.bootstrap(), &["outbox.event.order"], 3, WAIT);
    let ids: Vec<String> = records.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(ids, [before, null.clone(), after], "in order, nothing lost");
    let tombstone = &records[1];
    assert_eq!(tombstone.value, None, "NULL payload → null record value");
    assert_eq!(
        tombstone.key_str().as_deref(),
        Some(null.as_str()),
        "keyed by the event id"
    );
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

#[test]
fn non_json_text_payload_is_delivered_as_its_raw_text_bytes() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox ALTER COLUMN payload TYPE text")
        .unwrap();
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    let text = "not JSON: {unclosed \"quote\\ ünïcode ✓\nsecond line\ttab";
    let id = pg
        .client_db("app")
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('note', 'n-1', 'Written', $1) RETURNING id::text",
            &[&text],
        )
        .unwrap()
        .get::<_, String>(0);
    let records = consume(&broker.bootstrap(), &["outbox.event.note"], 1, WAIT);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].header("id"), Some(id));
    assert_eq!(
        records[0].value.as_deref(),
        Some(text.as_bytes()),
        "the text as stored, byte for byte: not JSON-escaped, not refused"
    );
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

/// A 5 MiB JSON payload built in SQL; returns its text as PostgreSQL stores it.
fn insert_big(pg: &PgCluster) -> (String, String) {
    let row = pg
        .client_db("app")
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('big', 'b-1', 'Huge', jsonb_build_object('blob', repeat('x', $1::int))) \
             RETURNING id::text, payload::text",
            &[&i32::try_from(BIG_PAYLOAD_BYTES).unwrap()],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

#[test]
fn payload_over_message_max_bytes_is_dead_lettered_with_its_headers() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "additional = [\"type:header:eventType\"]",
        Some(DEAD_LETTER),
        &[],
    ));
    let before = insert(&pg, "big", "'{\"n\": 1}'");
    let (big_id, _) = insert_big(&pg);
    let after = insert(&pg, "big", "'{\"n\": 3}'");
    assert_good_events_around(&broker, "outbox.event.big", &[&before, &after]);
    let dead = dead_letters(&broker, 1);
    let letter = &dead[0];
    let error = letter.header("error").unwrap();
    assert!(error.contains("too large"), "what is wrong: {error}");
    assert!(
        error.contains("message.max.bytes"),
        "how to fix it (the limit to raise): {error}"
    );
    // The event's own headers and routing are kept; the value is dropped (it is what
    // cannot be delivered).
    assert_eq!(letter.header("id"), Some(big_id.clone()));
    assert_eq!(letter.key_str(), Some(big_id));
    assert_eq!(letter.header("eventType").as_deref(), Some("Huge"));
    assert_eq!(
        letter.header("source.topic").as_deref(),
        Some("outbox.event.big")
    );
    assert_eq!(letter.value, None, "oversize value dropped, headers kept");
    assert!(
        letter
            .header("value.dropped")
            .is_some_and(|why| why.contains("too large")),
        "and a header says so: {letter:?}"
    );
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

#[test]
fn payload_under_a_raised_message_max_bytes_is_delivered_intact() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "",
        Some(DEAD_LETTER),
        &[("message.max.bytes", "10000000")],
    ));
    let (id, stored) = insert_big(&pg);
    assert!(stored.len() > BIG_PAYLOAD_BYTES);
    let records = consume(&broker.bootstrap(), &["outbox.event.big"], 1, WAIT);
    assert_eq!(records.len(), 1, "one record, no duplicate");
    assert_eq!(records[0].header("id"), Some(id));
    let value = records[0].value.as_deref().expect("a value");
    assert_eq!(value.len(), stored.len(), "all {} bytes", stored.len());
    assert!(value == stored.as_bytes(), "the payload bytes, unchanged");
    assert!(
        consume(
            &broker.bootstrap(),
            &[DEAD_LETTER],
            1,
            Duration::from_secs(3)
        )
        .is_empty(),
        "nothing dead-lettered"
    );
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

// ---------------------------------------------------------------------------------
// Routes Kafka refuses
// ---------------------------------------------------------------------------------

#[test]
fn unicode_aggregate_type_on_kafka_is_dead_lettered_naming_the_topic() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "",
        Some(DEAD_LETTER),
        &[],
    ));
    let before = insert(&pg, "order", "'{\"n\": 1}'");
    let unicode = insert(&pg, "注文", "'{\"note\": \"ünïcode ✓\"}'");
    let after = insert(&pg, "order", "'{\"n\": 3}'");
    assert_good_events_around(&broker, "outbox.event.order", &[&before, &after]);
    let dead = dead_letters(&broker, 1);
    let letter = &dead[0];
    let error = letter.header("error").unwrap();
    assert!(
        error.contains("outbox.event.注文"),
        "names the topic: {error}"
    );
    assert!(
        error.contains("ASCII letters, digits"),
        "says what a topic name may contain: {error}"
    );
    assert_eq!(letter.header("id"), Some(unicode));
    assert_eq!(
        letter.header("source.topic").as_deref(),
        Some("outbox.event.注文")
    );
    assert_eq!(
        json(letter.value.as_deref().expect("the payload")),
        serde_json::json!({"note": "ünïcode ✓"}),
        "the payload is kept intact"
    );
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

#[test]
fn unicode_aggregate_type_on_stdout_is_printed_intact() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&stdout_config(&pg));
    let id = insert(&pg, "注文", "'{\"note\": \"ünïcode ✓ 🚚\"}'");
    let lines = relay.wait_for_lines(1, WAIT);
    let event: Value = serde_json::from_str(&lines[0])
        .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {}", lines[0]));
    assert_eq!(
        event["topic"], "outbox.event.注文",
        "no Kafka naming rules on stdout"
    );
    assert_eq!(event["headers"]["id"], id.as_str());
    assert_eq!(event["value"], serde_json::json!({"note": "ünïcode ✓ 🚚"}));
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

/// A `json` payload keeps its input's formatting, and a text payload may hold a
/// pretty-printed document: either way each event is one stdout line.
#[test]
fn pretty_printed_json_payloads_are_one_line_each_on_stdout() {
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox ALTER COLUMN payload TYPE json USING payload::json")
        .unwrap();
    let relay = start_streaming(&stdout_config(&pg));
    let pretty = "E'{\\n  \"order\": 7,\\n  \"lines\": [\\n    \"a\\\\nb\"\\n  ]\\n}'";
    let first = insert(&pg, "json", pretty);
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox ALTER COLUMN payload TYPE text")
        .unwrap();
    let second = insert(&pg, "text", pretty);
    let lines = relay.wait_for_lines(2, WAIT);
    assert_eq!(lines.len(), 2, "two events, two lines: {lines:#?}");
    for (line, id) in lines.iter().zip([&first, &second]) {
        let event: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
        assert_eq!(event["headers"]["id"], id.as_str());
        assert_eq!(
            event["value"],
            serde_json::json!({"order": 7, "lines": ["a\nb"]})
        );
    }
    assert_running(&relay);
}

#[test]
fn route_values_making_illegal_topic_names_are_dead_lettered_naming_each() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "",
        Some(DEAD_LETTER),
        &[],
    ));
    let long = "x".repeat(240);
    let bad = ["has space", "a/b", long.as_str()];
    let before = insert(&pg, "order", "'{\"n\": 1}'");
    let bad_ids: Vec<String> = bad.iter().map(|route| insert(&pg, route, "'{}'")).collect();
    let after = insert(&pg, "order", "'{\"n\": 3}'");
    assert_good_events_around(&broker, "outbox.event.order", &[&before, &after]);
    let dead = dead_letters(&broker, bad.len());
    for ((route, id), letter) in bad.iter().zip(&bad_ids).zip(&dead) {
        let topic = format!("outbox.event.{route}");
        let error = letter.header("error").unwrap();
        assert_eq!(letter.header("id").as_ref(), Some(id), "in commit order");
        assert!(error.contains(&topic), "names the topic {topic:?}: {error}");
    }
    let reasons: Vec<String> = dead.iter().filter_map(|r| r.header("error")).collect();
    assert!(
        reasons[0].contains("' '"),
        "names the bad character: {}",
        reasons[0]
    );
    assert!(
        reasons[1].contains("'/'"),
        "names the bad character: {}",
        reasons[1]
    );
    assert!(
        reasons[2].contains("249"),
        "names the length limit: {}",
        reasons[2]
    );
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

/// A route value that makes the dead-letter topic's own name: the event is not sent
/// there as if it were a dead letter; it is dead-lettered, with an `error` header
/// saying why and its value kept, and when that record is too large for Kafka it goes
/// without its value and a `value.dropped` header says so. (Before: the small event
/// arrived there as a plain record without `error`, and the big one as a bare record
/// without any header saying why.)
#[test]
fn an_event_routed_to_the_dead_letter_topics_own_name_is_dead_lettered_with_the_reason() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_outbox(PgOptions::default());
    let dead_letter = "outbox.event.same";
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "",
        Some(dead_letter),
        &[],
    ));
    let before = insert(&pg, "order", "'{\"n\": 1}'");
    let small = insert(&pg, "same", "'{\"n\": 2}'");
    let big = pg
        .client_db("app")
        .query_one(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('same', 'b-1', 'Huge', jsonb_build_object('blob', repeat('x', 2 * 1024 * 1024))) \
             RETURNING id::text",
            &[],
        )
        .unwrap()
        .get::<_, String>(0);
    let after = insert(&pg, "order", "'{\"n\": 3}'");
    assert_good_events_around(&broker, "outbox.event.order", &[&before, &after]);
    let dead = consume(&broker.bootstrap(), &[dead_letter], 2, WAIT);
    assert_eq!(dead.len(), 2, "{dead:?}");
    for (letter, id) in dead.iter().zip([&small, &big]) {
        assert_eq!(letter.header("id").as_ref(), Some(id), "in commit order");
        let error = letter.header("error").expect("an error header");
        assert!(
            error.contains("the dead-letter topic's own name") && error.contains(dead_letter),
            "says why: {error}"
        );
        assert_eq!(letter.header("source.topic").as_deref(), Some(dead_letter));
    }
    assert_eq!(
        json(
            dead[0]
                .value
                .as_deref()
                .expect("the small event keeps its value")
        ),
        serde_json::json!({"n": 2})
    );
    assert_eq!(dead[0].header("value.dropped"), None);
    assert_eq!(dead[1].value, None, "2 MiB is over message.max.bytes");
    let dropped = dead[1]
        .header("value.dropped")
        .expect("value.dropped says why");
    assert!(dropped.contains("too large"), "{dropped}");
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

// A partition placement beyond the topic's partitions is one record's problem (dead
// letter, or a stop naming the fix): tests/kafka_placement.rs.

// ---------------------------------------------------------------------------------
// NULL id
// ---------------------------------------------------------------------------------

#[test]
fn null_id_is_dead_lettered_with_the_row() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_app_db();
    loose_outbox(&pg);
    let relay = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "",
        Some(DEAD_LETTER),
        &[],
    ));
    insert_loose(&pg, Some("ok-1"), Some("order"), Some("{\"n\":1}"));
    insert_loose(&pg, None, Some("order"), Some("{\"n\":2}"));
    insert_loose(&pg, Some("ok-3"), Some("order"), Some("{\"n\":3}"));
    assert_good_events_around(&broker, "outbox.event.order", &["ok-1", "ok-3"]);
    let dead = dead_letters(&broker, 1);
    let error = dead[0].header("error").unwrap();
    assert!(
        error.contains("\"id\"") && error.contains("outbox.id_column") && error.contains("NULL"),
        "names the column, its setting and the problem: {error}"
    );
    let row = json(dead[0].value.as_deref().expect("the raw row"));
    assert_eq!(row["id"], Value::Null);
    assert_eq!(row["payload"], "{\"n\":2}");
    assert_running(&relay);
    assert_acknowledged_through_now(&pg);
}

/// The `outbox row at X/Y` position the relay stopped on.
fn stopped_at(stderr: &str) -> String {
    let start = stderr
        .find("outbox row at ")
        .unwrap_or_else(|| panic!("no `outbox row at` in:\n{stderr}"))
        + "outbox row at ".len();
    stderr[start..]
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn null_id_without_a_dead_letter_topic_stops_unacknowledged_every_time() {
    let broker = KafkaBroker::shared();
    let pg = cluster_with_app_db();
    loose_outbox(&pg);
    let config = kafka_config(&pg, &broker.bootstrap(), "", None, &[]);
    let relay = start_streaming(&config);
    insert_loose(&pg, Some("ok-1"), Some("order"), Some("{}"));
    consume(&broker.bootstrap(), &["outbox.event.order"], 1, WAIT);
    assert_acknowledged_through_now(&pg);
    insert_loose(&pg, None, Some("order"), Some("{\"n\":2}"));
    let after_bad = pg.current_wal_lsn();
    let status = relay.wait_exit(WAIT);
    let stderr = plain(&relay.stderr());
    assert_eq!(
        status.code(),
        Some(EXIT_FAILURE),
        "{status}; stderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    for needle in ["\"id\"", "outbox.id_column", "NULL", "[dead_letter]"] {
        assert!(stderr.contains(needle), "mentions {needle:?}:\n{stderr}");
    }
    let confirmed = pg.slot_confirmed_flush_lsn(SLOT).expect("slot");
    assert!(
        confirmed < after_bad,
        "the bad row's transaction is not acknowledged ({confirmed:X} >= {after_bad:X})"
    );
    let first_stop = stopped_at(&stderr);

    // Not acknowledged means it comes again: a restarted relay stops on the same row.
    let again = RelayProcess::start(&config);
    let status = again.wait_exit(WAIT);
    let again_stderr = plain(&again.stderr());
    assert_eq!(
        status.code(),
        Some(EXIT_FAILURE),
        "{status}; stderr:\n{again_stderr}"
    );
    assert_eq!(stopped_at(&again_stderr), first_stop, "the same row");
    assert_eq!(
        pg.slot_confirmed_flush_lsn(SLOT),
        Some(confirmed),
        "still not acknowledged"
    );

    // Nothing was lost: with a dead-letter topic the same row is parked and the rest flows.
    let fixed = start_streaming(&kafka_config(
        &pg,
        &broker.bootstrap(),
        "",
        Some(DEAD_LETTER),
        &[],
    ));
    let dead = dead_letters(&broker, 1);
    assert_eq!(dead[0].header("source.lsn"), Some(first_stop));
    assert_eq!(
        json(dead[0].value.as_deref().unwrap())["payload"],
        "{\"n\":2}"
    );
    let delivered = consume(&broker.bootstrap(), &["outbox.event.order"], 1, WAIT);
    assert_eq!(
        delivered.len(),
        1,
        "ok-1 was acknowledged and is not sent again"
    );
    assert_running(&fixed);
    assert_acknowledged_through_now(&pg);
}
