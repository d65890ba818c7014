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

use std::collections::BTreeMap;

use rdkafka::config::ClientConfig;

/// The `[kafka]` section: owned by the Kafka sink; `config.rs` composes it.
#[derive(Debug, Clone, serde::Deserialize)]
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
        problems
    }
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
            "the relay does not use Kafka transactions, and a transactional producer gives up on events after transaction.timeout.ms; remove the key".into(),
        ),
        _ => None,
    }
}

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
                "kafka.properties.\"{key}\"{also}: {value:?} is refused: {why}"
            ));
        }
        match seen.get(canonical) {
            Some((first_key, first_value))
                if same_value(canonical, first_value) != same_value(canonical, value) =>
            {
                problems.push(format!(
                    "kafka.properties: \"{first_key}\" = {first_value:?} and \"{key}\" = {value:?} set the same librdkafka property ({canonical:?}) to different values, and which one wins would be chance; keep one"
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

/// The producer's client configuration: our defaults (each left out when the user sets
/// the same property under any name), then the user's properties.
pub fn producer_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    queue_messages: usize,
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
            queue_messages
                .saturating_mul(2)
                .clamp(1000, 10_000_000)
                .to_string(),
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
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn aliases_and_topic_prefixes_name_one_property() {
        assert_eq!(canonical_property("acks"), "request.required.acks");
        assert_eq!(canonical_property("topic.acks"), "request.required.acks");
        assert_eq!(
            canonical_property("topic.request.required.acks"),
            "request.required.acks"
        );
        assert_eq!(
            canonical_property("delivery.timeout.ms"),
            "message.timeout.ms"
        );
        assert_eq!(
            canonical_property("topic.delivery.timeout.ms"),
            "message.timeout.ms"
        );
        assert_eq!(canonical_property("retries"), "message.send.max.retries");
        assert_eq!(canonical_property("linger.ms"), "queue.buffering.max.ms");
        // A global property that merely starts with "topic." keeps its name.
        assert_eq!(
            canonical_property("topic.metadata.refresh.interval.ms"),
            "topic.metadata.refresh.interval.ms"
        );
    }

    #[test]
    fn settings_that_let_librdkafka_give_up_are_refused_under_every_name() {
        for (key, value, needle) in [
            ("message.timeout.ms", "3000", "gives up"),
            ("delivery.timeout.ms", "3000", "gives up"),
            ("topic.message.timeout.ms", "1", "gives up"),
            ("topic.delivery.timeout.ms", "300000", "gives up"),
            ("acks", "1", "must stay \"all\""),
            ("request.required.acks", "1", "must stay \"all\""),
            ("topic.acks", "0", "must stay \"all\""),
            ("topic.request.required.acks", "1", "must stay \"all\""),
            ("enable.idempotence", "false", "idempotent"),
            ("retries", "3", "unlimited"),
            ("message.send.max.retries", "0", "unlimited"),
            ("transactional.id", "x", "transactions"),
        ] {
            let problems = check_properties(&props(&[(key, value)]));
            assert_eq!(problems.len(), 1, "{key}: {problems:?}");
            assert!(
                problems[0].contains(&format!("\"{key}\"")),
                "names the key: {}",
                problems[0]
            );
            assert!(problems[0].contains(needle), "says why: {}", problems[0]);
            assert!(problems[0].contains("remove the key"), "{}", problems[0]);
        }
    }

    #[test]
    fn safe_values_pass() {
        assert!(check_properties(&props(&[
            ("message.timeout.ms", "0"),
            ("delivery.timeout.ms", "0"),
            ("acks", "all"),
            ("request.required.acks", "-1"),
            ("topic.acks", "all"),
            ("enable.idempotence", "true"),
            ("retries", "2147483647"),
            ("linger.ms", "50"),
        ]))
        .is_empty());
    }

    #[test]
    fn two_names_of_one_property_with_different_values_are_refused() {
        let problems = check_properties(&props(&[
            ("linger.ms", "5"),
            ("queue.buffering.max.ms", "50"),
        ]));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("\"linger.ms\""), "{}", problems[0]);
        assert!(
            problems[0].contains("\"queue.buffering.max.ms\""),
            "{}",
            problems[0]
        );
        assert!(problems[0].contains("keep one"), "{}", problems[0]);
    }

    #[test]
    fn user_properties_override_defaults_under_any_name() {
        let config = producer_config("b:1", &props(&[("linger.ms", "50")]), 100);
        assert_eq!(config.get("linger.ms"), Some("50"));
        assert_eq!(config.get("enable.idempotence"), Some("true"));
        assert_eq!(config.get("acks"), Some("all"));
        assert_eq!(config.get("message.timeout.ms"), Some("0"));
        assert_eq!(config.get("partitioner"), Some("murmur2_random"));
        assert_eq!(config.get("bootstrap.servers"), Some("b:1"));
        assert_eq!(config.get("queue.buffering.max.messages"), Some("1000"));
        // An alias of a default replaces it, rather than racing it.
        let config = producer_config(
            "b:1",
            &props(&[
                ("queue.buffering.max.ms", "50"),
                ("compression.codec", "zstd"),
                ("topic.partitioner", "murmur2"),
            ]),
            100,
        );
        assert_eq!(config.get("linger.ms"), None);
        assert_eq!(config.get("queue.buffering.max.ms"), Some("50"));
        assert_eq!(config.get("compression.type"), None);
        assert_eq!(config.get("compression.codec"), Some("zstd"));
        assert_eq!(config.get("partitioner"), None);
        assert_eq!(config.get("topic.partitioner"), Some("murmur2"));
        // The brokers too, for the producer and the admin client alike.
        let user = props(&[("metadata.broker.list", "other:9092")]);
        for config in [
            producer_config("b:1", &user, 100),
            admin_config("b:1", &user),
        ] {
            assert_eq!(config.get("bootstrap.servers"), None);
            assert_eq!(config.get("metadata.broker.list"), Some("other:9092"));
        }
        assert_eq!(
            admin_config("b:1", &props(&[("linger.ms", "5")])).get("bootstrap.servers"),
            Some("b:1")
        );
    }
}
