//! Environment overrides: `OUTBOX_RELAY__<SECTION>__<KEY>` sets `<section>.<key>` over
//! the file, before the tree is deserialized, so a value from the environment is
//! checked (and its problems reported) exactly as one from the file.
//!
//! ```text
//! OUTBOX_RELAY__KAFKA__BROKERS=k1:9092            kafka.brokers = "k1:9092"
//! OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT=5000         relay.max_in_flight = 5000
//! OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT_BYTES=8388608 relay.max_in_flight_bytes = 8388608
//! OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_PASSWORD  kafka.properties."sasl.password"
//! ```
//!
//! - `__` (two underscores) separates path parts; the parts after the prefix are read
//!   case-insensitively (the usual spelling is upper case).
//! - Under `kafka.properties` and `kafka.property_files` the last part is a librdkafka
//!   property: its single underscores stand for dots (librdkafka's property names
//!   use dots, never underscores, apart from the C callbacks nobody sets as text).
//! - A value is typed by the key it sets: integers and booleans are parsed, a list
//!   (`outbox.additional`) is TOML inline array syntax (`["a:header", "b:envelope"]`)
//!   or, when it does not start with `[`, comma-separated items; everything else is a
//!   string, taken verbatim.
//! - A variable with the prefix that names no key is an error naming the variable, as
//!   an unknown key in the file is.
//!
//! [`apply`] is pure: it takes the tree and the variables, and returns what it set. The
//! keys it knows and their kinds are the table [`KEYS`] in `env/keys.rs`.

mod keys;

use toml::{Table, Value};

pub use keys::{Kind, KEYS};

/// Every override variable starts with this.
pub const PREFIX: &str = "OUTBOX_RELAY__";

/// One key set from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The variable's name.
    pub variable: String,
    /// The key path it set, as written in messages: `relay.max_in_flight`,
    /// `kafka.properties."sasl.password"`.
    pub key: String,
}

