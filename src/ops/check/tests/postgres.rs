//! The server, the replication role, the outbox table's columns and the publication.

use super::*;

#[test]
fn server_problems_name_their_fix() {
    let mut facts = healthy();
    facts.server.wal_level = "replica".into();
    one_problem(
        &facts,
        "postgres.wal_level",
        &["replica", "wal_level = logical", "restart"],
    );

    let mut facts = healthy();
    facts.server.version_num = 120_005;
    facts.server.version = "12.5".into();
    one_problem(&facts, "postgres.version", &["12.5", "13 or later"]);

    let mut facts = healthy();
    facts.server.in_recovery = true;
    one_problem(
        &facts,
        "postgres.primary",
        &["standby", "target_session_attrs"],
    );

    let mut facts = healthy();
    facts.server.rolreplication = false;
    facts.replication_session = Err("must be superuser or replication role".into());
    one_problem(
        &facts,
        "postgres.replication_role",
        &["REPLICATION", "ALTER ROLE \"relay\" WITH REPLICATION"],
    );
}

#[test]
fn columns_are_checked_by_setting_and_type() {
    let with = |edit: &dyn Fn(&mut Vec<ColumnFacts>)| {
        let mut facts = healthy();
        if let Ok(Some(table)) = &mut facts.tables[0] {
            edit(&mut table.columns);
        }
        facts
    };
    one_problem(
        &with(&|c| c.retain(|c| c.name != "payload")),
        "outbox.payload_column",
        &["no column \"payload\"", "outbox.payload_column"],
    );
    one_problem(
        &with(&|c| c[0].not_null = false),
        "outbox.id_column",
        &["may be NULL", "ALTER COLUMN \"id\" SET NOT NULL"],
    );
    let found = check(
        &with(&|c| c[4] = column("payload", 23, "integer", false)),
        &[],
    );
    assert!(found
        .iter()
        .any(|f| f.id == "outbox.payload_column" && f.status == Status::Warning));
    // A missing type column only weakens logs: a warning.
    let found = check(&with(&|c| c.retain(|c| c.name != "type")), &[]);
    assert!(problems(&found).is_empty(), "{found:#?}");
    // A partition placement on a text column.
    let found = check(&healthy(), &["aggregateid:partition", "nope:header"]);
    let ids: Vec<&str> = problems(&found).iter().map(|f| f.id.as_str()).collect();
    assert_eq!(ids, ["outbox.additional[0]", "outbox.additional[1]"]);

    let mut facts = healthy();
    facts.tables[0] = Ok(None);
    let found = check(&facts, &[]);
    let problems = problems(&found);
    assert_eq!(problems.len(), 1, "{problems:#?}");
    assert!(problems[0].message.contains("does not exist"));
}

#[test]
fn the_publication_must_publish_inserts_of_the_outbox_alone() {
    let with = |edit: &dyn Fn(&mut PublicationFacts)| {
        let mut facts = healthy();
        if let Ok(Some(publication)) = &mut facts.publication {
            edit(publication);
        }
        facts
    };
    one_problem(
        &with(&|p| p.inserts = false),
        "postgres.publication",
        &["publish = 'insert'"],
    );
    one_problem(
        &with(&|p| p.tables.clear()),
        "postgres.publication",
        &["ADD TABLE \"public\".\"outbox\""],
    );
    one_problem(
        &with(&|p| p.tables.push(("public".into(), "orders".into()))),
        "postgres.publication",
        &["public.orders", "SET TABLE"],
    );
    let mut facts = with(&|p| p.tables = vec![("public".into(), "outbox_2026".into())]);
    if let Ok(Some(table)) = &mut facts.tables[0] {
        table.relkind = "p".into();
    }
    one_problem(
        &facts,
        "postgres.publication",
        &["publish_via_partition_root = true"],
    );

    // A missing outbox table: create it first; no ALTER PUBLICATION of a table that
    // does not exist.
    for tables in [vec![], vec![("public".to_owned(), "orders".to_owned())]] {
        let mut facts = with(&|p| p.tables = tables.clone());
        facts.tables[0] = Ok(None);
        let found = check(&facts, &[]);
        let publication = found
            .iter()
            .find(|f| f.id == "postgres.publication")
            .expect("a publication finding");
        let fix = publication.fix.as_deref().unwrap_or("");
        assert!(
            fix.contains("outbox-relay init --config relay.toml"),
            "{fix}"
        );
        assert!(
            !fix.contains("ADD TABLE") && !fix.contains("SET TABLE"),
            "{fix}"
        );
        let table = found
            .iter()
            .find(|f| f.id == "outbox.table")
            .expect("outbox.table");
        assert!(
            table
                .fix
                .as_deref()
                .unwrap_or("")
                .contains("outbox-relay init --config relay.toml"),
            "{table:?}"
        );
    }

    // Missing: created by the relay when it may, else the statement to run.
    let mut facts = healthy();
    facts.publication = Ok(None);
    assert!(problems(&check(&facts, &[])).is_empty());
    facts.server.may_create_in_database = false;
    one_problem(
        &facts,
        "postgres.publication",
        &["CREATE PUBLICATION", "as the owner"],
    );
}

