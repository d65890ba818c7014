use super::*;
use crate::pg::pgoutput::{ColumnValue, PgTimestamp, RelationColumn, TupleData};
use crate::relay::router::config::OutboxConfig;

fn assembler() -> TxnAssembler {
    TxnAssembler::new(
        vec![AssemblerOutbox {
            table: QualifiedName::parse("public.outbox").unwrap(),
            oid: 1,
            router: Router::try_new(&OutboxConfig::default()).expect("default settings are valid"),
            entry: 0,
        }],
        0,
    )
}

fn relation(id: u32, name: &str, columns: &[&str]) -> PgOutputMessage {
    PgOutputMessage::Relation(RelationBody {
        xid: None,
        relation_id: id,
        namespace: "public".into(),
        name: name.into(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|c| RelationColumn {
                is_key: false,
                name: (*c).into(),
                type_oid: 25,
                type_modifier: -1,
            })
            .collect(),
    })
}

fn insert(relation_id: u32, values: &[&str]) -> PgOutputMessage {
    PgOutputMessage::Insert {
        xid: None,
        relation_id,
        new_tuple: TupleData {
            columns: values
                .iter()
                .map(|v| ColumnValue::Text(bytes::Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
        },
    }
}

fn begin() -> PgOutputMessage {
    PgOutputMessage::Begin {
        final_lsn: Lsn(90),
        commit_ts: PgTimestamp(0),
        xid: 7,
    }
}

fn commit(end: u64) -> PgOutputMessage {
    PgOutputMessage::Commit {
        flags: 0,
        commit_lsn: Lsn(end - 8),
        end_lsn: Lsn(end),
        commit_ts: PgTimestamp(0),
    }
}

#[test]
fn assembles_a_transaction_and_routes_only_the_outbox() {
    let mut a = assembler();
    let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
    assert!(matches!(
        a.apply(begin(), Lsn(0)).unwrap(),
        Step::Begin { seq: 0, .. }
    ));
    assert!(matches!(
        a.apply(relation(1, "outbox", &cols), Lsn(0)).unwrap(),
        Step::Nothing
    ));
    assert!(matches!(
        a.apply(relation(2, "orders", &["id"]), Lsn(0)).unwrap(),
        Step::Nothing
    ));
    match a
        .apply(insert(1, &["e1", "Order", "o1", "T", "{}"]), Lsn(80))
        .unwrap()
    {
        Step::Event {
            seq: 0,
            event: Ok(event),
        } => {
            assert_eq!(event.topic, "outbox.event.Order");
            assert_eq!(event.lsn, Lsn(80));
        }
        other => panic!("expected an event, got {other:?}"),
    }
    assert!(matches!(
        a.apply(commit(100), Lsn(100)).unwrap(),
        Step::Commit {
            seq: 0,
            end_lsn: Lsn(100)
        }
    ));
    assert!(matches!(
        a.apply(begin(), Lsn(0)).unwrap(),
        Step::Begin { seq: 1, .. }
    ));
}

#[test]
fn a_new_relation_message_re_resolves_columns() {
    let mut a = assembler();
    a.apply(
        relation(
            1,
            "outbox",
            &["id", "aggregatetype", "aggregateid", "payload"],
        ),
        Lsn(0),
    )
    .unwrap();
    a.apply(begin(), Lsn(0)).unwrap();
    // After ALTER TABLE the column order changes; the next Relation message says so.
    a.apply(
        relation(
            1,
            "outbox",
            &["payload", "x", "aggregatetype", "id", "aggregateid"],
        ),
        Lsn(0),
    )
    .unwrap();
    match a
        .apply(insert(1, &["{}", "1", "User", "e9", "u"]), Lsn(5))
        .unwrap()
    {
        Step::Event {
            event: Ok(event), ..
        } => {
            assert_eq!(event.topic, "outbox.event.User");
            assert_eq!(event.key.as_deref(), Some("e9"));
        }
        other => panic!("expected an event, got {other:?}"),
    }
}

#[test]
fn unroutable_rows_are_reported_with_their_position() {
    let mut a = assembler();
    a.apply(relation(1, "outbox", &["id", "payload"]), Lsn(0))
        .unwrap();
    a.apply(begin(), Lsn(0)).unwrap();
    match a.apply(insert(1, &["e1", "{}"]), Lsn(0)).unwrap() {
        Step::Event {
            event: Err(err), ..
        } => {
            assert_eq!(err.lsn, Lsn(90), "falls back to the commit position");
            assert!(err.to_string().contains("aggregatetype"), "{err}");
            assert!(err.to_string().contains("public.outbox"), "{err}");
            assert_eq!(
                String::from_utf8(err.row_json.clone()).unwrap(),
                r#"{"id":"e1","payload":"{}"}"#,
                "the raw row, for the dead-letter topic"
            );
            let debug = format!("{err:?}");
            assert!(
                debug.contains("<26 bytes>") && !debug.contains("e1"),
                "no row values in Debug: {debug}"
            );
        }
        other => panic!("expected a routing error, got {other:?}"),
    }
}

#[test]
fn a_renamed_outbox_table_is_a_definite_error() {
    let mut a = assembler();
    a.apply(relation(1, "outbox", &["id"]), Lsn(0)).unwrap();
    a.apply(relation(2, "orders", &["id"]), Lsn(0)).unwrap();
    a.apply(relation(2, "orders_v2", &["id"]), Lsn(0))
        .expect("other tables may be renamed");
    let err = a
        .apply(relation(1, "outbox_old", &["id"]), Lsn(0))
        .unwrap_err();
    assert!(matches!(
        err,
        AssemblyError::OutboxRenamed { relation_id: 1, .. }
    ));
    let message = err.to_string();
    assert!(
        message.contains("public.outbox_old") && message.contains("[outbox] table"),
        "{message}"
    );
}

#[test]
fn an_insert_into_another_relation_stops_without_an_event() {
    let mut a = assembler();
    a.apply(relation(1, "outbox", &["id"]), Lsn(0)).unwrap();
    // A partition published under its own name (publish_via_partition_root off).
    a.apply(relation(5, "outbox_2026_12", &["id"]), Lsn(0))
        .expect("a Relation message alone is fine");
    a.apply(begin(), Lsn(0)).unwrap();
    let err = a.apply(insert(5, &["e1"]), Lsn(10)).unwrap_err();
    assert!(matches!(
        err,
        AssemblyError::ForeignRelation { relation_id: 5, .. }
    ));
    let message = err.to_string();
    assert!(
        message.contains("public.outbox_2026_12")
            && message.contains("publish_via_partition_root = true")
            && message.contains("DROP TABLE"),
        "{message}"
    );
}

#[test]
fn the_outbox_name_under_another_relation_id_is_still_the_outbox() {
    let mut a = assembler();
    let cols = ["id", "aggregatetype", "aggregateid", "type", "payload"];
    a.apply(relation(9, "outbox", &cols), Lsn(0)).unwrap();
    a.apply(begin(), Lsn(0)).unwrap();
    match a
        .apply(insert(9, &["e1", "Order", "o1", "T", "{}"]), Lsn(10))
        .unwrap()
    {
        Step::Event {
            event: Ok(event), ..
        } => assert_eq!(event.topic, "outbox.event.Order"),
        other => panic!("expected an event, got {other:?}"),
    }
}

#[test]
fn protocol_violations_are_errors() {
    let mut a = assembler();
    assert!(matches!(
        a.apply(commit(10), Lsn(0)),
        Err(AssemblyError::OutsideTransaction { message: "Commit" })
    ));
    a.apply(begin(), Lsn(0)).unwrap();
    assert!(matches!(
        a.apply(begin(), Lsn(0)),
        Err(AssemblyError::NestedBegin { .. })
    ));
    assert!(matches!(
        a.apply(insert(42, &["x"]), Lsn(0)),
        Err(AssemblyError::UnknownRelation { relation_id: 42 })
    ));
    assert!(matches!(
        a.apply(PgOutputMessage::StreamStop, Lsn(0)),
        Err(AssemblyError::Unexpected { .. })
    ));
}

fn message(transactional: bool, lsn: u64, prefix: &str, content: &str) -> PgOutputMessage {
    PgOutputMessage::Message {
        xid: None,
        flags: u8::from(transactional),
        lsn: Lsn(lsn),
        prefix: prefix.into(),
        content: bytes::Bytes::copy_from_slice(content.as_bytes()),
    }
}

fn with_messages(extra: &str, outbox_enabled: bool) -> TxnAssembler {
    let config: crate::relay::messages::config::MessagesConfig =
        toml::from_str(&format!("prefixes = [\"orders\"]\n{extra}")).unwrap();
    let assembler = if outbox_enabled {
        assembler()
    } else {
        TxnAssembler::new(Vec::new(), 0)
    };
    assembler.with_messages(config.build().unwrap())
}

#[test]
fn transactional_messages_are_events_of_their_transaction_in_place() {
    let mut a = with_messages("", true);
    a.apply(
        relation(
            1,
            "outbox",
            &["id", "aggregatetype", "aggregateid", "type", "payload"],
        ),
        Lsn(0),
    )
    .unwrap();
    a.apply(begin(), Lsn(0)).unwrap();
    assert!(matches!(
        a.apply(message(true, 40, "orders", r#"{"id":"m1","payload":1}"#), Lsn(40)).unwrap(),
        Step::Message { seq: 0, event: Ok(ref e) } if e.headers[0].value.as_deref() == Some("m1")
    ));
    assert!(matches!(
        a.apply(insert(1, &["e1", "Order", "o1", "T", "{}"]), Lsn(50))
            .unwrap(),
        Step::Event { seq: 0, .. }
    ));
    assert!(matches!(
        a.apply(message(true, 60, "other", "x"), Lsn(60)).unwrap(),
        Step::Ignored
    ));
    assert!(matches!(
        a.apply(
            message(true, 61, "orders", r#"{"payload":1,"bad":2}"#),
            Lsn(61)
        )
        .unwrap(),
        Step::Message {
            seq: 0,
            event: Err(_)
        }
    ));
    assert!(matches!(
        a.apply(commit(100), Lsn(100)).unwrap(),
        Step::Commit { seq: 0, .. }
    ));
    assert!(matches!(
        a.apply(message(true, 120, "orders", "x"), Lsn(120)),
        Err(AssemblyError::OutsideTransaction { .. })
    ));
}

#[test]
fn non_transactional_messages_are_refused_or_stand_alone() {
    let mut a = with_messages("", true);
    assert!(matches!(
        a.apply(message(false, 70, "orders", "x"), Lsn(70)).unwrap(),
        Step::Refused { ref prefix, lsn: Lsn(70) } if prefix == "orders"
    ));
    assert!(matches!(
        a.apply(message(false, 71, "other", "x"), Lsn(71)).unwrap(),
        Step::Ignored
    ));
    let mut a = with_messages("non_transactional = \"deliver\"", true);
    assert!(matches!(
        a.apply(message(false, 70, "orders", "x"), Lsn(70)).unwrap(),
        Step::Standalone {
            seq: 0,
            end_lsn: Lsn(71),
            event: Ok(_),
            ..
        }
    ));
    assert_eq!(a.next_seq(), 1, "a transaction of its own");
    a.apply(begin(), Lsn(0)).unwrap();
    assert!(matches!(
        a.apply(message(false, 80, "orders", "x"), Lsn(80)),
        Err(AssemblyError::NonTransactionalInside { .. })
    ));
}

#[test]
fn without_messages_configured_messages_are_passed_over() {
    let mut a = assembler();
    a.apply(begin(), Lsn(0)).unwrap();
    assert!(matches!(
        a.apply(message(true, 40, "orders", "x"), Lsn(40)).unwrap(),
        Step::Ignored
    ));
}

#[test]
fn a_table_less_assembler_takes_no_relation_for_the_outbox() {
    let mut a = with_messages("", false);
    a.apply(relation(1, "outbox", &["id"]), Lsn(0))
        .expect("not a rename: there is no outbox");
    a.apply(begin(), Lsn(0)).unwrap();
    assert!(matches!(
        a.apply(insert(1, &["e1"]), Lsn(10)),
        Err(AssemblyError::ForeignRelation { .. })
    ));
}

fn relation_in(id: u32, schema: &str, name: &str, columns: &[&str]) -> PgOutputMessage {
    let PgOutputMessage::Relation(mut body) = relation(id, name, columns) else {
        unreachable!("relation() makes a Relation message")
    };
    body.namespace = schema.into();
    PgOutputMessage::Relation(body)
}

/// `public.outbox` (relation 1) with Debezium's routing, and `t2.outbox` (relation 2)
/// routed by its `type` column to `t2.<type>`.
fn two_outboxes() -> TxnAssembler {
    let second = OutboxConfig {
        table: "t2.outbox".into(),
        route_by_column: "type".into(),
        topic: "t2.${routedByValue}".into(),
        ..OutboxConfig::default()
    };
    let second = second.build().expect("valid settings");
    TxnAssembler::new(
        vec![
            AssemblerOutbox {
                table: QualifiedName::parse("public.outbox").unwrap(),
                oid: 1,
                router: Router::try_new(&OutboxConfig::default()).unwrap(),
                entry: 0,
            },
            AssemblerOutbox {
                table: second.table,
                oid: 2,
                router: second.router,
                entry: 1,
            },
        ],
        0,
    )
}

const COLUMNS: [&str; 5] = ["id", "aggregatetype", "aggregateid", "type", "payload"];

#[test]
fn each_outbox_is_routed_by_its_own_rules_and_tagged_with_its_index() {
    let mut a = two_outboxes();
    a.apply(begin(), Lsn(0)).unwrap();
    a.apply(relation_in(2, "t2", "outbox", &COLUMNS), Lsn(0))
        .unwrap();
    a.apply(relation_in(1, "public", "outbox", &COLUMNS), Lsn(0))
        .unwrap();
    let routed = |step: Step| match step {
        Step::Event { event: Ok(e), .. } => (e.topic, e.key, e.outbox),
        other => panic!("expected an event, got {other:?}"),
    };
    let row = ["e1", "order", "o-1", "Created", "{}"];
    assert_eq!(
        routed(a.apply(insert(2, &row), Lsn(10)).unwrap()),
        ("t2.Created".to_owned(), Some("e1".to_owned()), 1)
    );
    let row = ["e2", "order", "o-1", "Created", "{}"];
    assert_eq!(
        routed(a.apply(insert(1, &row), Lsn(20)).unwrap()),
        ("outbox.event.order".to_owned(), Some("e2".to_owned()), 0)
    );
}

#[test]
fn with_several_outboxes_a_rename_names_its_table_and_a_stranger_lists_them_all() {
    let mut a = two_outboxes();
    let renamed = a
        .apply(relation_in(2, "t2", "outbox_old", &COLUMNS), Lsn(0))
        .unwrap_err();
    assert_eq!(
        renamed,
        AssemblyError::OutboxRenamed {
            relation_id: 2,
            from: "t2.outbox".into(),
            to: "t2.outbox_old".into(),
        }
    );
    let mut a = two_outboxes();
    a.apply(relation_in(3, "t3", "outbox", &COLUMNS), Lsn(0))
        .unwrap();
    a.apply(begin(), Lsn(0)).unwrap();
    let err = a
        .apply(insert(3, &["e1", "order", "o-1", "Created", "{}"]), Lsn(10))
        .unwrap_err();
    assert_eq!(
        err,
        AssemblyError::ForeignRelation {
            table: "t3.outbox".into(),
            relation_id: 3,
            outbox: "public.outbox, t2.outbox".into(),
        }
    );
    // t2's name under a new relation id (replaced) is still t2's outbox.
    let mut a = two_outboxes();
    a.apply(relation_in(9, "t2", "outbox", &COLUMNS), Lsn(0))
        .unwrap();
    a.apply(begin(), Lsn(0)).unwrap();
    let step = a
        .apply(insert(9, &["e1", "order", "o-1", "Created", "{}"]), Lsn(10))
        .unwrap();
    assert!(
        matches!(step, Step::Event { event: Ok(ref e), .. } if e.topic == "t2.Created" && e.outbox == 1),
        "{step:?}"
    );
}

#[test]
fn a_table_of_a_pattern_is_adopted_when_it_appears_in_the_stream() {
    let tenants = OutboxConfig {
        table: "tenant_*.outbox".into(),
        topic: "t.${routedByValue}".into(),
        ..OutboxConfig::default()
    }
    .build()
    .expect("valid settings");
    let mut a = assembler().with_patterns(vec![AssemblerPattern {
        pattern: tenants.pattern.expect("a pattern"),
        router: tenants.router,
        entry: 1,
    }]);
    a.apply(relation_in(40, "tenant_7", "outbox", &COLUMNS), Lsn(0))
        .unwrap();
    a.apply(relation_in(41, "other", "outbox", &COLUMNS), Lsn(0))
        .unwrap();
    a.apply(begin(), Lsn(0)).unwrap();
    let step = a
        .apply(
            insert(40, &["e1", "order", "o-1", "Created", "{}"]),
            Lsn(10),
        )
        .unwrap();
    let Step::Event {
        event: Ok(event), ..
    } = step
    else {
        panic!("an event: {step:?}")
    };
    assert_eq!(event.topic, "t.order");
    assert_eq!(
        a.table_of(event.outbox).unwrap().to_string(),
        "tenant_7.outbox"
    );
    assert_eq!(a.entry_of(event.outbox), Some(1));
    // Not the pattern's: a stranger, which stops the relay naming the pattern too.
    let err = a
        .apply(
            insert(41, &["e2", "order", "o-1", "Created", "{}"]),
            Lsn(20),
        )
        .unwrap_err();
    assert!(
        matches!(&err, AssemblyError::ForeignRelation { outbox, .. } if outbox.contains("tenant_*.outbox")),
        "{err:?}"
    );
}
