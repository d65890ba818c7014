//! `outbox.additional` placements: headers after the `id` header (alias or column
//! name), the JSON envelope and its exact bytes (text payload as a string, bytea as
//! base64, raw values never escaped), the partition column, and a missing column,
//! which fails the rows that need it and names the setting.

use super::*;

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
