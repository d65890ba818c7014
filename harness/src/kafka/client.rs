//! Blocking Kafka client helpers for tests: topics (admin + metadata), a reader that reads
//! exactly up to the partitions' high watermarks, and a small producer that waits for
//! its delivery reports. Re-exported by `support::kafka`.
//!
//! What the helpers share is here (the base client settings, a metadata client, a
//! topic's partitions); topics are `client/topics.rs`, reading back `client/reader.rs`
//! and producing `client/producer.rs`.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

mod producer;
mod reader;
mod topics;

pub use producer::{
    produce, produce_records, try_produce_records, Delivered, OutgoingRecord, PRODUCE_TIMEOUT,
};
pub use reader::{consume, ids_once_present, read_all, read_committed, unique_group_id, Record};
pub use topics::{add_partitions, create_topic, delete_all_topics, list_topics};

/// Deadline for one metadata request.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// Client settings shared by every helper: quick reconnects (tests pause and restart
/// the broker) and IPv4 only (the broker listens on 127.0.0.1).
fn base_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("broker.address.family", "v4")
        .set("reconnect.backoff.ms", "50")
        .set("reconnect.backoff.max.ms", "500");
    config
}

/// A consumer used only for metadata requests (it never joins a group).
pub(super) fn metadata_client(bootstrap: &str) -> BaseConsumer {
    base_config(bootstrap)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka client for {bootstrap}: {err}"))
}

/// The partition ids of `topic` that have a leader, or an empty list when the broker
/// does not know the topic (yet).
fn topic_partitions(client: &BaseConsumer, topic: &str, timeout: Duration) -> Vec<i32> {
    let Ok(metadata) = client.fetch_metadata(Some(topic), timeout) else {
        return Vec::new();
    };
    metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic && t.error().is_none())
        .flat_map(|t| t.partitions())
        .filter(|p| p.error().is_none() && p.leader() >= 0)
        .map(|p| p.id())
        .collect()
}