#[test]
fn a_table_without_a_type_column_is_warned_unless_type_column_is_unset() {
    let mut facts = healthy();
    if let Ok(Some(table)) = &mut facts.tables[0] {
        table.columns.retain(|c| c.name != "type");
    }
    let warned = |findings: &[Finding]| {
        findings
            .iter()
            .any(|f| f.id == "outbox.type_column" && f.status == Status::Warning)
    };
    assert!(warned(&check(&facts, &[])));
    let router = Router::try_new(&OutboxConfig {
        type_column: String::new(),
        ..OutboxConfig::default()
    })
    .unwrap();
    let found = findings(
        &facts,
        &Target {
            spec: &spec(),
            outboxes: vec![OutboxTarget::of(&router)],
            config_hint: "--config relay.toml".into(),
        },
    );
    assert!(!warned(&found), "{found:#?}");
    assert!(problems(&found).is_empty(), "{found:#?}");
}

/// `public.outbox` and `t2.outbox` through one publication; `edit` changes the facts.
fn two_tables(edit: impl FnOnce(&mut PgFacts)) -> Vec<Finding> {
    let mut spec = spec();
    spec.tables.push(QualifiedName::parse("t2.outbox").unwrap());
    let mut facts = healthy();
    let first = facts.tables[0].clone();
    facts.tables.push(first);
    if let Ok(Some(publication)) = &mut facts.publication {
        publication.tables.push(("t2".into(), "outbox".into()));
    }
    edit(&mut facts);
    let router = router(&[]);
    findings(
        &facts,
        &Target {
            spec: &spec,
            outboxes: vec![
                OutboxTarget::entry(&router, "outbox[0]".into(), false),
                OutboxTarget::entry(&router, "outbox[1]".into(), false),
            ],
            config_hint: "--config relay.toml".into(),
        },
    )
}

#[test]
fn several_outbox_tables_are_checked_each_by_its_key_and_published_together() {
    let found = two_tables(|_| {});
    assert!(problems(&found).is_empty(), "{found:#?}");
    for id in [
        "outbox[0].table",
        "outbox[1].table",
        "outbox[1].payload_column",
    ] {
        assert!(found.iter().any(|f| f.id == id), "{id} in {found:#?}");
    }
    let publication = found
        .iter()
        .find(|f| f.id == "postgres.publication")
        .unwrap();
    assert!(
        publication.message.contains("public.outbox, t2.outbox"),
        "{publication:#?}"
    );

    // The second table lacks a column: its own finding says so.
    let found = two_tables(|facts| {
        if let Ok(Some(table)) = &mut facts.tables[1] {
            table.columns.retain(|c| c.name != "payload");
        }
    });
    let refused = problems(&found);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].id, "outbox[1].payload_column");
    assert!(
        refused[0].message.contains("outbox[1].payload_column"),
        "{refused:#?}"
    );

    // The second table is not in the publication: ADD TABLE it, and say that what was
    // written before is not streamed.
    let found = two_tables(|facts| {
        if let Ok(Some(publication)) = &mut facts.publication {
            publication.tables.retain(|(schema, _)| schema != "t2");
        }
    });
    let refused = problems(&found);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].id, "postgres.publication");
    assert!(refused[0].message.contains("t2.outbox"), "{refused:#?}");
    assert!(refused[0].message.contains("backfill"), "{refused:#?}");
    assert_eq!(
        refused[0].fix.as_deref(),
        Some("ALTER PUBLICATION \"outbox_relay\" ADD TABLE \"t2\".\"outbox\"")
    );

    // The second table is missing: its finding, and the publication waits for it.
    let found = two_tables(|facts| facts.tables[1] = Ok(None));
    let refused = problems(&found);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].id, "outbox[1].table");
    assert!(refused[0].message.contains("t2.outbox"), "{refused:#?}");
}

#[test]
fn a_standby_to_decode_on_needs_16_feedback_and_a_physical_slot() {
    let mut spec = spec();
    spec.decode_on_standby = true;
    let mut facts = healthy();
    facts.server.in_recovery = true;
    facts.server.version_num = 160_004;
    let router = router(&[]);
    let check = |facts: &PgFacts, spec: &SourceSpec| {
        findings(
            facts,
            &Target {
                spec,
                outboxes: vec![OutboxTarget::of(&router)],
                config_hint: "--config relay.toml".into(),
            },
        )
    };
    let found = check(&facts, &spec);
    let refused = problems(&found);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].id, "postgres.primary");
    assert!(
        refused[0].message.contains("hot_standby_feedback is off"),
        "{refused:#?}"
    );
    assert!(
        refused[0].message.contains("no primary_slot_name"),
        "{refused:#?}"
    );
    facts.server.hot_standby_feedback = true;
    facts.server.primary_slot_name = "standby1".into();
    let found = check(&facts, &spec);
    assert!(problems(&found).is_empty(), "{found:#?}");
    assert!(found
        .iter()
        .any(|f| f.id == "postgres.primary" && f.message.contains("decodes on it")));
    facts.server.version_num = 150_008;
    let found = check(&facts, &spec);
    assert!(
        problems(&found)[0].message.contains("needs PostgreSQL 16"),
        "{found:#?}"
    );
    // Without primary_url a standby is still a problem, and the fix names primary_url.
    spec.decode_on_standby = false;
    let found = check(&facts, &spec);
    assert!(problems(&found)[0]
        .fix
        .as_deref()
        .unwrap_or("")
        .contains("primary_url"));
}
