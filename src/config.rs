//! Configuration: one TOML tree, composed of the sections each part owns (Vector's
//! shape): `[postgres]` ([`crate::pg::config`]), `[outbox]` (the router,
//! [`crate::relay::router::config`]), `[sink]` and `[kafka]` ([`crate::sink`]),
//! `[relay]` and `[dead_letter]` ([`crate::relay::settings`]), `[metrics]`
//! ([`crate::metrics`]). Each section checks itself; this module parses the file, asks
//! every section for its problems, adds the checks that span sections, and returns every
//! problem with its key path, or the [`Settings`] a run uses, built once.
//!
//! ```text
//! file ──toml──▶ tree ──▶ env::apply (OUTBOX_RELAY__*) ──▶ Config ──▶ validate ──▶ Settings
//!        syntax errors      overrides, named by variable      shape errors   problems
//! ```
//!
//! Environment overrides go into the parsed tree before it is deserialized, so a value
//! from the environment meets the same checks and messages as one from the file.
//! Secrets (passwords, `[kafka.properties]` secrets, the URL's user info) never appear
//! in a message: errors give line, column and key path instead of the file's text
//! (`report`), and the sections leave values of secret keys out of theirs.
//!
//! This file reads the file and the environment ([`Config::load`]); the checks across
//! sections and the building of [`Settings`] are in `config/validate.rs`
//! ([`Config::validate`]).

mod env;
#[cfg(test)]
mod messages_tests;
pub mod outboxes;
#[cfg(test)]
mod outboxes_tests;
mod report;
mod validate;

use std::path::Path;

use serde::Deserialize;

use crate::metrics::MetricsConfig;
use crate::pg::config::PostgresConfig;
use crate::relay::messages::config::MessagesConfig;
use crate::relay::router::config::OutboxSection;
use crate::relay::settings::{DeadLetterConfig, RelayConfig, Settings};
use crate::sink::kafka_config::KafkaConfig;
use crate::sink::SinkConfig;

/// The checked configuration a run uses.
pub type Validated = Settings;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub postgres: PostgresConfig,
    /// One `[outbox]`, or a list of `[[outbox]]` tables (with `[outbox_defaults]`
    /// merged into each entry by [`outboxes::merge_defaults`] before this is read).
    #[serde(default)]
    pub outbox: OutboxSection,
    #[serde(default)]
    pub sink: SinkConfig,
    #[serde(default)]
    pub relay: RelayConfig,
    #[serde(default)]
    pub kafka: Option<KafkaConfig>,
    #[serde(default)]
    pub dead_letter: Option<DeadLetterConfig>,
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
    /// The table-less outbox (`pg_logical_emit_message`).
    #[serde(default)]
    pub messages: Option<MessagesConfig>,
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("config file {path} has {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "))]
    Invalid { path: String, problems: Vec<String> },
    #[error("the environment has {} problem(s) with {}* variables:\n  - {}", problems.len(), env::PREFIX, problems.join("\n  - "))]
    Environment { problems: Vec<String> },
}

/// libpq's password variable, used when the configuration gives no password.
const PGPASSWORD: &str = "PGPASSWORD";

impl Config {
    /// Read the config file, apply the environment's overrides, parse and validate.
    pub fn load(path: &Path) -> Result<Validated, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let mut vars = Vec::new();
        let mut problems = Vec::new();
        for (name, value) in std::env::vars_os() {
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(env::SHORT_PREFIX) || name == PGPASSWORD {
                match value.into_string() {
                    Ok(value) => vars.push((name.to_owned(), value)),
                    Err(_) => problems.push(format!("{name}: not valid UTF-8")),
                }
            }
        }
        if !problems.is_empty() {
            return Err(ConfigError::Environment { problems });
        }
        Self::load_from(&shown, &text, vars)
    }

    /// [`Config::load`] on the file's `text` (named `path` in messages) and the
    /// environment variables `vars`: `OUTBOX_RELAY__*` overrides and `PGPASSWORD`;
    /// others are ignored.
    pub fn load_from(
        path: &str,
        text: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Validated, ConfigError> {
        let mut tree: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: report::syntax_error(text, &e),
        })?;
        let mut env_password = None;
        let vars = vars.into_iter().filter_map(|(name, value)| {
            if name == PGPASSWORD {
                env_password = Some(value);
                None
            } else {
                Some((name, value))
            }
        });
        let overrides = env::apply(&mut tree, vars)
            .map_err(|problems| ConfigError::Environment { problems })?;
        outboxes::merge_defaults(&mut tree).map_err(|problems| ConfigError::Invalid {
            path: path.to_owned(),
            problems,
        })?;
        for set in &overrides {
            tracing::info!(variable = %set.variable, key = %set.key, "configuration key set from the environment");
        }
        let config = Config::deserialize(tree).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: report::shape_error(text, &e, &overrides),
        })?;
        config
            .validate(env_password)
            .map_err(|problems| ConfigError::Invalid {
                path: path.to_owned(),
                problems: problems
                    .into_iter()
                    .map(|problem| naming_the_variable(problem, &overrides))
                    .collect(),
            })
    }
}

