//! Unit tests of the router: Debezium defaults, placements, topic regex, tombstones,
//! timestamps and every row error.

use super::*;
use crate::pg::pgoutput::RelationColumn;

fn router(config: &OutboxConfig) -> Router {
    Router::try_new(config).expect("valid settings")
}

fn relation(columns: &[(&str, u32)]) -> RelationBody {
    RelationBody {
        xid: None,
        relation_id: 1,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|(name, oid)| RelationColumn {
                is_key: false,
                name: (*name).into(),
                type_oid: *oid,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn debezium_relation() -> RelationBody {
    relation(&[
        ("id", 2950),
        ("aggregatetype", 25),
        ("aggregateid", 25),
        ("type", 25),
        ("payload", JSONB_OID),
    ])
}

fn row(values: &[Option<&str>]) -> TupleData {
    TupleData {
        columns: values
            .iter()
            .map(|v| match v {
                Some(text) => ColumnValue::Text(bytes::Bytes::copy_from_slice(text.as_bytes())),
                None => ColumnValue::Null,
            })
            .collect(),
    }
}

const CONTEXT: EventContext = EventContext {
    lsn: Lsn(0x10),
    commit_ts_ms: 1_700_000_000_000,
};

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
fn invalid_rows_are_errors_not_events() {
    let router = router(&OutboxConfig::default());
    let columns = router.resolve(&debezium_relation());
    let null_id = router.route(
        &columns,
        &row(&[None, Some("A"), Some("x"), None, None]),
        CONTEXT,
    );
    assert!(matches!(
        null_id,
        Err(RouteError::NullValue {
            setting: "id_column",
            ..
        })
    ));
    let null_route = router.route(
        &columns,
        &row(&[Some("e"), None, Some("x"), None, None]),
        CONTEXT,
    );
    assert!(matches!(
        null_route,
        Err(RouteError::NullValue {
            setting: "route_by_column",
            ..
        })
    ));
    let short = router.route(&columns, &row(&[Some("e")]), CONTEXT);
    assert!(matches!(
        short,
        Err(RouteError::ColumnCount {
            expected: 5,
            got: 1
        })
    ));
    let no_payload = router.resolve(&relation(&[("id", 25), ("aggregatetype", 25)]));
    let err = router
        .route(&no_payload, &row(&[Some("e"), Some("A")]), CONTEXT)
        .unwrap_err();
    assert!(err.to_string().contains("payload_column"), "{err}");
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

// ---- Debezium placements, topic regex, tombstones, timestamps ----

const TEXT: u32 = 25;
const INT4: u32 = 23;
const BOOL: u32 = 16;
const TIMESTAMPTZ: u32 = 1184;

fn with(additional: &[&str]) -> OutboxConfig {
    OutboxConfig {
        additional: additional.iter().map(|s| (*s).to_owned()).collect(),
        ..OutboxConfig::default()
    }
}

/// id, aggregatetype, aggregateid, type, payload (jsonb), shard (int4), flag (bool),
/// meta (jsonb), blob (bytea), created (timestamptz)
fn wide_relation() -> RelationBody {
    relation(&[
        ("id", TEXT),
        ("aggregatetype", TEXT),
        ("aggregateid", TEXT),
        ("type", TEXT),
        ("payload", JSONB_OID),
        ("shard", INT4),
        ("flag", BOOL),
        ("meta", JSONB_OID),
        ("blob", BYTEA_OID),
        ("created", TIMESTAMPTZ),
    ])
}

fn wide_row(payload: Option<&str>) -> TupleData {
    row(&[
        Some("e-1"),
        Some("Order"),
        Some("o-9"),
        Some("OrderCreated"),
        payload,
        Some("3"),
        Some("t"),
        Some("{\"v\": 2}"),
        Some("\\x666f6f"),
        Some("2026-11-30 11:46:24.123456+05:30"),
    ])
}

fn route_wide(config: &OutboxConfig, row: &TupleData) -> Result<OutboxEvent, RouteError> {
    let router = router(config);
    let columns = router.resolve(&wide_relation());
    router.route(&columns, row, CONTEXT)
}

fn value_text(event: &OutboxEvent) -> Option<String> {
    event
        .value()
        .map(|bytes| String::from_utf8(bytes.into_owned()).unwrap())
}

#[test]
fn header_placements_follow_the_id_header_with_alias_or_column_name() {
    let event = route_wide(
        &with(&["type:header:eventType", "aggregateid:header", "flag:header"]),
        &wide_row(Some("{}")),
    )
    .unwrap();
    let headers: Vec<_> = event
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_deref()))
        .collect();
    assert_eq!(
        headers,
        [
            ("id", Some("e-1")),
            ("eventType", Some("OrderCreated")),
            ("aggregateid", Some("o-9")),
            ("flag", Some("t")),
        ]
    );
    assert!(event.envelope.is_empty());
    assert_eq!(event.value().as_deref(), Some(&b"{}"[..]), "raw payload");
    // A NULL column gives a header without value.
    let mut null_type = wide_row(Some("{}"));
    null_type.columns[3] = ColumnValue::Null;
    let event = route_wide(&with(&["type:header:eventType"]), &null_type).unwrap();
    assert_eq!(event.headers[1].value, None);
}

#[test]
fn envelope_value_bytes_are_exact() {
    let config = with(&[
        "type:envelope:eventType",
        "aggregateid:envelope",
        "shard:envelope",
        "flag:envelope",
        "meta:envelope",
        "blob:envelope",
    ]);
    let event = route_wide(&config, &wide_row(Some("{\"n\": 1}"))).unwrap();
    assert_eq!(
        value_text(&event).unwrap(),
        r#"{"payload":{"n": 1},"eventType":"OrderCreated","aggregateid":"o-9","shard":3,"flag":true,"meta":{"v": 2},"blob":"Zm9v"}"#
    );
    assert_eq!(event.envelope[0].name, "eventType");
    assert_eq!(event.envelope[2].json, "3");
    assert!(!event.tombstone);
    // The payload stays as stored; only the value is wrapped.
    assert_eq!(event.payload.as_deref(), Some(&b"{\"n\": 1}"[..]));

    // NULL payload and NULL fields inside an envelope are JSON nulls.
    let mut nulls = wide_row(None);
    nulls.columns[3] = ColumnValue::Null;
    let event = route_wide(&with(&["type:envelope"]), &nulls).unwrap();
    assert!(!event.tombstone, "an envelope is still a value");
    assert_eq!(
        value_text(&event).unwrap(),
        r#"{"payload":null,"type":null}"#
    );
}

#[test]
fn envelope_payload_text_is_a_string_and_bytea_is_base64() {
    let router = router(&with(&["kind:envelope"]));
    let columns = router.resolve(&relation(&[
        ("id", TEXT),
        ("aggregatetype", TEXT),
        ("payload", TEXT),
        ("kind", TEXT),
    ]));
    let event = router
        .route(
            &columns,
            &row(&[Some("e"), Some("A"), Some("say \"hi\"\n"), Some("k")]),
            CONTEXT,
        )
        .unwrap();
    assert_eq!(
        value_text(&event).unwrap(),
        r#"{"payload":"say \"hi\"\n","kind":"k"}"#
    );
    let columns = router.resolve(&relation(&[
        ("id", TEXT),
        ("aggregatetype", TEXT),
        ("payload", BYTEA_OID),
        ("kind", TEXT),
    ]));
    let event = router
        .route(
            &columns,
            &row(&[Some("e"), Some("A"), Some("\\x00ff41"), Some("k")]),
            CONTEXT,
        )
        .unwrap();
    assert_eq!(
        value_text(&event).unwrap(),
        r#"{"payload":"AP9B","kind":"k"}"#
    );
    // A bytea envelope field that is not hex is an error naming the column.
    let bad = router.route(
        &router.resolve(&relation(&[
            ("id", TEXT),
            ("aggregatetype", TEXT),
            ("payload", TEXT),
            ("kind", BYTEA_OID),
        ])),
        &row(&[Some("e"), Some("A"), Some("p"), Some("zz")]),
        CONTEXT,
    );
    assert_eq!(
        bad,
        Err(RouteError::BadBytea {
            column: "kind".into()
        })
    );
}

#[test]
fn raw_values_are_never_json_escaped() {
    let router = router(&OutboxConfig::default());
    for (oid, stored, want) in [
        (
            JSONB_OID,
            "{\"a\": \"ü\"}",
            "{\"a\": \"ü\"}".as_bytes().to_vec(),
        ),
        (TEXT, "plain \"text\"", b"plain \"text\"".to_vec()),
        (BYTEA_OID, "\\x00ff", vec![0, 0xff]),
    ] {
        let columns = router.resolve(&relation(&[
            ("id", TEXT),
            ("aggregatetype", TEXT),
            ("payload", oid),
        ]));
        let event = router
            .route(
                &columns,
                &row(&[Some("e"), Some("A"), Some(stored)]),
                CONTEXT,
            )
            .unwrap();
        assert!(
            matches!(event.value(), Some(std::borrow::Cow::Borrowed(_))),
            "no copy"
        );
        assert_eq!(event.value().unwrap().as_ref(), &want[..], "{stored}");
    }
}

#[test]
fn partition_placement_takes_a_non_negative_integer() {
    let config = with(&["shard:partition:ignoredAlias"]);
    let event = route_wide(&config, &wide_row(Some("{}"))).unwrap();
    assert_eq!(event.partition, Some(3));
    assert_eq!(event.headers.len(), 1, "a partition is not a header");
    assert_eq!(value_text(&event).unwrap(), "{}", "nor an envelope field");
    assert_eq!(
        route_wide(&OutboxConfig::default(), &wide_row(Some("{}")))
            .unwrap()
            .partition,
        None
    );

    let with_shard = |value: Option<&str>| {
        let mut row = wide_row(Some("{}"));
        row.columns[5] = match value {
            Some(v) => ColumnValue::Text(bytes::Bytes::copy_from_slice(v.as_bytes())),
            None => ColumnValue::Null,
        };
        route_wide(&config, &row)
    };
    assert_eq!(with_shard(Some("0")).unwrap().partition, Some(0));
    assert_eq!(
        with_shard(None),
        Err(RouteError::NullPartition {
            column: "shard".into(),
            index: 0
        })
    );
    assert_eq!(
        with_shard(Some("-1")),
        Err(RouteError::NegativePartition {
            column: "shard".into(),
            index: 0,
            value: -1
        })
    );
    for not_integer in ["1.5", "abc", "2147483648", ""] {
        assert_eq!(
            with_shard(Some(not_integer)),
            Err(RouteError::PartitionNotInteger {
                column: "shard".into(),
                index: 0,
                value: not_integer.into()
            })
        );
    }
}

#[test]
fn a_missing_additional_column_fails_only_rows_and_names_the_setting() {
    let router = router(&with(&["type:header:eventType", "tenant:header"]));
    let columns = router.resolve(&wide_relation());
    let err = router
        .route(&columns, &wide_row(Some("{}")), CONTEXT)
        .unwrap_err();
    assert_eq!(
        err,
        RouteError::MissingAdditionalColumn {
            column: "tenant".into(),
            index: 1,
            spec: "tenant:header".into()
        }
    );
    let message = err.to_string();
    assert!(
        message.contains("\"tenant\"") && message.contains("outbox.additional[1]"),
        "{message}"
    );
}

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

#[test]
fn try_new_returns_every_problem_with_its_key_path() {
    let config = OutboxConfig {
        topic_regex: "(unclosed".into(),
        additional: vec![
            "a:header".into(),
            "type:hedaer".into(),
            "b:partition".into(),
            "c:partition".into(),
        ],
        ..OutboxConfig::default()
    };
    let problems = Router::try_new(&config).unwrap_err();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].starts_with("outbox.topic_regex: "),
        "{problems:?}"
    );
    assert_eq!(
        problems[1],
        r#"outbox.additional[1]: unknown placement "hedaer" (header, envelope or partition)"#
    );
    assert!(
        problems[2].starts_with("outbox.additional[3]: "),
        "{problems:?}"
    );
    let router = router(&with(&["a:header", "b:envelope:x"]));
    assert_eq!(router.additional().len(), 2);
}

#[test]
fn every_row_error_names_its_column_and_setting() {
    let errors = [
        RouteError::MissingColumn {
            column: "c".into(),
            setting: "id_column",
        },
        RouteError::MissingAdditionalColumn {
            column: "c".into(),
            index: 2,
            spec: "c:header".into(),
        },
        RouteError::NullValue {
            column: "c".into(),
            setting: "route_by_column",
        },
        RouteError::NullPartition {
            column: "c".into(),
            index: 2,
        },
        RouteError::PartitionNotInteger {
            column: "c".into(),
            index: 2,
            value: "x".into(),
        },
        RouteError::NegativePartition {
            column: "c".into(),
            index: 2,
            value: -4,
        },
        RouteError::BadTimestamp {
            column: "c".into(),
            value: "x".into(),
            reason: "r",
        },
    ];
    for err in errors {
        let message = err.to_string();
        assert!(message.contains("column \"c\""), "{message}");
        assert!(message.contains("outbox."), "{message}");
    }
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
