//! The table-less outbox: a publication without tables, PostgreSQL 14 or later.

use super::*;

fn check_table_less(facts: &PgFacts) -> Vec<Finding> {
    let mut spec = spec();
    spec.tables.clear();
    spec.messages = true;
    check_with(facts, &spec, &[])
}

#[test]
fn a_table_less_relay_needs_a_publication_without_tables_and_postgresql_14() {
    // The healthy facts' publication publishes the outbox: refused for messages only.
    let found = check_table_less(&healthy());
    let refused = problems(&found);
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].id, "postgres.publication");
    assert!(
        refused[0]
            .fix
            .as_deref()
            .unwrap_or("")
            .contains("WITH (publish = 'insert')"),
        "{refused:#?}"
    );
    let mut facts = healthy();
    facts.tables.clear();
    facts.publication = Ok(Some(PublicationFacts {
        inserts: true,
        via_root: false,
        all_tables: false,
        tables: Vec::new(),
    }));
    let found = check_table_less(&facts);
    assert!(problems(&found).is_empty(), "{found:#?}");
    assert!(found
        .iter()
        .any(|f| f.id == "postgres.messages" && f.status == Status::Ok));
    facts.publication = Ok(None);
    assert!(
        problems(&check_table_less(&facts)).is_empty(),
        "the relay creates it"
    );
    facts.server.version_num = 130_010;
    facts.server.version = "13.10".into();
    let found = check_table_less(&facts);
    let old = problems(&found);
    assert!(
        old.iter()
            .any(|p| p.id == "postgres.messages" && p.message.contains("PostgreSQL 14 or later")),
        "{old:#?}"
    );
}
