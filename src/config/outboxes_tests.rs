//! Several outbox tables in one relay (`[[outbox]]` with `[outbox_defaults]`), through
//! the whole load: the tree merge, the environment, the entries' checks and paths.

use super::{Config, ConfigError};
use crate::pg::sql::QualifiedName;

fn load(text: &str, vars: &[(&str, &str)]) -> Result<super::Validated, String> {
    let vars = vars.iter().map(|(n, v)| (n.to_string(), v.to_string()));
    Config::load_from("relay.toml", text, vars).map_err(|e| match e {
        ConfigError::Invalid { problems, .. } => problems.join("\n"),
        other => other.to_string(),
    })
}

const BASE: &str = "[postgres]\nurl = \"postgres://u@h/d\"\n";

#[test]
fn each_entry_gets_its_table_its_own_keys_and_the_shared_defaults() {
    let v = load(
        &format!(
            "{BASE}[outbox_defaults]\ntopic = \"shared.${{routedByValue}}\"\nkey_column = \"aggregateid\"\n\
             [[outbox]]\ntable = \"orders.outbox\"\n\
             [[outbox]]\ntable = \"billing.outbox\"\ntopic = \"billing.${{routedByValue}}\"\n"
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        v.tables(),
        vec![
            QualifiedName::parse("orders.outbox").unwrap(),
            QualifiedName::parse("billing.outbox").unwrap()
        ]
    );
    assert_eq!(v.outboxes[0].router.topic_prefix(), "shared.");
    assert_eq!(v.outboxes[1].router.topic_prefix(), "billing.");
    assert_eq!(v.outboxes[0].router.key_column(), "aggregateid");
    assert_eq!(v.outboxes[1].router.key_column(), "aggregateid");
    // The state table sits beside the first outbox by default.
    assert_eq!(v.state_table.to_string(), "orders.outbox_relay_state");
    let spec = v.source();
    assert!(spec.outbox());
    assert_eq!(spec.tables_shown(), "orders.outbox, billing.outbox");
}

#[test]
fn an_environment_default_reaches_every_entry_and_a_single_key_is_refused_with_the_way() {
    let text =
        format!("{BASE}[[outbox]]\ntable = \"a.outbox\"\n[[outbox]]\ntable = \"b.outbox\"\n");
    let v = load(&text, &[("OUTBOX_RELAY__OUTBOX_DEFAULTS__TOPIC", "all")]).unwrap();
    assert!(v
        .outboxes
        .iter()
        .all(|o| o.router.constant_topic().as_deref() == Some("all")));
    let err = load(&text, &[("OUTBOX_RELAY__OUTBOX__TOPIC", "all")]).unwrap_err();
    assert!(err.contains("OUTBOX_RELAY__OUTBOX__TOPIC"), "{err}");
    assert!(
        err.contains("OUTBOX_RELAY__OUTBOX_DEFAULTS__<KEY>"),
        "{err}"
    );
}

#[test]
fn entries_are_checked_each_with_its_index_and_a_table_is_listed_once() {
    let err = load(
        &format!(
            "{BASE}[[outbox]]\ntable = \"a.outbox\"\n\
             [[outbox]]\ntable = \"b.outbox\"\nid_column = \"\"\n\
             [[outbox]]\ntable = \"a.outbox\"\n\
             [[outbox]]\ntable = \"c.outbox\"\nenabled = false\n"
        ),
        &[],
    )
    .unwrap_err();
    assert!(
        err.contains("outbox[1].id_column: must not be empty"),
        "{err}"
    );
    assert!(
        err.contains("outbox[2].table: a.outbox is also outbox[0]'s table"),
        "{err}"
    );
    assert!(err.contains("outbox[3].enabled"), "{err}");
    let err = load(&format!("outbox = []\n{BASE}"), &[]).unwrap_err();
    assert!(
        err.contains("the list of [[outbox]] entries is empty"),
        "{err}"
    );
}

#[test]
fn defaults_without_a_list_and_a_state_table_among_the_outboxes_are_refused() {
    let err = load(
        &format!("{BASE}[outbox_defaults]\ntopic = \"t\"\n[outbox]\ntable = \"a.outbox\"\n"),
        &[],
    )
    .unwrap_err();
    assert!(err.contains("outbox_defaults: holds what a list"), "{err}");
    let err = load(
        &format!(
            "{BASE}state_table = \"b.outbox\"\n[[outbox]]\ntable = \"a.outbox\"\n[[outbox]]\ntable = \"b.outbox\"\n"
        ),
        &[],
    )
    .unwrap_err();
    assert!(
        err.contains("postgres.state_table: b.outbox is an outbox table"),
        "{err}"
    );
}

#[test]
fn a_dead_letter_topic_that_an_entry_sends_every_event_to_is_refused() {
    let err = load(
        &format!(
            "{BASE}[[outbox]]\ntable = \"a.outbox\"\n[[outbox]]\ntable = \"b.outbox\"\ntopic = \"dlq\"\n[dead_letter]\ntopic = \"dlq\"\n"
        ),
        &[],
    )
    .unwrap_err();
    assert!(err.contains("outbox[1].topic"), "{err}");
}

#[test]
fn a_wrong_type_in_an_entry_names_its_key() {
    let err = load(
        &format!("{BASE}[[outbox]]\ntable = \"a.outbox\"\n[[outbox]]\ntable = 5\n"),
        &[],
    )
    .unwrap_err();
    assert!(err.contains("outbox.table"), "{err}");
    assert!(err.contains("expected a string"), "{err}");
    // Not the first entry's line: the path does not say which entry it was.
    assert!(!err.contains("line 4"), "{err}");
}

#[test]
fn a_star_in_the_schema_makes_a_pattern_and_overlaps_are_refused() {
    let v = load(
        &format!(
            "{BASE}[[outbox]]\ntable = \"public.outbox\"\n[[outbox]]\ntable = \"tenant_*.outbox\"\ntopic = \"t.${{routedByValue}}\"\n"
        ),
        &[],
    )
    .unwrap();
    assert_eq!(
        v.tables(),
        vec![QualifiedName::parse("public.outbox").unwrap()]
    );
    let patterns = v.patterns();
    assert_eq!(patterns.len(), 1);
    assert_eq!(patterns[0].to_string(), "tenant_*.outbox");
    let tenant = QualifiedName::parse("tenant_9.outbox").unwrap();
    assert_eq!(v.entry_of(&tenant), Some(1));
    assert_eq!(
        v.entry_of(&QualifiedName::parse("public.outbox").unwrap()),
        Some(0)
    );
    assert_eq!(
        v.entry_of(&QualifiedName::parse("tenant_9.other").unwrap()),
        None
    );
    assert_eq!(v.entry_names(), ["public.outbox", "tenant_*.outbox"]);
    let spec = v.source();
    assert_eq!(spec.tables_shown(), "public.outbox, tenant_*.outbox");
    assert!(spec.from_pattern(&tenant));

    let err = load(
        &format!("{BASE}[[outbox]]\ntable = \"tenant_1.outbox\"\n[[outbox]]\ntable = \"tenant_*.outbox\"\n"),
        &[],
    )
    .unwrap_err();
    assert!(err.contains("outbox[1].table"), "{err}");
    assert!(err.contains("listed once"), "{err}");
    let err = load(
        &format!("{BASE}[[outbox]]\ntable = \"tenant_1.out*\"\n"),
        &[],
    )
    .unwrap_err();
    assert!(err.contains("only the schema may be a pattern"), "{err}");
    // Only a pattern: the state table goes to public.
    let v = load(
        &format!("{BASE}[[outbox]]\ntable = \"tenant_*.outbox\"\n"),
        &[],
    )
    .unwrap();
    assert_eq!(v.state_table.to_string(), "public.outbox_relay_state");
    // A quoted schema is a name, whatever it holds.
    let v = load(&format!("{BASE}[outbox]\ntable = '\"odd*\".outbox'\n"), &[]).unwrap();
    assert!(v.patterns().is_empty());
}
