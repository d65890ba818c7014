//! The record around the payload: the topic (`outbox.topic_regex` matching the whole
//! routed value, and the default regex against a plain regex search), tombstones
//! (the flag and an empty payload), and the record timestamp from the timestamp
//! column.

use super::*;

#[test]
fn topic_regex_matches_the_whole_value_or_leaves_the_value_as_topic() {
    let config = OutboxConfig {
        topic_regex: r"(?<kind>[A-Za-z]+)Aggregate".into(),
        topic: "events.${kind}".into(),
        ..OutboxConfig::default()
    };
    let router = router(&config);
    let columns = router.resolve(&debezium_relation());
    let topic = |value: &str| {
        router
            .route(
                &columns,
                &row(&[Some("e"), Some(value), None, None, None]),
                CONTEXT,
            )
            .map(|event| event.topic)
    };
    assert_eq!(topic("OrderAggregate").unwrap(), "events.Order");
    assert_eq!(topic("Order").unwrap(), "Order", "no match: not rerouted");
    assert_eq!(topic("OrderAggregates").unwrap(), "OrderAggregates");
    // Kafka's topic name rules are the Kafka sink's business (stdout takes any name).
    assert_eq!(topic("Order Aggregate").unwrap(), "Order Aggregate");
}

#[test]
fn the_default_topic_regex_gives_what_a_regex_search_gives() {
    // `(?<routedByValue>.*)` takes a path without a regex search; `(?<routedByValue>.*?)`
    // means the same anchored and is searched. Both must route every value alike,
    // line feeds (no match: the value itself is the topic) and empty values included.
    let topic = "pre.${routedByValue}.$1.post";
    let fast = TopicRule::new(config::DEFAULT_TOPIC_REGEX, topic, &mut Vec::new())
        .expect("the default regex compiles");
    let searched = TopicRule::new("(?<routedByValue>.*?)", topic, &mut Vec::new())
        .expect("the lazy regex compiles");
    for value in [
        "order",
        "",
        "a.b-c_d",
        "grüße 注文",
        "two\nlines",
        "\n",
        "x\r\ny",
    ] {
        assert_eq!(fast.topic(value), searched.topic(value), "value {value:?}");
    }
    assert_eq!(fast.topic("order"), "pre.order.order.post");
    assert_eq!(fast.topic("two\nlines"), "two\nlines");
}

#[test]
fn tombstones_follow_the_flag_and_the_payload() {
    let payload_cases: [(Option<&str>, bool); 4] = [
        (None, true),
        (Some(""), true),
        (Some(" \n\t"), true),
        (Some("{}"), false),
    ];
    for flag in [false, true] {
        for envelope in [false, true] {
            for (payload, empty) in payload_cases {
                let config = OutboxConfig {
                    tombstone_on_empty_payload: flag,
                    ..with(if envelope { &["type:envelope"] } else { &[] })
                };
                let router = router(&config);
                let columns = router.resolve(&relation(&[
                    ("id", TEXT),
                    ("aggregatetype", TEXT),
                    ("type", TEXT),
                    ("payload", TEXT),
                ]));
                let event = router
                    .route(
                        &columns,
                        &row(&[Some("e"), Some("A"), Some("T"), payload]),
                        CONTEXT,
                    )
                    .unwrap();
                let want_tombstone = (flag && empty) || (payload.is_none() && !envelope);
                let case = format!("flag={flag} envelope={envelope} payload={payload:?}");
                assert_eq!(event.tombstone, want_tombstone, "{case}");
                assert_eq!(event.value().is_none(), want_tombstone, "{case}");
                if !want_tombstone && !envelope {
                    assert_eq!(
                        event.value().as_deref(),
                        payload.map(str::as_bytes),
                        "{case}: sent as stored"
                    );
                }
                assert_eq!(event.headers[0].value.as_deref(), Some("e"), "{case}");
            }
        }
    }
    // An empty bytea is empty; a bytea of spaces is data.
    let router = router(&OutboxConfig {
        tombstone_on_empty_payload: true,
        ..OutboxConfig::default()
    });
    let columns = router.resolve(&relation(&[
        ("id", TEXT),
        ("aggregatetype", TEXT),
        ("payload", BYTEA_OID),
    ]));
    for (stored, tombstone) in [("\\x", true), ("\\x20", false)] {
        let event = router
            .route(
                &columns,
                &row(&[Some("e"), Some("A"), Some(stored)]),
                CONTEXT,
            )
            .unwrap();
        assert_eq!(event.tombstone, tombstone, "{stored}");
    }
}

#[test]
fn timestamp_column_sets_the_record_timestamp() {
    let config = OutboxConfig {
        timestamp_column: Some("created".into()),
        ..OutboxConfig::default()
    };
    let event = route_wide(&config, &wide_row(Some("{}"))).unwrap();
    assert_eq!(event.timestamp_ms, 1_796_019_384_123);
    // NULL falls back to the commit time, as Debezium does.
    let mut null_created = wide_row(Some("{}"));
    null_created.columns[9] = ColumnValue::Null;
    assert_eq!(
        route_wide(&config, &null_created).unwrap().timestamp_ms,
        CONTEXT.commit_ts_ms
    );
    let mut bad = wide_row(Some("{}"));
    bad.columns[9] = ColumnValue::Text(bytes::Bytes::from_static(b"infinity"));
    let err = route_wide(&config, &bad).unwrap_err();
    assert!(
        matches!(&err, RouteError::BadTimestamp { column, value, .. } if column == "created" && value == "infinity"),
        "{err:?}"
    );
    assert!(err.to_string().contains("outbox.timestamp_column"), "{err}");
    let missing = OutboxConfig {
        timestamp_column: Some("occurred_at".into()),
        ..OutboxConfig::default()
    };
    assert_eq!(
        route_wide(&missing, &wide_row(Some("{}"))),
        Err(RouteError::MissingColumn {
            column: "occurred_at".into(),
            setting: "timestamp_column"
        })
    );
}
