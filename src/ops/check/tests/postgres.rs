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
        if let Ok(Some(table)) = &mut facts.table {
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
    facts.table = Ok(None);
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
    if let Ok(Some(table)) = &mut facts.table {
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
        facts.table = Ok(None);
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
    if let Ok(Some(table)) = &mut facts.table {
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
            columns: router.columns(),
            additional: router.additional(),
            config_hint: "--config relay.toml".into(),
        },
    );
    assert!(!warned(&found), "{found:#?}");
    assert!(problems(&found).is_empty(), "{found:#?}");
}