/// `problem` (`<key path>: <reason>`) with the variable that set its key, when one did.
fn naming_the_variable(problem: String, overrides: &[env::Override]) -> String {
    let set = overrides.iter().find(|set| {
        problem
            .strip_prefix(set.key.as_str())
            .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('.'))
    });
    match set {
        Some(set) => {
            let (key, rest) = problem.split_at(set.key.len());
            format!("{key} (set by {}){rest}", set.variable)
        }
        None => problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::SinkSpec;

    fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn unknown_keys_and_sinks_are_rejected() {
        let err = parse("[postgres]\nurl = \"postgres://u@h/d\"\nslott = \"x\"\n").unwrap_err();
        assert!(err.contains("unknown field `slott`"), "{err}");
        let err = parse("[postgres]\nurl = \"postgres://u@h/d\"\n[sink]\ntype = \"kafak\"\n")
            .unwrap_err();
        assert!(err.contains("kafak"), "{err}");
        let err = parse("[postgres]\nslot = \"x\"\n").unwrap_err();
        assert!(err.contains("missing field `url`"), "{err}");
    }

    fn load(text: &str, vars: &[(&str, &str)]) -> Result<Validated, String> {
        let vars = vars.iter().map(|(n, v)| (n.to_string(), v.to_string()));
        Config::load_from("relay.toml", text, vars).map_err(|e| e.to_string())
    }

    #[test]
    fn a_nearly_empty_file_and_the_environment_make_a_config() {
        let v = load(
            "# everything from the environment\n",
            &[
                (
                    "OUTBOX_RELAY__POSTGRES__URL",
                    "postgres://relay@db:5432/app",
                ),
                ("OUTBOX_RELAY__POSTGRES__PASSWORD", "Zq-secret"),
                ("OUTBOX_RELAY__SINK__TYPE", "kafka"),
                ("OUTBOX_RELAY__KAFKA__BROKERS", "k1:9092,k2:9092"),
                ("OUTBOX_RELAY__KAFKA__CREATE_TOPICS", "false"),
                ("OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_USERNAME", "relay"),
                (
                    "OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_PASSWORD",
                    "Zq-kafka-secret",
                ),
                ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "5000"),
                ("OUTBOX_RELAY__OUTBOX__ADDITIONAL", "type:header:eventType"),
                ("PGPASSWORD", "not-used"),
            ],
        )
        .unwrap();
        assert_eq!(v.connect.host, "db");
        assert_eq!(v.connect.password.as_ref().unwrap().expose(), "Zq-secret");
        assert_eq!(v.relay.max_in_flight, 5000);
        let SinkSpec::Kafka(kafka) = &v.sink else {
            panic!("not the Kafka sink: {:?}", v.sink);
        };
        assert_eq!(kafka.brokers, "k1:9092,k2:9092");
        assert!(!kafka.create_topics);
        assert_eq!(kafka.properties["sasl.password"], "Zq-kafka-secret");
        assert_eq!(kafka.properties["sasl.username"], "relay");
        let shown = format!("{v:?}");
        assert!(!shown.contains("Zq-"), "secrets in Debug: {shown}");
    }

    #[test]
    fn the_environment_overrides_the_file_and_pgpassword_comes_last() {
        let file = "[postgres]\nurl = \"postgres://relay@db/app\"\nslot = \"from_file\"\n";
        let v = load(
            file,
            &[
                ("OUTBOX_RELAY__POSTGRES__SLOT", "from_env"),
                ("PGPASSWORD", "pg-env"),
            ],
        )
        .unwrap();
        assert_eq!(v.postgres.slot, "from_env");
        assert_eq!(v.connect.password.unwrap().expose(), "pg-env");
    }

    #[test]
    fn problems_of_values_from_the_environment_name_the_variable() {
        let err = load(
            "[postgres]\nurl = \"postgres://relay@db/app\"\n",
            &[
                ("OUTBOX_RELAY__POSTGRES__SLOT", "Bad-Slot"),
                ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "0"),
            ],
        )
        .unwrap_err();
        assert!(
            err.contains("postgres.slot (set by OUTBOX_RELAY__POSTGRES__SLOT): "),
            "{err}"
        );
        assert!(
            err.contains("relay.max_in_flight (set by OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT): "),
            "{err}"
        );
        let err = load("", &[("OUTBOX_RELAY__POSTGRES__SLOTT", "x")]).unwrap_err();
        assert!(err.contains("the environment has 1 problem(s)"), "{err}");
        assert!(
            err.contains("OUTBOX_RELAY__POSTGRES__SLOTT: [postgres] has no key"),
            "{err}"
        );
        let err = load("", &[("OUTBOX_RELAY__OUTBOX__ADDITIONAL", "[1, 2]")]).unwrap_err();
        assert!(
            err.contains("set by OUTBOX_RELAY__OUTBOX__ADDITIONAL"),
            "{err}"
        );
    }

    #[test]
    fn passwords_from_a_file_and_only_one_source() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pg");
        std::fs::write(&file, "Zq-file-secret\r\n").unwrap();
        let text = format!(
            "[postgres]\nurl = \"postgres://relay@db/app\"\npassword_file = {:?}\n",
            file.display().to_string()
        );
        let v = load(&text, &[("PGPASSWORD", "pg-env")]).unwrap();
        assert_eq!(v.connect.password.unwrap().expose(), "Zq-file-secret");
        let err = load(
            &text,
            &[(
                "OUTBOX_RELAY__POSTGRES__URL",
                "postgres://relay:Zq-url@db/app",
            )],
        )
        .unwrap_err();
        assert!(
            err.contains(
                "postgres.password: given in postgres.url and postgres.password_file; keep one"
            ),
            "{err}"
        );
        assert!(!err.contains("Zq-"), "{err}");
        let err = load(
            "[postgres]\nurl = \"postgres://relay@db/app\"\npassword_file = \"/nonexistent/pg\"\n",
            &[],
        )
        .unwrap_err();
        assert!(
            err.contains("postgres.password_file: cannot read /nonexistent/pg"),
            "{err}"
        );
    }

    #[test]
    fn kafka_secrets_from_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("kafka");
        std::fs::write(&file, "Zq-kafka-file\n").unwrap();
        let v = load(
            "[postgres]\nurl = \"postgres://relay@db/app\"\n[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"k:9092\"\n",
            &[(
                "OUTBOX_RELAY__KAFKA__PROPERTY_FILES__SASL_PASSWORD",
                &file.display().to_string(),
            )],
        )
        .unwrap();
        let SinkSpec::Kafka(kafka) = &v.sink else {
            panic!("not the Kafka sink: {:?}", v.sink);
        };
        assert_eq!(kafka.properties["sasl.password"], "Zq-kafka-file");
        assert!(!format!("{v:?}").contains("Zq-kafka-file"));
    }

    #[test]
    fn file_errors_never_quote_the_file() {
        for text in [
            "[postgres]\nurl = \"postgres://relay:Zq-secret@db/app\n",
            "[postgres]\nurl = \"postgres://relay@db/app\"\n[kafka.properties]\n\"sasl.password\" = \"Zq-secret\" x\n",
            "[postgres]\nurl = \"postgres://relay@db/app\"\n[kafka]\nproperties = \"sasl.password=Zq-secret\"\n",
            "[postgres]\nurl = \"postgres://relay:Zq-secret@db/app\"\nstatus_interval_ms = \"Zq-secret\"\n",
        ] {
            let err = load(text, &[]).unwrap_err();
            assert!(!err.contains("Zq-secret"), "{err}");
            assert!(err.contains("line "), "{err}");
        }
    }

    /// The field names serde's message for an unknown `probe` key in `[section]` (or at
    /// the top with `None`) lists as expected.
    fn fields(section: Option<&str>) -> std::collections::BTreeSet<String> {
        let text = match section {
            Some("postgres") => "[postgres]\nprobe_key_that_is_no_field = 1\n".into(),
            Some(section) => format!(
                "[postgres]\nurl = \"postgres://u@h/d\"\n[{section}]\nprobe_key_that_is_no_field = 1\n"
            ),
            None => "probe_key_that_is_no_field = 1\n".into(),
        };
        let message = parse(&text).unwrap_err();
        let expected = message
            .split("expected ")
            .nth(1)
            .unwrap_or_else(|| panic!("no field list in {message}"));
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_environment_key_table_matches_the_structs() {
        let sections: std::collections::BTreeSet<String> =
            env::KEYS.iter().map(|(name, _)| name.to_string()).collect();
        let mut struct_sections = fields(None);
        struct_sections.insert(outboxes::DEFAULTS.to_owned());
        assert_eq!(
            sections, struct_sections,
            "sections in config/env/keys.rs KEYS"
        );
        for (section, keys) in env::KEYS {
            let keys: std::collections::BTreeSet<String> =
                keys.iter().map(|(key, _)| key.to_string()).collect();
            if *section == outboxes::DEFAULTS {
                // Merged into the [[outbox]] entries before the tree is read: [outbox]'s
                // keys but table and enabled.
                let shared: std::collections::BTreeSet<String> =
                    outboxes::default_keys().map(str::to_owned).collect();
                assert_eq!(
                    keys, shared,
                    "keys of [{section}] in config/env/keys.rs KEYS"
                );
                continue;
            }
            assert_eq!(
                keys,
                fields(Some(section)),
                "keys of [{section}] in config/env/keys.rs KEYS: a key added to a section's struct needs its line there (with its kind)"
            );
        }
    }
}
