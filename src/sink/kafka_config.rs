//! The producer's librdkafka properties: the relay's defaults, the user's
//! `[kafka.properties]` on top, and the checks that keep the user from weakening what the
//! relay's promise rests on. Pure.
//!
//! librdkafka knows several names for one property (`acks` is an alias of
//! `request.required.acks`, `delivery.timeout.ms` of `message.timeout.ms`, ...) and
//! accepts a topic property with a `topic.` prefix (`topic.acks`). A check that looked
//! at one name only could be bypassed by another; and two names of one property set to
//! different values end in whichever librdkafka applies last, which for a hash map of
//! properties is chance. So every key is reduced to its [`canonical_property`] first:
//! refusals look at that, the relay's default yields to the user's value under any of
//! its names, and two names of one property with different values are refused.
//!
//! The section ([`KafkaConfig`], its defaults and secret files) and the canonical names
//! are here; what the relay refuses in `[kafka.properties]` is `kafka_config/refusals.rs`,
//! and the client configurations built from the section (the producer's defaults, its
//! queue sized to the in-flight bounds, the transactional and admin clients)
//! `kafka_config/clients.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;

pub use crate::sink::kafka_secrets::is_secret_property;
use crate::sink::kafka_secrets::withhold_secret_detail;

mod clients;
mod refusals;

pub use clients::{
    admin_config, check_queue_kbytes, message_max_bytes, producer_config,
    transactional_producer_config, QueueBound, LIBRDKAFKA_MESSAGE_MAX_BYTES, PRODUCER_DEFAULTS,
};
use refusals::check_exactly_once_properties;
pub use refusals::check_properties;

/// The `[kafka]` section: owned by the Kafka sink; `config.rs` composes it. Its `Debug`
/// leaves out the values of secret properties ([`is_secret_property`], and every one
/// read from a file).
#[derive(Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// `bootstrap.servers`: comma-separated `host:port` list.
    pub brokers: String,
    /// Create a missing topic through the admin API the first time an event routes to it.
    #[serde(default = "default_create_topics")]
    pub create_topics: bool,
    /// Partitions of created topics; -1 takes the broker's `num.partitions`.
    #[serde(default = "default_topic_partitions")]
    pub topic_partitions: i32,
    /// Replication factor of created topics; -1 takes the broker's
    /// `default.replication.factor`.
    #[serde(default = "default_topic_replication_factor")]
    pub topic_replication_factor: i32,
    /// Any librdkafka property; applied over the relay's defaults.
    #[serde(default)]
    pub properties: std::collections::BTreeMap<String, String>,
    /// librdkafka properties whose value is the content of a file (a mounted secret):
    /// `"sasl.password" = "/run/secrets/kafka"`. Read by [`KafkaConfig::read_property_files`]
    /// into `properties`, without the file's trailing newline.
    #[serde(default)]
    pub property_files: BTreeMap<String, PathBuf>,
    /// The properties whose value came from `property_files`: secrets, whatever their name.
    #[serde(skip)]
    from_files: BTreeSet<String>,
    /// Exactly-once into Kafka: a transactional producer, each batch of PostgreSQL
    /// transactions committed in one Kafka transaction with a checkpoint record (see
    /// docs/exactly-once.md).
    #[serde(default)]
    pub exactly_once: bool,
    /// The producer's `transactional.id`; default `outbox-relay-<slot>`.
    #[serde(default)]
    pub transactional_id: Option<String>,
    /// The compacted topic the checkpoints go to (key: the slot name).
    #[serde(default = "default_offsets_topic")]
    pub offsets_topic: String,
    /// A Kafka transaction is committed once it is this old (at the next end of a
    /// PostgreSQL transaction), batching the PostgreSQL transactions of that time.
    #[serde(default = "default_transaction_ms")]
    pub transaction_ms: u64,
    /// ... or once it holds this many records; default: half of `[relay]
    /// max_in_flight`, so a commit is never stuck behind the in-flight bound. A
    /// PostgreSQL transaction with more events is split over Kafka transactions (the
    /// checkpoint counts its committed events).
    #[serde(default)]
    pub transaction_max_events: Option<u64>,
    /// ... or once its records (key + value + headers) reach this many bytes; default
    /// and cap: half of `[relay] max_in_flight_bytes`, for the same reason.
    #[serde(default)]
    pub transaction_max_bytes: Option<u64>,
}

