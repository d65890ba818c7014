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
//! ([`report`]), and the sections leave values of secret keys out of theirs.

mod env;
#[cfg(test)]
mod messages_tests;
mod report;

use std::path::Path;

use serde::Deserialize;

use crate::metrics::MetricsConfig;
use crate::pg::config::PostgresConfig;
use crate::relay::messages::config::MessagesConfig;
use crate::relay::router::config::OutboxConfig;
use crate::relay::settings::{DeadLetterConfig, RelayConfig, Settings};
use crate::sink::kafka_config::KafkaConfig;
use crate::sink::{SinkConfig, SinkKind, SinkSpec};

/// The checked configuration a run uses.
pub type Validated = Settings;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub postgres: PostgresConfig,
    #[serde(default)]
    pub outbox: OutboxConfig,
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

    /// Check every section; returns all problems, each with its key path.
    pub fn validate(self, env_password: Option<String>) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        let outbox = self
            .outbox
            .build()
            .map_err(|outbox_problems| problems.extend(outbox_problems))
            .ok();
        let source = self
            .postgres
            .check(outbox.as_ref().map(|o| &o.table), env_password)
            .map_err(|postgres_problems| problems.extend(postgres_problems))
            .ok();
        let sink = match (self.sink.kind, self.kafka) {
            (SinkKind::Kafka, None) => {
                problems.push(
                    "kafka: [sink] type = \"kafka\" needs a [kafka] section with brokers = \"host:port\"".into(),
                );
                None
            }
            (SinkKind::Kafka, Some(mut kafka)) => {
                problems.extend(kafka.read_property_files());
                problems.extend(kafka.problems());
                problems.extend(crate::sink::kafka_config::check_queue_kbytes(
                    &kafka.properties,
                    self.relay.max_in_flight_bytes,
                ));
                Some(SinkSpec::Kafka(kafka))
            }
            // Only the Kafka sink reads [kafka] (exactly_once is in it): on stdout a
            // [kafka] section means the file meant Kafka, and running would print the
            // events and acknowledge them while Kafka's consumers wait. [dead_letter]
            // is not Kafka-only: the stdout sink prints a dead letter as a line of its
            // topic, so it keeps its meaning there.
            (SinkKind::Stdout, Some(_)) => {
                problems.push(
                    "kafka: a [kafka] section is set but the sink is stdout ([sink] type is \"stdout\", the default when unset), which prints the events on stdout and acknowledges them, never sending them to Kafka; set [sink] type = \"kafka\" (or OUTBOX_RELAY__SINK__TYPE=kafka), or remove the [kafka] section".into(),
                );
                None
            }
            (SinkKind::Stdout, None) => Some(SinkSpec::Stdout),
        };
        if let Some(dead_letter) = &self.dead_letter {
            problems.extend(dead_letter.problems());
            let constant = outbox.as_ref().and_then(|o| o.router.constant_topic());
            if constant.as_deref() == Some(dead_letter.topic.as_str()) {
                problems.push(format!(
                    "outbox.topic: {:?} sends every event to {:?}, the [dead_letter] topic, where it would be taken for a dead letter; route events elsewhere or choose another dead_letter.topic",
                    self.outbox.topic, dead_letter.topic
                ));
            }
        }
        if let Some(metrics) = &self.metrics {
            problems.extend(metrics.problems());
        }
        let messages = match &self.messages {
            Some(messages) => messages
                .build()
                .map_err(|message_problems| problems.extend(message_problems))
                .ok()
                .flatten(),
            None => None,
        };
        if !self.outbox.enabled && messages.is_none() && problems.is_empty() {
            problems.push(
                "outbox.enabled: false leaves nothing to relay; configure a [messages] section (the table-less outbox) or enable the outbox table".into(),
            );
        }
        if let (Some(messages), Some(dead_letter)) = (&messages, &self.dead_letter) {
            if messages.fixed_topics().any(|t| t == dead_letter.topic) {
                problems.push(format!(
                    "messages.topics: a prefix is routed to {:?}, the [dead_letter] topic, where its records would be taken for dead letters; choose another topic",
                    dead_letter.topic
                ));
            }
        }
        problems.extend(self.relay.problems());
        match (outbox, source, sink) {
            (Some(outbox), Some((connect, state_table)), Some(sink)) if problems.is_empty() => {
                Ok(Settings {
                    postgres: self.postgres,
                    connect,
                    table: outbox.table,
                    state_table,
                    router: outbox.router,
                    sink,
                    dead_letter_topic: self.dead_letter.map(|d| d.topic),
                    relay: self.relay,
                    metrics: self.metrics,
                    outbox_enabled: self.outbox.enabled,
                    messages,
                })
            }
            _ => Err(problems),
        }
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
    use crate::pg::config::{DEFAULT_PUBLICATION, DEFAULT_SLOT};
    use crate::pg::sql::QualifiedName;
    use crate::relay::router::config::DEFAULT_TABLE;

    fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let config =
            parse("[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n").unwrap();
        let v = config.validate(None).unwrap();
        assert_eq!(v.postgres.slot, DEFAULT_SLOT);
        assert_eq!(v.postgres.publication, DEFAULT_PUBLICATION);
        assert_eq!(v.table, QualifiedName::parse(DEFAULT_TABLE).unwrap());
        assert!(matches!(v.sink, SinkSpec::Stdout));
        assert_eq!(v.router.key_column(), "id");
        assert_eq!(v.connect.password.as_ref().unwrap().expose(), "pw");
        assert!(
            !format!("{v:?}").contains("pw@"),
            "password must be redacted"
        );
    }

    #[test]
    fn contract_keys_parse() {
        let config = parse(
            r#"
            [postgres]
            url = "postgres://relay:secret@127.0.0.1:5432/app"
            slot = "outbox_relay"
            publication = "outbox_relay"
            [outbox]
            table = "public.outbox"
            [sink]
            type = "stdout"
            "#,
        )
        .unwrap();
        assert!(config.validate(None).is_ok());
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

    #[test]
    fn validate_reports_every_problem_with_its_path() {
        let config = parse(
            "[postgres]\nurl = \"http://x\"\nslot = \"Bad-Slot\"\n[outbox]\ntable = \"a.b.c\"\nid_column = \"\"\n",
        )
        .unwrap();
        let problems = config.validate(None).unwrap_err();
        let all = problems.join("\n");
        for needle in [
            "postgres.url",
            "postgres.slot",
            "outbox.table",
            "outbox.id_column",
        ] {
            assert!(all.contains(needle), "missing {needle} in {all}");
        }
    }

    #[test]
    fn kafka_defaults_take_the_brokers_replication_factor() {
        let config = parse(
            "[postgres]\nurl = \"postgres://u@h/d\"\n[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"k:9092\"\n",
        )
        .unwrap();
        let v = config.validate(None).unwrap();
        let SinkSpec::Kafka(kafka) = v.sink else {
            panic!("not the Kafka sink: {:?}", v.sink);
        };
        assert_eq!(kafka.topic_replication_factor, -1);
        assert_eq!(kafka.topic_partitions, 1);
    }

    #[test]
    fn kafka_properties_that_give_up_on_events_are_refused_with_their_key() {
        let config = parse(
            "[postgres]\nurl = \"postgres://u@h/d\"\n[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"k:9092\"\n[kafka.properties]\n\"request.required.acks\" = \"1\"\n\"delivery.timeout.ms\" = \"3000\"\n",
        )
        .unwrap();
        let all = config.validate(None).unwrap_err().join("\n");
        assert!(
            all.contains("kafka.properties.\"request.required.acks\""),
            "{all}"
        );
        assert!(
            all.contains("kafka.properties.\"delivery.timeout.ms\""),
            "{all}"
        );
    }

    #[test]
    fn a_kafka_section_on_the_stdout_sink_is_refused() {
        let kafka = "[kafka]\nbrokers = \"k:9092\"\n[dead_letter]\ntopic = \"dead\"\n";
        for sink in ["", "[sink]\ntype = \"stdout\"\n"] {
            let config = parse(&format!(
                "[postgres]\nurl = \"postgres://u@h/d\"\n{sink}{kafka}"
            ))
            .unwrap();
            let all = config.validate(None).unwrap_err().join("\n");
            assert!(
                all.starts_with("kafka: a [kafka] section is set but the sink is stdout"),
                "{all}"
            );
            assert!(
                all.contains("[sink] type = \"kafka\"")
                    && all.contains("remove the [kafka] section"),
                "{all}"
            );
        }
        // [dead_letter] alone keeps its meaning on stdout (dead letters are printed).
        let config =
            parse("[postgres]\nurl = \"postgres://u@h/d\"\n[dead_letter]\ntopic = \"dead\"\n")
                .unwrap();
        assert!(config.validate(None).is_ok());
    }

    #[test]
    fn a_constant_topic_equal_to_the_dead_letter_topic_is_refused() {
        let config = parse(
            "[postgres]\nurl = \"postgres://u@h/d\"\n[outbox]\ntopic = \"events\"\n[dead_letter]\ntopic = \"events\"\n",
        )
        .unwrap();
        let all = config.validate(None).unwrap_err().join("\n");
        assert!(
            all.contains("outbox.topic") && all.contains("dead_letter"),
            "{all}"
        );
        // A template that depends on the row may still hit the name for some rows:
        // those are refused at routing time, not here.
        let config = parse(
            "[postgres]\nurl = \"postgres://u@h/d\"\n[dead_letter]\ntopic = \"outbox.event.same\"\n",
        )
        .unwrap();
        assert!(config.validate(None).is_ok());
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
        assert_eq!(sections, fields(None), "sections in config/env.rs KEYS");
        for (section, keys) in env::KEYS {
            let keys: std::collections::BTreeSet<String> =
                keys.iter().map(|(key, _)| key.to_string()).collect();
            assert_eq!(
                keys,
                fields(Some(section)),
                "keys of [{section}] in config/env.rs KEYS: a key added to a section's struct needs its line there (with its kind)"
            );
        }
    }

    #[test]
    fn password_from_environment_when_url_has_none() {
        let config = parse("[postgres]\nurl = \"postgres://u@h/d\"\n").unwrap();
        let v = config.validate(Some("envpw".into())).unwrap();
        assert_eq!(v.connect.password.unwrap().expose(), "envpw");
    }
}
