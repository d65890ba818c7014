//! A `partition` placement the topic cannot take: pure.
//!
//! ```text
//! row ─router─▶ OutboxEvent { partition: Some(5) } ─send─▶ librdkafka
//!                                     │ _UNKNOWN_PARTITION (at send, or in the report)
//!                                     ▼ placement_refusal(...)
//!                     Some(reason): this record's problem, a dead letter (or the relay
//!                                   stops with the fix when there is no dead-letter topic)
//!                     None:         not a placement, or Kafka's own metadata knows the
//!                                   partition (partitions just added): retried as before
//! ```
//!
//! librdkafka answers a record for an explicit partition the topic does not have with
//! `_UNKNOWN_PARTITION`: at once when it knows the topic's metadata, else in the
//! record's delivery report once the metadata arrives. Retrying that (rebuilding the
//! producer, resending everything unacknowledged) can never succeed while the row asks
//! for it, so it is the record's own failure, like an oversize one. The one case where a
//! retry helps is a topic whose partitions were just added and which librdkafka's
//! metadata does not show yet: when the topic's partition count the sink read while
//! preparing the topic covers the partition, the error is retried instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rdkafka::error::RDKafkaErrorCode;

/// Partition counts of the topics the sink prepared, by topic: written by the topic
/// tasks, read by the delivery callback and the send path.
#[derive(Debug, Clone, Default)]
pub struct PartitionCounts(Arc<Mutex<HashMap<String, usize>>>);

impl PartitionCounts {
    /// `topic` has `count` partitions (a count of 0, a topic not fully created yet,
    /// says nothing).
    pub fn record(&self, topic: &str, count: usize) {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if count == 0 {
            counts.remove(topic);
        } else {
            counts.insert(topic.to_owned(), count);
        }
    }

    pub fn get(&self, topic: &str) -> Option<usize> {
        let counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(topic).copied()
    }
}

/// What the sink needs for the message of a partition placement beyond the topic.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    /// The topics' partition counts, as read preparing them.
    counts: PartitionCounts,
    /// The column of the `partition` placement.
    column: Option<String>,
}

impl Placement {
    pub fn new(column: Option<String>) -> Self {
        Placement {
            counts: PartitionCounts::default(),
            column,
        }
    }

    /// Where the topic tasks record partition counts.
    pub fn counts(&self) -> PartitionCounts {
        self.counts.clone()
    }

    /// The reason to refuse a record for `topic` asking for `partition` that failed
    /// with `code`, when it is its placement's fault ([`placement_refusal`]).
    pub fn refusal(
        &self,
        code: RDKafkaErrorCode,
        topic: &str,
        partition: Option<i32>,
    ) -> Option<String> {
        placement_refusal(PlacementCheck {
            code,
            topic,
            partition,
            partitions: self.counts.get(topic),
            column: self.column.as_deref(),
        })
    }
}

/// What is known of a record librdkafka refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementCheck<'a> {
    pub code: RDKafkaErrorCode,
    pub topic: &'a str,
    /// The partition the record asked for (a `partition` placement); `None` when the
    /// partitioner chose.
    pub partition: Option<i32>,
    /// The topic's partition count as the sink read it preparing the topic, if it did.
    pub partitions: Option<usize>,
    /// The column of the `partition` placement, for the message.
    pub column: Option<&'a str>,
}

/// The reason to refuse the record for good when its partition placement asks for a
/// partition its topic does not have; `None` otherwise.
pub fn placement_refusal(check: PlacementCheck<'_>) -> Option<String> {
    if check.code != RDKafkaErrorCode::UnknownPartition {
        return None;
    }
    let asked = check.partition?;
    let count = match check.partitions {
        // The topic has it: librdkafka's metadata is behind (partitions just added).
        Some(count) if usize::try_from(asked).is_ok_and(|asked| asked < count) => return None,
        Some(count) => format!(
            "which has {count} partition{} ({})",
            if count == 1 { "" } else { "s" },
            if count == 1 {
                "0".to_owned()
            } else {
                format!("0 to {}", count - 1)
            }
        ),
        None => "which has no such partition in Kafka's metadata".to_owned(),
    };
    let column = check.column.map_or_else(
        || "the record's partition placement".to_owned(),
        |column| format!("column {column:?} (the partition placement of [outbox] additional)"),
    );
    let topic = check.topic;
    let wanted = i64::from(asked) + 1;
    Some(format!(
        "{column} asks for partition {asked} of topic {topic:?}, {count}; create more partitions (kafka-topics.sh --alter --topic {topic} --partitions {wanted}), or fix the row's value, or remove the placement"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        code: RDKafkaErrorCode,
        partition: Option<i32>,
        partitions: Option<usize>,
    ) -> PlacementCheck<'static> {
        PlacementCheck {
            code,
            topic: "outbox.event.order",
            partition,
            partitions,
            column: Some("shard"),
        }
    }

    #[test]
    fn a_partition_beyond_the_topic_names_the_column_the_topic_and_the_fix() {
        let reason = placement_refusal(check(RDKafkaErrorCode::UnknownPartition, Some(5), Some(1)))
            .expect("refused");
        for needle in [
            "column \"shard\"",
            "partition 5",
            "\"outbox.event.order\"",
            "1 partition (0)",
            "--partitions 6",
            "create more partitions",
            "remove the placement",
        ] {
            assert!(reason.contains(needle), "{needle:?} in {reason}");
        }
        let reason = placement_refusal(check(RDKafkaErrorCode::UnknownPartition, Some(3), Some(3)))
            .expect("refused");
        assert!(reason.contains("3 partitions (0 to 2)"), "{reason}");
        let reason = placement_refusal(check(RDKafkaErrorCode::UnknownPartition, Some(9), None))
            .expect("refused without a known count");
        assert!(reason.contains("no such partition"), "{reason}");
        let unnamed = PlacementCheck {
            column: None,
            ..check(RDKafkaErrorCode::UnknownPartition, Some(i32::MAX), Some(1))
        };
        assert!(placement_refusal(unnamed).is_some_and(|r| r.contains("2147483648")));
    }

    #[test]
    fn other_errors_chosen_partitions_and_partitions_just_added_are_not_refusals() {
        // The partitioner chose: not the record's placement.
        assert_eq!(
            placement_refusal(check(RDKafkaErrorCode::UnknownPartition, None, Some(1))),
            None
        );
        // The topic has the partition by the sink's own reading: librdkafka is behind.
        assert_eq!(
            placement_refusal(check(RDKafkaErrorCode::UnknownPartition, Some(5), Some(8))),
            None
        );
        for code in [
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::MessageTimedOut,
        ] {
            assert_eq!(placement_refusal(check(code, Some(5), Some(1))), None);
        }
    }
}