/// The offsets topic's default name.
pub const DEFAULT_OFFSETS_TOPIC: &str = "outbox-relay-offsets";
/// 100 ms: batches enough transactions to amortise a commit (a few round trips to the
/// transaction coordinator), and keeps the delay a consumer sees small.
pub const DEFAULT_TRANSACTION_MS: u64 = 100;

fn default_offsets_topic() -> String {
    DEFAULT_OFFSETS_TOPIC.into()
}
fn default_transaction_ms() -> u64 {
    DEFAULT_TRANSACTION_MS
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let properties: BTreeMap<&str, &str> = self
            .properties
            .iter()
            .map(|(key, value)| {
                let shown = if self.is_secret(key) { "***" } else { value };
                (key.as_str(), shown)
            })
            .collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("create_topics", &self.create_topics)
            .field("topic_partitions", &self.topic_partitions)
            .field("topic_replication_factor", &self.topic_replication_factor)
            .field("properties", &properties)
            .field("property_files", &self.property_files)
            .field("exactly_once", &self.exactly_once)
            .field("transactional_id", &self.transactional_id)
            .field("offsets_topic", &self.offsets_topic)
            .field("transaction_ms", &self.transaction_ms)
            .field("transaction_max_events", &self.transaction_max_events)
            .field("transaction_max_bytes", &self.transaction_max_bytes)
            .finish()
    }
}

impl KafkaConfig {
    /// Every problem of the section, each with its key path.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.brokers.trim().is_empty() {
            problems.push("kafka.brokers: must not be empty".into());
        }
        if self.topic_partitions == 0 || self.topic_partitions < -1 {
            problems
                .push("kafka.topic_partitions: must be -1 (broker default) or at least 1".into());
        }
        if self.topic_replication_factor == 0 || self.topic_replication_factor < -1 {
            problems.push(
                "kafka.topic_replication_factor: must be -1 (broker default) or at least 1".into(),
            );
        }
        problems.extend(check_properties(&self.properties));
        if self.exactly_once {
            problems.extend(check_exactly_once_properties(&self.properties));
            if self.offsets_topic.trim().is_empty() {
                problems.push("kafka.offsets_topic: must not be empty".into());
            }
            if self
                .transactional_id
                .as_deref()
                .is_some_and(|id| id.trim().is_empty())
            {
                problems.push("kafka.transactional_id: must not be empty (leave it out for outbox-relay-<slot>)".into());
            }
            if self.transaction_ms == 0 {
                problems.push("kafka.transaction_ms: must be at least 1".into());
            }
            if self.transaction_max_events == Some(0) {
                problems.push("kafka.transaction_max_events: must be at least 1".into());
            }
            if self.transaction_max_bytes == Some(0) {
                problems.push("kafka.transaction_max_bytes: must be at least 1".into());
            }
        }
        for (key, value) in &self.properties {
            if let Err(error) = ClientConfig::new().set(key, value).create_native_config() {
                problems.push(format!(
                    "{}: librdkafka refuses it: {}",
                    self.shown_key(key),
                    self.client_error(&error)
                ));
            }
        }
        problems
    }

    /// Reads every `property_files` entry into `properties`; returns the problems (a
    /// file that cannot be read or is empty, a property also set directly), each with
    /// its key path. Never shows a file's content.
    pub fn read_property_files(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for (key, path) in &self.property_files {
            if let Some(also) = self
                .properties
                .keys()
                .find(|set| canonical_property(set) == canonical_property(key))
            {
                problems.push(format!(
                    "kafka.property_files.\"{key}\": kafka.properties.\"{also}\" sets the same property; keep one"
                ));
                continue;
            }
            match read_secret_file(path) {
                Ok(value) => {
                    self.properties.insert(key.clone(), value);
                    self.from_files.insert(key.clone());
                }
                Err(problem) => problems.push(format!("kafka.property_files.\"{key}\": {problem}")),
            }
        }
        problems
    }

    /// Whether the value of property `key` is kept out of messages and logs.
    pub fn is_secret(&self, key: &str) -> bool {
        is_secret_property(key) || self.from_files.contains(key)
    }

    /// Where property `key` is set, for messages.
    fn shown_key(&self, key: &str) -> String {
        if self.from_files.contains(key) {
            format!("kafka.property_files.\"{key}\"")
        } else {
            format!("kafka.properties.\"{key}\"")
        }
    }

    /// A librdkafka error about this configuration, without the value of any secret
    /// property. rdkafka's `Display` of a configuration error appends the property's
    /// value (`Client config error: <reason> <key> <value>`), and librdkafka's own
    /// reasons quote values ("Invalid value \"…\" for configuration property …"): for a
    /// secret property the message is built from its name alone; for another, the
    /// reason is kept.
    pub fn client_error(&self, error: &KafkaError) -> String {
        let text = match error {
            KafkaError::ClientConfig(result, _reason, key, _value) if self.is_secret(key) => {
                let why = match result {
                    RDKafkaConfRes::RD_KAFKA_CONF_UNKNOWN => "librdkafka has no such property",
                    _ => "librdkafka refuses its value (not shown: it is a secret), or this build does not support the property",
                };
                format!("{why} (property \"{key}\")")
            }
            KafkaError::ClientConfig(_, reason, key, _value) if reason.contains(key.as_str()) => {
                reason.clone()
            }
            KafkaError::ClientConfig(_, reason, key, _value) => {
                format!("{reason} (property \"{key}\")")
            }
            // librdkafka's free text (client creation) is not ours to build: what it
            // says past a secret property's name is withheld.
            other => withhold_secret_detail(&other.to_string()).into_owned(),
        };
        text
    }
}

