//! Configuration: one TOML tree, composed of the sections each part owns (Vector's
//! shape): `[postgres]` ([`crate::pg::config`]), `[outbox]` (the router,
//! [`crate::relay::router::config`]), `[sink]` and `[kafka]` ([`crate::sink`]),
//! `[relay]` and `[dead_letter]` ([`crate::relay::settings`]), `[metrics]`
//! ([`crate::metrics`]). Each section checks itself; this module parses the file, asks
//! every section for its problems, adds the checks that span sections, and returns every
//! problem with its key path, or the [`Settings`] a run uses, built once.

use std::path::Path;

use serde::Deserialize;

use crate::metrics::MetricsConfig;
use crate::pg::config::PostgresConfig;
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
}

impl Config {
    /// Read, parse and validate a config file.
    pub fn load(path: &Path) -> Result<Validated, ConfigError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: shown.clone(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        config
            .validate(std::env::var("PGPASSWORD").ok())
            .map_err(|problems| ConfigError::Invalid {
                path: shown,
                problems,
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
            (SinkKind::Kafka, Some(kafka)) => {
                problems.extend(kafka.problems());
                Some(SinkSpec::Kafka(kafka))
            }
            (SinkKind::Stdout, _) => Some(SinkSpec::Stdout),
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
                })
            }
            _ => Err(problems),
        }
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

    #[test]
    fn password_from_environment_when_url_has_none() {
        let config = parse("[postgres]\nurl = \"postgres://u@h/d\"\n").unwrap();
        let v = config.validate(Some("envpw".into())).unwrap();
        assert_eq!(v.connect.password.unwrap().expose(), "envpw");
    }
}
