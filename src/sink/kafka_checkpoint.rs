//! Reading the exactly-once sink's last committed checkpoint from the offsets topic
//! (blocking; the sink runs it with `spawn_blocking` when its session starts): every
//! partition from its start to its end, as a read_committed consumer sees it, keeping
//! the last record keyed by the slot.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::sink::checkpoint::Checkpoint;
use crate::sink::kafka_errors::setup;
use crate::sink::SinkError;

/// How long the checkpoint read may take before the attempt is retried.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The checkpoint reader's client context: its errors are answered by [`read_checkpoint`]
/// itself (a partition's end is the expected way out), so librdkafka's error callback
/// only logs them at debug level instead of rdkafka's default ERROR.
struct QuietContext;

impl rdkafka::ClientContext for QuietContext {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(error = %error, reason, "checkpoint reader");
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// Read the last committed checkpoint of `slot` from `topic` (blocking): every
/// partition from its start to its end as a read_committed consumer sees it.
pub(super) fn read_checkpoint(
    mut config: ClientConfig,
    topic: &str,
    slot: &str,
) -> Result<Option<Checkpoint>, SinkError> {
    let unavailable = |reason: String| SinkError::TopicUnavailable {
        topic: topic.to_owned(),
        reason,
    };
    let consumer: BaseConsumer<QuietContext> = config
        .set("group.id", "outbox-relay-checkpoint-reader")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .create_with_context(QuietContext)
        .map_err(|e| setup(format!("checkpoint reader: {e}")))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), START_TIMEOUT)
        .map_err(|e| unavailable(format!("cannot read its metadata: {e}")))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(unavailable(
            "the offsets topic has no partitions (does it exist?)".into(),
        ));
    }
    let mut list = TopicPartitionList::new();
    let mut remaining = HashSet::new();
    for &partition in &partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, START_TIMEOUT)
            .map_err(|e| {
                unavailable(format!("cannot read partition {partition}'s offsets: {e}"))
            })?;
        if high > low {
            list.add_partition_offset(topic, partition, Offset::Beginning)
                .map_err(|e| unavailable(e.to_string()))?;
            remaining.insert(partition);
        }
    }
    if remaining.is_empty() {
        return Ok(None);
    }
    consumer
        .assign(&list)
        .map_err(|e| unavailable(format!("cannot read it: {e}")))?;
    let deadline = Instant::now() + START_TIMEOUT;
    let mut last: Option<Checkpoint> = None;
    while !remaining.is_empty() {
        if Instant::now() > deadline {
            return Err(unavailable(format!(
                "reading the last checkpoint did not finish within {}s (an open transaction of another producer on the topic?)",
                START_TIMEOUT.as_secs()
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(message)) => {
                if message.key() != Some(slot.as_bytes()) {
                    continue;
                }
                last = match message.payload() {
                    // A tombstone: the checkpoint was deleted.
                    None => None,
                    Some(value) => Some(Checkpoint::decode(value).map_err(|reason| {
                        SinkError::Stop(format!(
                            "the offsets topic {topic:?} holds a record with key {slot:?} at partition {} offset {} that is {reason}; choose another [kafka] offsets_topic for this relay",
                            message.partition(),
                            message.offset()
                        ))
                    })?),
                };
            }
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                remaining.remove(&partition);
            }
            Some(Err(error)) => {
                return Err(unavailable(format!(
                    "reading the checkpoint failed: {error}"
                )))
            }
        }
    }
    Ok(last)
}
