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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaConfRes;

pub use crate::sink::kafka_secrets::is_secret_property;
use crate::sink::kafka_secrets::withhold_secret_detail;

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
    /// value ("Client config error: <reason> <key> <value>"), and librdkafka's own
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

/// Producer settings that keep order and lose nothing; user properties go on top (the
/// checks refuse those that would weaken idempotence, acks or retries).
pub const PRODUCER_DEFAULTS: &[(&str, &str)] = &[
    ("enable.idempotence", "true"),
    ("acks", "all"),
    ("max.in.flight.requests.per.connection", "5"),
    // Infinite: librdkafka retries transient errors forever; the relay's in-flight
    // bound is the backpressure, and nothing times out into a lost event.
    ("message.timeout.ms", "0"),
    ("linger.ms", "10"),
    ("compression.type", "lz4"),
    // Java's default partitioner (murmur2 of the key; null keys spread): a key lands
    // on the partition Kafka's Java producer, Kafka Connect and Debezium pick, so
    // switching relays keeps per-key order. librdkafka's own default (CRC32) does not.
    ("partitioner", "murmur2_random"),
    ("client.id", "outbox-relay"),
];

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

/// librdkafka's `message.send.max.retries` default (`INT32_MAX`), which idempotence
/// sets when the user does not.
const UNLIMITED_RETRIES: &str = "2147483647";

/// Why the relay refuses a value of one (canonical) property, or `None` when it is fine.
fn refusal(canonical: &str, value: &str) -> Option<String> {
    let value = value.trim().to_ascii_lowercase();
    match canonical {
        "enable.idempotence" if value != "true" => Some(
            "must stay \"true\": the relay acknowledges PostgreSQL only after Kafka confirmed, which needs an idempotent producer to keep order without duplicates from its own retries; remove the key".into(),
        ),
        "request.required.acks" if value != "all" && value != "-1" => Some(
            "must stay \"all\": an event is durable, and may be acknowledged to PostgreSQL, only once every in-sync replica has it; remove the key".into(),
        ),
        "message.timeout.ms" if value != "0" => Some(
            "must be \"0\" (no timeout): with a timeout librdkafka gives up on events during a broker outage longer than it; the relay waits instead (max_in_flight bounds memory, [relay] stall_release_ms frees PostgreSQL); remove the key".into(),
        ),
        "message.send.max.retries" if value != UNLIMITED_RETRIES => Some(format!(
            "must stay {UNLIMITED_RETRIES} (unlimited): with fewer retries librdkafka gives up on events the broker refuses for a while; remove the key"
        )),
        "transactional.id" => Some(
            "Kafka transactions are the relay's own business: set [kafka] exactly_once = true (and [kafka] transactional_id to choose the id), which also writes the checkpoint that makes restarts skip what Kafka committed; a bare transactional.id would do neither; remove the key".into(),
        ),
        "isolation.level" => Some(
            "the relay reads its exactly-once checkpoint read_committed, and its producer has no isolation level; it is the consumers' setting (isolation.level=read_committed in their configuration); remove the key".into(),
        ),
        _ => None,
    }
}

/// What `exactly_once = true` adds to the refusals: the relay sets these itself.
fn check_exactly_once_properties(properties: &BTreeMap<String, String>) -> Vec<String> {
    properties
        .iter()
        .filter(|(key, _)| canonical_property(key) == "message.timeout.ms")
        .map(|(key, value)| {
            format!(
                "kafka.properties.\"{key}\": {} is refused with exactly_once: a transactional producer's message.timeout.ms must not exceed transaction.timeout.ms, and the relay sets it to that (a timed-out record aborts its Kafka transaction, which the relay then sends again from the checkpoint); remove the key",
                shown_value(key, value)
            )
        })
        .collect()
}

/// librdkafka's default `message.max.bytes`.
pub const LIBRDKAFKA_MESSAGE_MAX_BYTES: u64 = 1_000_000;

/// What the producer queue must hold: the relay's in-flight bounds (`[relay]
/// max_in_flight`, `max_in_flight_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueBound {
    pub messages: usize,
    pub bytes: u64,
}

/// The producer's `message.max.bytes`: the user's, or librdkafka's default.
pub fn message_max_bytes(properties: &BTreeMap<String, String>) -> u64 {
    properties
        .iter()
        .find(|(key, _)| canonical_property(key) == "message.max.bytes")
        .and_then(|(_, value)| value.trim().parse().ok())
        .unwrap_or(LIBRDKAFKA_MESSAGE_MAX_BYTES)
}

/// The least `queue.buffering.max.kbytes` that agrees with a byte bound, in KiB.
///
/// The relay reads while fewer than `bound` bytes are in flight, so up to `bound` plus
/// one event is in flight, and what is in flight is in librdkafka's queue at most
/// (its count, key + value, is never more than the relay's, which adds headers). That
/// one event can be as large as `message.max.bytes`: a larger one librdkafka refuses at
/// once (dead letter), before queuing it. So the queue must hold `bound +
/// message.max.bytes`: with less, a large record could find the queue full while the
/// relay has room, and a record larger than the whole queue would wait for room that
/// never comes (the relay stalls for ever). A larger queue never loses the bound: the
/// relay stops reading at it, whatever librdkafka would take.
fn queue_kbytes_needed(bound: u64, message_max_bytes: u64) -> u64 {
    bound.saturating_add(message_max_bytes).div_ceil(1024)
}

/// The largest `queue.buffering.max.kbytes` librdkafka takes.
const QUEUE_KBYTES_MAX: u64 = 2_147_483_647;

