//! Configuration: one TOML tree, serde structs with `deny_unknown_fields`, defaults from
//! named constants, and [`Config::validate`] returning every problem with its key path.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::pg::sql::QualifiedName;
use crate::pg::url::{ConnectParams, Secret};

/// Slot and publication names when none are configured.
pub const DEFAULT_SLOT: &str = "outbox_relay";
pub const DEFAULT_PUBLICATION: &str = "outbox_relay";
/// Debezium's default outbox table and columns.
pub const DEFAULT_TABLE: &str = "public.outbox";
pub const DEFAULT_ID_COLUMN: &str = "id";
pub const DEFAULT_ROUTE_BY_COLUMN: &str = "aggregatetype";
pub const DEFAULT_TYPE_COLUMN: &str = "type";
pub const DEFAULT_PAYLOAD_COLUMN: &str = "payload";
/// Debezium's default topic template.
pub const DEFAULT_TOPIC: &str = "outbox.event.${routedByValue}";
/// Debezium's default `route.topic.regex`: the whole route-by value.
pub const DEFAULT_TOPIC_REGEX: &str = "(?<routedByValue>.*)";
pub use crate::sink::kafka_config::{DEFAULT_TOPIC_PARTITIONS, DEFAULT_TOPIC_REPLICATION_FACTOR};
/// Events handed to the sink but not yet confirmed, before reading pauses. Bounds memory
/// whatever the transaction size; large enough to keep a Kafka producer's batches full.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 100_000;
/// How long a graceful shutdown waits for in-flight deliveries.
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
/// A sink with events in flight and no confirmation for this long releases the
/// replication connection, so a dead broker cannot hold PostgreSQL's shutdown for long.
pub const DEFAULT_STALL_RELEASE_MS: u64 = 60_000;
/// Upper bound of the status update interval; the actual interval is also kept under a
/// third of the server's `wal_sender_timeout`.
pub const DEFAULT_STATUS_INTERVAL_MS: u64 = 10_000;

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `host:port` to serve Prometheus metrics on (`GET /metrics`).
    pub listen: String,
}

pub use crate::sink::kafka_config::KafkaConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// Topic for events that cannot be delivered as they are; they are acknowledged
    /// once the dead-letter record is delivered.
    pub topic: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresConfig {
    /// libpq URI; the password may also come from the `PGPASSWORD` environment variable.
    pub url: Secret,
    #[serde(default = "default_slot")]
    pub slot: String,
    #[serde(default = "default_publication")]
    pub publication: String,
    /// Upper bound of the standby status update interval.
    #[serde(default = "default_status_interval_ms")]
    pub status_interval_ms: u64,
    /// Reconnect when nothing arrives from PostgreSQL for this long although it was
    /// asked to reply; unset = the server's `wal_sender_timeout` (60 s when disabled).
    #[serde(default)]
    pub receive_timeout_ms: Option<u64>,
    /// The table where the relay records its slot (that it streamed from it, and the
    /// last acknowledged position), so a lost slot is never silently replaced. Default:
    /// `outbox_relay_state` in the outbox's schema.
    #[serde(default)]
    pub state_table: Option<String>,
    /// Create the slot as a failover slot (PostgreSQL 17+: synchronised to standbys
    /// with `sync_replication_slots`, so a promoted standby has it). Ignored before 17.
    #[serde(default = "default_true")]
    pub failover_slot: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    #[serde(default = "default_table")]
    pub table: String,
    #[serde(default = "default_id_column")]
    pub id_column: String,
    /// Column whose value becomes the record key; Debezium's default would be `aggregateid`.
    #[serde(default = "default_id_column")]
    pub key_column: String,
    #[serde(default = "default_route_by_column")]
    pub route_by_column: String,
    #[serde(default = "default_type_column")]
    pub type_column: String,
    #[serde(default = "default_payload_column")]
    pub payload_column: String,
    /// Column giving the record timestamp; the transaction's commit time when unset.
    #[serde(default)]
    pub timestamp_column: Option<String>,
    /// Topic template; `${routedByValue}` is replaced by the route-by column's value
    /// (or by the named group `routedByValue` of `topic_regex`).
    #[serde(default = "default_topic")]
    pub topic: String,
    /// Debezium's `route.topic.regex`, applied to the route-by value.
    #[serde(default = "default_topic_regex")]
    pub topic_regex: String,
    /// Extra columns, as Debezium's `table.fields.additional.placement`:
    /// `"column:header[:alias]"`, `"column:envelope[:alias]"` or `"column:partition"`.
    #[serde(default)]
    pub additional: Vec<String>,
    /// A NULL or empty payload becomes a tombstone (null value).
    #[serde(default)]
    pub tombstone_on_empty_payload: bool,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            table: default_table(),
            id_column: default_id_column(),
            key_column: default_id_column(),
            route_by_column: default_route_by_column(),
            type_column: default_type_column(),
            payload_column: default_payload_column(),
            timestamp_column: None,
            topic: default_topic(),
            topic_regex: default_topic_regex(),
            additional: Vec::new(),
            tombstone_on_empty_payload: false,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    #[serde(rename = "type", default)]
    pub kind: SinkKind,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// One JSON line per event on stdout: the embedded default, no Kafka needed.
    #[default]
    Stdout,
    /// Kafka through librdkafka: idempotent producer, `acks=all`; needs `[kafka]`.
    Kafka,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
    /// With events in flight and no delivery confirmed for this long, let the
    /// replication connection go (and reconnect): PostgreSQL's shutdown waits for the
    /// acknowledgements a stalled sink cannot give.
    #[serde(default = "default_stall_release_ms")]
    pub stall_release_ms: u64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            shutdown_timeout_ms: DEFAULT_SHUTDOWN_TIMEOUT_MS,
            stall_release_ms: DEFAULT_STALL_RELEASE_MS,
        }
    }
}