/// Sets every `OUTBOX_RELAY__*` variable of `vars` in `table` (other variables are
/// ignored). Returns what was set, in the variables' name order, or every problem,
/// each naming its variable. Values of string keys never appear in messages (they may
/// be secrets).
pub fn apply(
    table: &mut Table,
    vars: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<Override>, Vec<String>> {
    let mut problems = Vec::new();
    let mut vars: Vec<(String, String)> = vars
        .into_iter()
        .filter(|(name, _)| {
            if let Some(problem) = misspelled(name) {
                problems.push(problem);
            }
            name.starts_with(PREFIX)
        })
        .collect();
    vars.sort();
    problems.sort();
    let mut applied: Vec<(Vec<String>, Override)> = Vec::new();
    for (variable, text) in vars {
        let (path, kind) = match resolve(&variable) {
            Ok(found) => found,
            Err(problem) => {
                problems.push(format!("{variable}: {problem}"));
                continue;
            }
        };
        let key = shown_key(&path);
        if let Some((_, earlier)) = applied.iter().find(|(p, _)| *p == path) {
            problems.push(format!(
                "{variable}: sets {key}, as {} does; keep one",
                earlier.variable
            ));
            continue;
        }
        let value = match typed(kind, &text) {
            Ok(value) => value,
            Err(problem) => {
                problems.push(format!("{variable} ({key}): {problem}"));
                continue;
            }
        };
        if let Err(problem) = set(table, &path, value) {
            problems.push(format!("{variable} ({key}): {problem}"));
            continue;
        }
        applied.push((path, Override { variable, key }));
    }
    if problems.is_empty() {
        Ok(applied.into_iter().map(|(_, o)| o).collect())
    } else {
        Err(problems)
    }
}

/// The start of a variable that means an override but misses an underscore.
pub const SHORT_PREFIX: &str = "OUTBOX_RELAY_";

/// The problem of `variable` when it starts with `OUTBOX_RELAY_` (one underscore) and
/// then names a section and one of its keys (`OUTBOX_RELAY_POSTGRES__SLOT`): an override
/// the relay would otherwise ignore. Other `OUTBOX_RELAY_*` names are left alone: the
/// test and deploy tooling reads some (`OUTBOX_RELAY_BIN`, `OUTBOX_RELAY_KAFKA_LIBS`),
/// and the relay may inherit them.
fn misspelled(variable: &str) -> Option<String> {
    if variable.starts_with(PREFIX) {
        return None;
    }
    let rest = variable.strip_prefix(SHORT_PREFIX)?.to_ascii_lowercase();
    KEYS.iter().find_map(|(section, keys)| {
        let after = rest.strip_prefix(section)?.strip_prefix('_')?;
        let after = after.trim_start_matches('_');
        let (key, _) = keys.iter().find(|(key, _)| {
            after == *key || after.strip_prefix(key).is_some_and(|r| r.starts_with('_'))
        })?;
        Some(format!(
            "{variable}: looks like an override of {section}.{key} with one underscore after OUTBOX_RELAY; write {PREFIX}{}__{}{} (two underscores after the prefix and between parts), or unset it",
            section.to_ascii_uppercase(),
            key.to_ascii_uppercase(),
            if after.len() > key.len() { "__<…>" } else { "" }
        ))
    })
}

/// The key path a variable names, and how its value is read.
fn resolve(variable: &str) -> Result<(Vec<String>, Kind), String> {
    let rest = &variable[PREFIX.len()..];
    let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
    let sections: Vec<&str> = KEYS.iter().map(|(name, _)| *name).collect();
    let Some((_, keys)) = KEYS.iter().find(|(name, _)| *name == parts[0]) else {
        return Err(format!(
            "names no configuration section {:?}; sections: {} (write OUTBOX_RELAY__<SECTION>__<KEY>, parts separated by two underscores)",
            parts[0],
            sections.join(", ")
        ));
    };
    let section = parts[0].as_str();
    let Some(key) = parts.get(1) else {
        return Err(format!(
            "names the section [{section}] but no key; write OUTBOX_RELAY__{}__<KEY>",
            section.to_ascii_uppercase()
        ));
    };
    let Some((_, kind)) = keys.iter().find(|(name, _)| name == key) else {
        let valid: Vec<&str> = keys.iter().map(|(name, _)| *name).collect();
        return Err(format!(
            "[{section}] has no key {key:?}; its keys: {} (upper case in the variable's name)",
            valid.join(", ")
        ));
    };
    match (kind, parts.len()) {
        (Kind::Properties, 3) if !parts[2].is_empty() => {
            let property = parts[2].replace('_', ".");
            Ok((vec![parts[0].clone(), key.clone(), property], *kind))
        }
        (Kind::Properties, _) => Err(format!(
            "{section}.{key} takes one librdkafka property per variable: OUTBOX_RELAY__{}__{}__<PROPERTY> with each '.' of the property written '_' (sasl.password: SASL_PASSWORD)",
            section.to_ascii_uppercase(),
            key.to_ascii_uppercase()
        )),
        (_, 2) => Ok((parts[..2].to_vec(), *kind)),
        _ => Err(format!(
            "{section}.{key} has no keys below it; write OUTBOX_RELAY__{}__{}",
            section.to_ascii_uppercase(),
            key.to_ascii_uppercase()
        )),
    }
}

/// A key path as messages show it (`kafka.properties."sasl.password"`).
pub(super) fn shown_key(path: &[String]) -> String {
    path.iter()
        .map(|part| {
            if part.contains('.') {
                format!("{part:?}")
            } else {
                part.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The value of `text` for a key of `kind`.
fn typed(kind: Kind, text: &str) -> Result<Value, String> {
    match kind {
        Kind::Str | Kind::Properties => Ok(Value::String(text.to_owned())),
        Kind::Int => text
            .trim()
            .parse::<i64>()
            .map(Value::Integer)
            .map_err(|_| format!("{text:?} is not an integer")),
        Kind::Bool => match text.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(Value::Boolean(true)),
            "false" => Ok(Value::Boolean(false)),
            _ => Err(format!("{text:?} is not true or false")),
        },
        Kind::List if text.trim_start().starts_with('[') => {
            match toml::from_str::<Table>(&format!("list = {text}")) {
                Ok(mut parsed) => parsed
                    .remove("list")
                    .filter(Value::is_array)
                    .ok_or_else(|| "is not one TOML array".to_owned()),
                Err(e) => Err(format!(
                    "is not a TOML array like [\"a\", \"b\"] ({}); or give comma-separated items without brackets",
                    e.message().trim_end()
                )),
            }
        }
        Kind::List => Ok(Value::Array(
            text.split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(|item| Value::String(item.to_owned()))
                .collect(),
        )),
    }
}

/// Sets `path` in `table`, making the tables on the way.
fn set(table: &mut Table, path: &[String], value: Value) -> Result<(), String> {
    let (last, parents) = path.split_last().expect("a key path has a key");
    let mut here = table;
    for (depth, part) in parents.iter().enumerate() {
        let entry = here
            .entry(part.clone())
            .or_insert_with(|| Value::Table(Table::new()));
        here = match entry {
            Value::Table(inner) => inner,
            Value::Array(_) if depth == 0 && part == "outbox" => {
                return Err(
                    "outbox in the file is a list of [[outbox]] tables; a value all of them share is set with OUTBOX_RELAY__OUTBOX_DEFAULTS__<KEY>, one entry's own value in the file"
                        .to_owned(),
                )
            }
            _ => {
                return Err(format!(
                    "{} in the file is not a table",
                    shown_key(&path[..=depth])
                ))
            }
        };
    }
    here.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn applied(file: &str, pairs: &[(&str, &str)]) -> Result<Table, String> {
        let mut table: Table = toml::from_str(file).unwrap();
        apply(&mut table, vars(pairs))
            .map(|_| table)
            .map_err(|problems| problems.join("\n"))
    }

    #[test]
    fn variables_set_keys_typed_by_the_key() {
        let table = applied(
            "[postgres]\nurl = \"postgres://file@h/d\"\n[relay]\nshutdown_timeout_ms = 5\n",
            &[
                ("OUTBOX_RELAY__POSTGRES__URL", "postgres://env@h/d"),
                ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", " 5000 "),
                ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT_BYTES", "8388608"),
                ("OUTBOX_RELAY__POSTGRES__FAILOVER_SLOT", "FALSE"),
                ("OUTBOX_RELAY__KAFKA__BROKERS", "k1:9092,k2:9092"),
                ("OUTBOX_RELAY__KAFKA__TOPIC_PARTITIONS", "-1"),
                // A string key keeps digits and spaces as they are.
                ("OUTBOX_RELAY__OUTBOX__TOPIC", " 123 "),
                ("PATH", "/usr/bin"),
                ("OUTBOX_RELAY_BIN", "/not/an/override"),
            ],
        )
        .unwrap();
        let expected: Table = toml::from_str(
            "[postgres]\nurl = \"postgres://env@h/d\"\nfailover_slot = false\n\
             [relay]\nshutdown_timeout_ms = 5\nmax_in_flight = 5000\nmax_in_flight_bytes = 8388608\n\
             [kafka]\nbrokers = \"k1:9092,k2:9092\"\ntopic_partitions = -1\n\
             [outbox]\ntopic = \" 123 \"\n",
        )
        .unwrap();
        assert_eq!(table, expected);
    }

    #[test]
    fn property_names_take_a_dot_for_each_single_underscore() {
        let mut table = Table::new();
        let set = apply(
            &mut table,
            vars(&[
                ("OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_PASSWORD", "pw"),
                (
                    "OUTBOX_RELAY__KAFKA__PROPERTIES__security_protocol",
                    "SASL_SSL",
                ),
                (
                    "OUTBOX_RELAY__KAFKA__PROPERTY_FILES__SSL_KEY_PASSWORD",
                    "/run/secrets/key",
                ),
            ]),
        )
        .unwrap();
        let expected: Table = toml::from_str(
            "[kafka.properties]\n\"sasl.password\" = \"pw\"\n\"security.protocol\" = \"SASL_SSL\"\n\
             [kafka.property_files]\n\"ssl.key.password\" = \"/run/secrets/key\"\n",
        )
        .unwrap();
        assert_eq!(table, expected);
        let keys: Vec<&str> = set.iter().map(|o| o.key.as_str()).collect();
        assert!(
            keys.contains(&"kafka.properties.\"sasl.password\""),
            "{keys:?}"
        );
    }

    #[test]
    fn lists_are_toml_arrays_or_comma_separated() {
        for text in [
            "[\"type:header:eventType\", \"tenant:envelope\"]",
            "type:header:eventType, tenant:envelope,",
        ] {
            let table = applied("", &[("OUTBOX_RELAY__OUTBOX__ADDITIONAL", text)]).unwrap();
            assert_eq!(
                table["outbox"]["additional"],
                Value::Array(vec![
                    Value::String("type:header:eventType".into()),
                    Value::String("tenant:envelope".into())
                ]),
                "{text}"
            );
        }
        let table = applied("", &[("OUTBOX_RELAY__OUTBOX__ADDITIONAL", "")]).unwrap();
        assert_eq!(table["outbox"]["additional"], Value::Array(vec![]));
        let err = applied("", &[("OUTBOX_RELAY__OUTBOX__ADDITIONAL", "[\"a\",")]).unwrap_err();
        assert!(err.contains("OUTBOX_RELAY__OUTBOX__ADDITIONAL"), "{err}");
        assert!(err.contains("TOML array"), "{err}");
    }

    #[test]
    fn unknown_variables_are_errors_naming_them() {
        for (name, needle) in [
            (
                "OUTBOX_RELAY__POSTGRESS__URL",
                "no configuration section \"postgress\"",
            ),
            (
                "OUTBOX_RELAY__POSTGRES__SLOTT",
                "[postgres] has no key \"slott\"",
            ),
            ("OUTBOX_RELAY__POSTGRES", "no key"),
            ("OUTBOX_RELAY__KAFKA__PROPERTIES", "one librdkafka property"),
            (
                "OUTBOX_RELAY__KAFKA__PROPERTIES__",
                "one librdkafka property",
            ),
            ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT__X", "no keys below it"),
            // One underscore where two belong.
            ("OUTBOX_RELAY__KAFKA_BROKERS", "no configuration section"),
            (
                "OUTBOX_RELAY_POSTGRES__SLOT",
                "write OUTBOX_RELAY__POSTGRES__SLOT",
            ),
            (
                "OUTBOX_RELAY_DEAD_LETTER_TOPIC",
                "write OUTBOX_RELAY__DEAD_LETTER__TOPIC",
            ),
            (
                "OUTBOX_RELAY_KAFKA__PROPERTIES__SASL_PASSWORD",
                "write OUTBOX_RELAY__KAFKA__PROPERTIES__<…>",
            ),
        ] {
            let err = applied("", &[(name, "x")]).unwrap_err();
            assert!(err.starts_with(name), "{name}: {err}");
            assert!(err.contains(needle), "{name}: {err}");
        }
        // Every problem at once.
        let err = applied(
            "",
            &[
                ("OUTBOX_RELAY__A__B", "1"),
                ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "many"),
            ],
        )
        .unwrap_err();
        assert!(err.contains("OUTBOX_RELAY__A__B"), "{err}");
        assert!(
            err.contains("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT (relay.max_in_flight): \"many\" is not an integer"),
            "{err}"
        );
    }

    #[test]
    fn string_values_are_never_echoed() {
        let err = applied(
            "postgres = 5\n",
            &[("OUTBOX_RELAY__POSTGRES__PASSWORD", "Zq-secret-7")],
        )
        .unwrap_err();
        assert!(err.contains("postgres in the file is not a table"), "{err}");
        assert!(!err.contains("Zq-secret-7"), "{err}");
    }

    #[test]
    fn two_spellings_of_one_key_are_refused() {
        let err = applied(
            "",
            &[
                ("OUTBOX_RELAY__KAFKA__BROKERS", "a:1"),
                ("OUTBOX_RELAY__kafka__brokers", "b:1"),
            ],
        )
        .unwrap_err();
        assert!(err.contains("keep one"), "{err}");
    }
}