/// The content of a secret file without its trailing newline; a problem never shows
/// the content.
fn read_secret_file(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(value.to_owned())
}

/// Partitions of topics the relay creates: one keeps a single total order per topic,
/// which suits small deployments and the test broker; raise it for throughput.
pub const DEFAULT_TOPIC_PARTITIONS: i32 = 1;
/// Replication factor of topics the relay creates: -1 takes the broker's
/// `default.replication.factor`, which the cluster's operator has set for its size (1 on
/// a single broker, typically 3 in production); a fixed 1 would leave topics on a
/// production cluster without replicas.
pub const DEFAULT_TOPIC_REPLICATION_FACTOR: i32 = -1;
fn default_create_topics() -> bool {
    true
}
fn default_topic_partitions() -> i32 {
    DEFAULT_TOPIC_PARTITIONS
}
fn default_topic_replication_factor() -> i32 {
    DEFAULT_TOPIC_REPLICATION_FACTOR
}

/// librdkafka's alias names and the property each stands for (CONFIGURATION.md).
const ALIASES: &[(&str, &str)] = &[
    ("acks", "request.required.acks"),
    ("delivery.timeout.ms", "message.timeout.ms"),
    ("retries", "message.send.max.retries"),
    ("linger.ms", "queue.buffering.max.ms"),
    ("compression.type", "compression.codec"),
    ("max.in.flight", "max.in.flight.requests.per.connection"),
    ("bootstrap.servers", "metadata.broker.list"),
];

/// Topic-level producer properties: librdkafka also takes them as `topic.<name>`.
const TOPIC_PROPERTIES: &[&str] = &[
    "request.required.acks",
    "acks",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "partitioner",
    "compression.codec",
    "compression.type",
    "compression.level",
    "queuing.strategy",
    "request.timeout.ms",
];

/// The property a key sets, under its canonical name: without a `topic.` prefix
/// librdkafka would strip, and with aliases resolved.
pub fn canonical_property(key: &str) -> &str {
    let key = key.trim();
    let key = match key.strip_prefix("topic.") {
        Some(rest) if TOPIC_PROPERTIES.contains(&rest) => rest,
        _ => key,
    };
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == key)
        .map_or(key, |(_, canonical)| canonical)
}

#[cfg(test)]
#[path = "kafka_config_tests.rs"]
mod tests;