fn default_slot() -> String {
    DEFAULT_SLOT.into()
}
fn default_publication() -> String {
    DEFAULT_PUBLICATION.into()
}
fn default_status_interval_ms() -> u64 {
    DEFAULT_STATUS_INTERVAL_MS
}
fn default_table() -> String {
    DEFAULT_TABLE.into()
}
fn default_id_column() -> String {
    DEFAULT_ID_COLUMN.into()
}
fn default_route_by_column() -> String {
    DEFAULT_ROUTE_BY_COLUMN.into()
}
fn default_type_column() -> String {
    DEFAULT_TYPE_COLUMN.into()
}
fn default_payload_column() -> String {
    DEFAULT_PAYLOAD_COLUMN.into()
}
fn default_topic() -> String {
    DEFAULT_TOPIC.into()
}
fn default_true() -> bool {
    true
}
fn default_topic_regex() -> String {
    DEFAULT_TOPIC_REGEX.into()
}
fn default_max_in_flight() -> usize {
    DEFAULT_MAX_IN_FLIGHT
}
fn default_stall_release_ms() -> u64 {
    DEFAULT_STALL_RELEASE_MS
}
fn default_shutdown_timeout_ms() -> u64 {
    DEFAULT_SHUTDOWN_TIMEOUT_MS
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret::new)
    }
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

/// The checked, ready-to-use settings derived from [`Config`].
#[derive(Debug, Clone)]
pub struct Validated {
    pub config: Config,
    pub connect: ConnectParams,
    pub table: QualifiedName,
    /// Where the relay records its slot ([`crate::pg::state`]).
    pub state_table: QualifiedName,
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