/// A user's `queue.buffering.max.kbytes` that disagrees with the relay's byte bound
/// (see [`queue_kbytes_needed`]), as a problem to report.
pub fn check_queue_kbytes(
    properties: &BTreeMap<String, String>,
    max_in_flight_bytes: u64,
) -> Option<String> {
    let (key, value) = properties
        .iter()
        .find(|(key, _)| canonical_property(key) == "queue.buffering.max.kbytes")?;
    let needed = queue_kbytes_needed(max_in_flight_bytes, message_max_bytes(properties));
    let kbytes: u64 = value.trim().parse().ok()?;
    (kbytes < needed).then(|| {
        format!(
            "kafka.properties.\"{key}\": {kbytes} KiB is less than relay.max_in_flight_bytes ({max_in_flight_bytes}) plus message.max.bytes ({}), {needed} KiB: librdkafka's queue must hold what the relay keeps in flight and one more record of the largest size, or such a record waits for queue room that may never come; remove the key (the relay derives it from max_in_flight_bytes) or lower [relay] max_in_flight_bytes",
            message_max_bytes(properties)
        )
    })
}

/// The transactional producer's configuration: [`producer_config`], with
/// `transactional.id` and a `message.timeout.ms` equal to `transaction.timeout.ms`
/// (librdkafka refuses a larger one, and infinity is larger).
pub fn transactional_producer_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    queue: QueueBound,
    transactional_id: &str,
) -> ClientConfig {
    let mut config = producer_config(brokers, properties, queue);
    let timeout = properties
        .get("transaction.timeout.ms")
        .cloned()
        .unwrap_or_else(|| DEFAULT_TRANSACTION_TIMEOUT_MS.to_string());
    config.set("transactional.id", transactional_id);
    config.set("transaction.timeout.ms", &timeout);
    config.set("message.timeout.ms", &timeout);
    config
}

/// Kafka's default `transaction.timeout.ms`: an open transaction the coordinator
/// hears nothing from for this long is aborted.
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// A value as librdkafka reads it, for comparing two names of one property.
fn same_value(canonical: &str, value: &str) -> String {
    let value = value.trim().to_ascii_lowercase();
    if canonical == "request.required.acks" && value == "-1" {
        return "all".into();
    }
    value
}

/// Every problem of `[kafka.properties]`, each naming the key as written.
pub fn check_properties(properties: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for (key, value) in properties {
        let canonical = canonical_property(key);
        let also = if canonical == key.trim() {
            String::new()
        } else {
            format!(" ({key:?} is librdkafka's name for {canonical:?})")
        };
        if let Some(why) = refusal(canonical, value) {
            problems.push(format!(
                "kafka.properties.\"{key}\"{also}: {} is refused: {why}",
                shown_value(key, value)
            ));
        }
        match seen.get(canonical) {
            Some((first_key, first_value))
                if same_value(canonical, first_value) != same_value(canonical, value) =>
            {
                let (first_value, value) =
                    (shown_value(first_key, first_value), shown_value(key, value));
                problems.push(format!(
                    "kafka.properties: \"{first_key}\" = {first_value} and \"{key}\" = {value} set the same librdkafka property ({canonical:?}) to different values, and which one wins would be chance; keep one"
                ));
            }
            Some(_) => {}
            None => {
                seen.insert(canonical, (key, value));
            }
        }
    }
    problems
}

/// A property's value quoted for a message, or `***` for a secret one.
fn shown_value(key: &str, value: &str) -> String {
    if is_secret_property(key) {
        "***".into()
    } else {
        format!("{value:?}")
    }
}

/// The producer's client configuration: our defaults (each left out when the user sets
/// the same property under any name), then the user's properties.
pub fn producer_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    queue: QueueBound,
) -> ClientConfig {
    let mut config = ClientConfig::new();
    let user_sets = |key: &str| user_sets(properties, key);
    if !user_sets("bootstrap.servers") {
        config.set("bootstrap.servers", brokers);
    }
    for (key, value) in PRODUCER_DEFAULTS {
        if !user_sets(key) {
            config.set(*key, *value);
        }
    }
    // Room for every event the pipeline may have in flight, plus dead-letter records.
    if !user_sets("queue.buffering.max.messages") {
        config.set(
            "queue.buffering.max.messages",
            queue
                .messages
                .saturating_mul(2)
                .clamp(1000, 10_000_000)
                .to_string(),
        );
    }
    // Room for the byte bound plus the largest record, twice the bound for dead-letter
    // and checkpoint records (librdkafka's own default, ~1 GB, would be no bound).
    if !user_sets("queue.buffering.max.kbytes") {
        let needed =
            queue_kbytes_needed(queue.bytes.saturating_mul(2), message_max_bytes(properties));
        config.set(
            "queue.buffering.max.kbytes",
            needed.clamp(1, QUEUE_KBYTES_MAX).to_string(),
        );
    }
    apply_properties(&mut config, properties);
    config
}

/// The admin client's configuration: the brokers (unless the user names them under any
/// of librdkafka's names), then the user's properties.
pub fn admin_config(brokers: &str, properties: &BTreeMap<String, String>) -> ClientConfig {
    let mut config = ClientConfig::new();
    if !user_sets(properties, "bootstrap.servers") {
        config.set("bootstrap.servers", brokers);
    }
    apply_properties(&mut config, properties);
    config
}

/// Whether the user's properties set `key`'s property under any name.
fn user_sets(properties: &BTreeMap<String, String>, key: &str) -> bool {
    let canonical = canonical_property(key);
    properties
        .keys()
        .any(|user| canonical_property(user) == canonical)
}

/// The user's properties, over whatever `config` has.
fn apply_properties(config: &mut ClientConfig, properties: &BTreeMap<String, String>) {
    for (key, value) in properties {
        config.set(key, value);
    }
}

#[cfg(test)]
#[path = "kafka_config_tests.rs"]
mod tests;
