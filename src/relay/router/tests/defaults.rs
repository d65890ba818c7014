//! The router's defaults and how it finds its columns: Debezium's Outbox Event Router
//! shape with no settings, the key column and the topic template, columns found by
//! name in any order, a bytea payload decoded to its bytes, and the type column (a
//! table without it still routes; only asking for the type fails, unless
//! `type_column` is set empty).

use super::*;

#[test]
fn debezium_defaults() {
    let router = router(&OutboxConfig::default());
    let columns = router.resolve(&debezium_relation());
    let event = router
        .route(
            &columns,
            &row(&[
                Some("e-1"),
                Some("Order"),
                Some("o-9"),
                Some("Created"),
                Some("{\"n\": 1}"),
            ]),
            CONTEXT,
        )
        .unwrap();
    assert_eq!(event.topic, "outbox.event.Order");
    assert_eq!(event.key.as_deref(), Some("e-1"));
    assert_eq!(
        event.headers,
        vec![Header {
            name: "id".into(),
            value: Some("e-1".into())
        }]
    );
    assert_eq!(event.payload.as_deref(), Some(&b"{\"n\": 1}"[..]));
    assert_eq!(event.payload_format, PayloadFormat::Json);
    assert_eq!(
        (event.lsn, event.timestamp_ms),
        (Lsn(0x10), 1_700_000_000_000)
    );
}

#[test]
fn key_column_and_topic_template_are_configurable() {
    let config = OutboxConfig {
        key_column: "aggregateid".into(),
        topic: "events-${routedByValue}-v1".into(),
        ..OutboxConfig::default()
    };
    let router = router(&config);
    let columns = router.resolve(&debezium_relation());
    let event = router
        .route(
            &columns,
            &row(&[Some("e"), Some("user"), Some("u-1"), None, None]),
            CONTEXT,
        )
        .unwrap();
    assert_eq!(event.topic, "events-user-v1");
    assert_eq!(event.key.as_deref(), Some("u-1"));
    assert_eq!(event.payload, None);
}

#[test]
fn columns_are_found_by_name_in_any_order() {
    let router = router(&OutboxConfig::default());
    let reordered = relation(&[
        ("payload", 25),
        ("extra", 23),
        ("aggregatetype", 25),
        ("id", 25),
        ("aggregateid", 25),
    ]);
    let columns = router.resolve(&reordered);
    let event = router
        .route(
            &columns,
            &row(&[Some("hi"), Some("1"), Some("A"), Some("x"), Some("y")]),
            CONTEXT,
        )
        .unwrap();
    assert_eq!(
        (event.topic.as_str(), event.key.as_deref()),
        ("outbox.event.A", Some("x"))
    );
    assert_eq!(event.payload_format, PayloadFormat::Text);
}

#[test]
fn bytea_payload_is_decoded_to_raw_bytes() {
    let router = router(&OutboxConfig::default());
    let columns = router.resolve(&relation(&[
        ("id", 25),
        ("aggregatetype", 25),
        ("payload", BYTEA_OID),
    ]));
    let event = router
        .route(
            &columns,
            &row(&[Some("e"), Some("A"), Some("\\x00ff41")]),
            CONTEXT,
        )
        .unwrap();
    assert_eq!(event.payload.as_deref(), Some(&[0u8, 0xff, 0x41][..]));
    let bad = router.route(
        &columns,
        &row(&[Some("e"), Some("A"), Some("\\x0")]),
        CONTEXT,
    );
    assert!(matches!(bad, Err(RouteError::BadBytea { .. })));
}

#[test]
fn type_column_is_reported_only_when_used() {
    let router = router(&OutboxConfig::default());
    let without_type = relation(&[("id", TEXT), ("aggregatetype", TEXT), ("payload", TEXT)]);
    let columns = router.resolve(&without_type);
    let row = row(&[Some("e"), Some("A"), Some("p")]);
    assert!(router.route(&columns, &row, CONTEXT).is_ok());
    assert_eq!(
        router.event_type(&columns, &row),
        Err(RouteError::MissingColumn {
            column: "type".into(),
            setting: "type_column"
        })
    );
    let wide = router.resolve(&wide_relation());
    assert_eq!(
        router
            .event_type(&wide, &wide_row(None))
            .unwrap()
            .as_deref(),
        Some("OrderCreated")
    );
}

#[test]
fn an_empty_type_column_means_the_table_has_none() {
    let router = router(&OutboxConfig {
        type_column: String::new(),
        ..OutboxConfig::default()
    });
    let without_type = relation(&[("id", TEXT), ("aggregatetype", TEXT), ("payload", TEXT)]);
    let columns = router.resolve(&without_type);
    let row = row(&[Some("e"), Some("A"), Some("p")]);
    assert_eq!(router.event_type(&columns, &row), Ok(None));
    assert!(router.columns().event_type.is_none());
}