    /// Check every setting; returns all problems, each with its key path.
    pub fn validate(self, env_password: Option<String>) -> Result<Validated, Vec<String>> {
        let mut problems = Vec::new();
        let connect = match ConnectParams::from_url(self.postgres.url.expose()) {
            Ok(mut params) => {
                if params.password.is_none() {
                    params.password = env_password.map(Secret::new);
                }
                Some(params)
            }
            Err(e) => {
                problems.push(format!("postgres.url: {e}"));
                None
            }
        };
        for (path, value) in [
            ("postgres.slot", &self.postgres.slot),
            ("postgres.publication", &self.postgres.publication),
        ] {
            if value.is_empty() {
                problems.push(format!("{path}: must not be empty"));
            }
        }
        // Slot names are restricted by PostgreSQL itself; say so before it does.
        if !self.postgres.slot.is_empty()
            && !self
                .postgres
                .slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            problems.push(format!(
                "postgres.slot: {:?} may contain only lower case letters, digits and underscores",
                self.postgres.slot
            ));
        }
        if self.postgres.slot.len() > 63 {
            problems.push("postgres.slot: longer than 63 bytes".into());
        }
        if self.postgres.status_interval_ms == 0 {
            problems.push("postgres.status_interval_ms: must be greater than 0".into());
        }
        let table = match QualifiedName::parse(&self.outbox.table) {
            Ok(table) => Some(table),
            Err(e) => {
                problems.push(format!("outbox.table: {e}"));
                None
            }
        };
        for (path, value) in [
            ("outbox.id_column", &self.outbox.id_column),
            ("outbox.key_column", &self.outbox.key_column),
            ("outbox.route_by_column", &self.outbox.route_by_column),
            ("outbox.type_column", &self.outbox.type_column),
            ("outbox.payload_column", &self.outbox.payload_column),
            ("outbox.topic", &self.outbox.topic),
        ] {
            if value.is_empty() {
                problems.push(format!("{path}: must not be empty"));
            }
        }
        match (self.sink.kind, &self.kafka) {
            (SinkKind::Kafka, None) => problems.push(
                "kafka: [sink] type = \"kafka\" needs a [kafka] section with brokers = \"host:port\"".into(),
            ),
            (SinkKind::Kafka, Some(kafka)) => {
                if kafka.brokers.trim().is_empty() {
                    problems.push("kafka.brokers: must not be empty".into());
                }
                if kafka.topic_partitions == 0 || kafka.topic_partitions < -1 {
                    problems.push("kafka.topic_partitions: must be -1 (broker default) or at least 1".into());
                }
                if kafka.topic_replication_factor == 0 || kafka.topic_replication_factor < -1 {
                    problems.push("kafka.topic_replication_factor: must be -1 (broker default) or at least 1".into());
                }
                problems.extend(crate::sink::kafka_config::check_properties(
                    &kafka.properties,
                ));
            }
            (SinkKind::Stdout, _) => {}
        }
        if let Some(dead_letter) = &self.dead_letter {
            if dead_letter.topic.is_empty() {
                problems.push("dead_letter.topic: must not be empty".into());
            }
        }
        match crate::relay::router::Router::try_new(&self.outbox) {
            Ok(router) => {
                let dead_letter = self.dead_letter.as_ref().map(|d| d.topic.as_str());
                if let (Some(constant), Some(dead_letter)) = (router.constant_topic(), dead_letter)
                {
                    if constant == dead_letter {
                        problems.push(format!(
                            "outbox.topic: {:?} sends every event to {constant:?}, the [dead_letter] topic, where it would be taken for a dead letter; route events elsewhere or choose another dead_letter.topic",
                            self.outbox.topic
                        ));
                    }
                }
            }
            Err(router_problems) => problems.extend(router_problems),
        }
        if let Some(metrics) = &self.metrics {
            if metrics.listen.parse::<std::net::SocketAddr>().is_err() {
                problems.push(format!(
                    "metrics.listen: {:?} is not an address like 127.0.0.1:9187",
                    metrics.listen
                ));
            }
        }
        if self.relay.stall_release_ms == 0 {
            problems.push("relay.stall_release_ms: must be greater than 0".into());
        }
        if self.postgres.receive_timeout_ms == Some(0) {
            problems.push("postgres.receive_timeout_ms: must be greater than 0".into());
        }
        if self.relay.max_in_flight == 0 {
            problems.push("relay.max_in_flight: must be greater than 0".into());
        }
        let state_table = match (&self.postgres.state_table, &table) {
            (Some(name), _) => match QualifiedName::parse(name) {
                Ok(state_table) => Some(state_table),
                Err(e) => {
                    problems.push(format!("postgres.state_table: {e}"));
                    None
                }
            },
            (None, Some(table)) => Some(QualifiedName {
                schema: table.schema.clone(),
                name: crate::pg::state::DEFAULT_STATE_TABLE.to_owned(),
            }),
            (None, None) => None,
        };
        if let (Some(state_table), Some(table)) = (&state_table, &table) {
            if state_table == table {
                problems.push("postgres.state_table: must not be the outbox table".into());
            }
        }
        match (connect, table, state_table) {
            (Some(connect), Some(table), Some(state_table)) if problems.is_empty() => {
                Ok(Validated {
                    config: self,
                    connect,
                    table,
                    state_table,
                })
            }
            _ => Err(problems),
        }
    }
}

impl Validated {
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.config.relay.shutdown_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let config =
            parse("[postgres]\nurl = \"postgres://relay:pw@127.0.0.1:5432/app\"\n").unwrap();
        let v = config.validate(None).unwrap();
        assert_eq!(v.config.postgres.slot, DEFAULT_SLOT);
        assert_eq!(v.config.postgres.publication, DEFAULT_PUBLICATION);
        assert_eq!(v.table, QualifiedName::parse(DEFAULT_TABLE).unwrap());
        assert_eq!(v.config.sink.kind, SinkKind::Stdout);
        assert_eq!(v.config.outbox.key_column, "id");
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
        let kafka = v.config.kafka.unwrap();
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
