//! `[outbox_defaults]`: the values every `[[outbox]]` entry shares, merged into each
//! entry of the parsed tree (an entry's own key wins) before the tree is deserialized,
//! so a merged value meets the same checks and messages as one written in the entry.
//!
//! ```toml
//! [outbox_defaults]
//! topic = "events.${routedByValue}"
//! key_column = "aggregateid"
//!
//! [[outbox]]
//! table = "orders.outbox"
//!
//! [[outbox]]
//! table = "billing.outbox"
//! topic = "billing.${routedByValue}"   # this entry's own
//! ```
//!
//! Pure: takes the tree, returns the problems.

use toml::{Table, Value};

use super::env::KEYS;

/// The section's name in the file.
pub const DEFAULTS: &str = "outbox_defaults";

/// Keys of `[outbox]` that `[outbox_defaults]` may not set: each entry names its own
/// table, and an entry of a list cannot be disabled.
const PER_ENTRY: &[&str] = &["table", "enabled"];

/// The keys `[outbox_defaults]` accepts: those of `[outbox]` but `PER_ENTRY`.
pub fn default_keys() -> impl Iterator<Item = &'static str> {
    KEYS.iter()
        .filter(|(section, _)| *section == "outbox")
        .flat_map(|(_, keys)| keys.iter().map(|(key, _)| *key))
        .filter(|key| !PER_ENTRY.contains(key))
}

/// Merges `[outbox_defaults]` into every `[[outbox]]` entry of `tree` and removes it.
/// Every problem, each with its key path.
pub fn merge_defaults(tree: &mut Table) -> Result<(), Vec<String>> {
    let Some(defaults) = tree.remove(DEFAULTS) else {
        return Ok(());
    };
    let Value::Table(defaults) = defaults else {
        return Err(vec![format!(
            "{DEFAULTS}: must be a table ([{DEFAULTS}] with the keys the [[outbox]] entries share)"
        )]);
    };
    let mut problems = Vec::new();
    for key in defaults.keys() {
        if PER_ENTRY.contains(&key.as_str()) {
            problems.push(format!(
                "{DEFAULTS}.{key}: each [[outbox]] entry sets its own {key}; remove it here"
            ));
        } else if !default_keys().any(|known| known == key) {
            problems.push(format!(
                "{DEFAULTS}.{key}: unknown key; [{DEFAULTS}] takes the keys of [outbox] but table and enabled: {}",
                default_keys().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    match tree.get_mut("outbox") {
        Some(Value::Array(entries)) => {
            if problems.is_empty() {
                for entry in entries.iter_mut() {
                    if let Value::Table(entry) = entry {
                        for (key, value) in &defaults {
                            entry.entry(key.clone()).or_insert_with(|| value.clone());
                        }
                    }
                }
            }
        }
        _ => problems.push(format!(
            "{DEFAULTS}: holds what a list of [[outbox]] entries shares, and this configuration has no such list (one [outbox] section, or none): put the keys in [outbox]"
        )),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged(text: &str) -> Result<Table, String> {
        let mut tree: Table = toml::from_str(text).unwrap();
        merge_defaults(&mut tree)
            .map(|()| tree)
            .map_err(|p| p.join("\n"))
    }

    #[test]
    fn an_entry_keeps_its_own_value_and_takes_the_rest_from_the_defaults() {
        let tree = merged(
            "[outbox_defaults]\ntopic = \"t.${routedByValue}\"\nkey_column = \"aggregateid\"\n\
             [[outbox]]\ntable = \"a.outbox\"\n[[outbox]]\ntable = \"b.outbox\"\ntopic = \"b\"\n",
        )
        .unwrap();
        assert!(!tree.contains_key(DEFAULTS));
        let entries = tree["outbox"].as_array().unwrap();
        assert_eq!(entries[0]["topic"].as_str(), Some("t.${routedByValue}"));
        assert_eq!(entries[0]["key_column"].as_str(), Some("aggregateid"));
        assert_eq!(entries[1]["topic"].as_str(), Some("b"));
        assert_eq!(entries[1]["key_column"].as_str(), Some("aggregateid"));
        assert_eq!(entries[1]["table"].as_str(), Some("b.outbox"));
    }

    #[test]
    fn defaults_without_a_list_or_with_per_entry_keys_are_refused() {
        let err =
            merged("[outbox_defaults]\ntopic = \"x\"\n[outbox]\ntable = \"a.b\"\n").unwrap_err();
        assert!(err.contains("outbox_defaults: holds what a list"), "{err}");
        assert!(err.contains("put the keys in [outbox]"), "{err}");
        let err =
            merged("[outbox_defaults]\ntable = \"x\"\ntopik = 1\n[[outbox]]\ntable = \"a.b\"\n")
                .unwrap_err();
        assert!(
            err.contains("outbox_defaults.table: each [[outbox]] entry sets its own table"),
            "{err}"
        );
        assert!(err.contains("outbox_defaults.topik: unknown key"), "{err}");
        assert!(merged("[[outbox]]\ntable = \"a.b\"\n").is_ok());
    }
}
