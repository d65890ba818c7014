//! The librdkafka client configurations built from `[kafka]`: the producer's defaults
//! ([`PRODUCER_DEFAULTS`]) under the user's properties, its queue sized to the relay's
//! in-flight bounds ([`QueueBound`], with the check of a user's
//! `queue.buffering.max.kbytes`), the transactional producer, and the admin client.

use std::collections::BTreeMap;

use rdkafka::config::ClientConfig;

use super::canonical_property;

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
/// (see `queue_kbytes_needed`), as a problem to report.
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
    // The admin client asks for a topic's metadata before creating it: a broker with
    // `auto.create.topics.enable` would otherwise create it on that request, with its
    // own partition count and replication factor instead of `[kafka] topic_partitions`
    // and `topic_replication_factor`.
    config.set("allow.auto.create.topics", "false");
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
