//! What the router refuses: rows that cannot become an event (each a [`RouteError`]
//! naming its column and the setting to change) and settings that cannot work
//! ([`Router::try_new`] returning every problem with its key path).

use super::*;

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
