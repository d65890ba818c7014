//! [`Config::validate`]: every section checks itself, then the checks that span
//! sections (the sink against `[kafka]`, the dead-letter topic against the routes, a
//! configuration that relays nothing) run, and either every problem comes back, each
//! with its key path, or the [`Settings`] a run uses, built once. Apart from reading the
//! file and the environment (`config.rs`) because it starts where they end, from a
//! parsed [`Config`], and is where a new cross-section rule goes.

use super::Config;
use crate::pg::sql::QualifiedName;
use crate::relay::router::config::OutboxSection;
use crate::relay::settings::Settings;
use crate::sink::{SinkKind, SinkSpec};

impl Config {
    /// Check every section; returns all problems, each with its key path.
    pub fn validate(self, env_password: Option<String>) -> Result<Settings, Vec<String>> {
        let mut problems = Vec::new();
        let outboxes = self
            .outbox
            .build()
            .map_err(|outbox_problems| problems.extend(outbox_problems))
            .ok();
        // The state table's schema and the tables it must not be: the outbox tables, or
        // for a messages-only relay the one it names.
        let tables: Option<Vec<_>> = match (&outboxes, &self.outbox) {
            // A pattern's schema is no schema: the listed tables only (none: `public`).
            (Some(outboxes), _) if !outboxes.is_empty() => Some(
                outboxes
                    .iter()
                    .filter(|o| o.pattern.is_none())
                    .map(|o| o.table.clone())
                    .collect(),
            ),
            (_, OutboxSection::One(one)) => QualifiedName::parse(&one.table).ok().map(|t| vec![t]),
            (_, OutboxSection::Many(_)) => None,
        };
        let source = self
            .postgres
            .check(tables.as_deref(), env_password)
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
            for (path, entry) in self.outbox.entries() {
                if entry.topic == dead_letter.topic {
                    problems.push(format!(
                        "{path}.topic: {:?} sends every event to {:?}, the [dead_letter] topic, where it would be taken for a dead letter; route events elsewhere or choose another dead_letter.topic",
                        entry.topic, dead_letter.topic
                    ));
                }
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
        if !self.outbox.enabled() && messages.is_none() && problems.is_empty() {
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
        match (outboxes, source, sink) {
            (Some(outboxes), Some((connect, state_table)), Some(sink)) if problems.is_empty() => {
                let primary = self.postgres.primary(&connect).map_err(|p| vec![p])?;
                Ok(Settings {
                    postgres: self.postgres,
                    connect,
                    primary,
                    outboxes,
                    state_table,
                    sink,
                    dead_letter_topic: self.dead_letter.map(|d| d.topic),
                    relay: self.relay,
                    metrics: self.metrics,
                    messages,
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
        assert_eq!(
            v.tables(),
            vec![QualifiedName::parse(DEFAULT_TABLE).unwrap()]
        );
        assert!(matches!(v.sink, SinkSpec::Stdout));
        assert_eq!(v.outboxes[0].router.key_column(), "id");
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

    #[test]
    fn password_from_environment_when_url_has_none() {
        let config = parse("[postgres]\nurl = \"postgres://u@h/d\"\n").unwrap();
        let v = config.validate(Some("envpw".into())).unwrap();
        assert_eq!(v.connect.password.unwrap().expose(), "envpw");
    }
}
