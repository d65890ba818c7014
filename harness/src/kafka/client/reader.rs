//! Reading back what a test broker holds: [`Record`], a reader that waits for the
//! partitions' high watermarks and reads exactly up to them ([`consume`], [`read_all`]),
//! and a `read_committed` one that reads up to the last stable offsets
//! ([`read_committed`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{base_config, topic_partitions, METADATA_TIMEOUT};

/// A record read back from Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// Create time or log-append time, whichever the broker reports.
    pub timestamp_ms: Option<i64>,
}

impl Record {
    /// The key as UTF-8 (lossy), `None` for a null key.
    pub fn key_str(&self) -> Option<String> {
        self.key
            .as_deref()
            .map(|k| String::from_utf8_lossy(k).into_owned())
    }

    /// The value as UTF-8 (lossy), `None` for a null value (tombstone).
    pub fn value_str(&self) -> Option<String> {
        self.value
            .as_deref()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// The first header called `name`, as UTF-8 (lossy); `None` when it is absent or
    /// null.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }

    fn from_message(message: &impl Message) -> Self {
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        Record {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
            timestamp_ms: message.timestamp().to_millis(),
        }
    }
}

/// How long [`consume`] may take to read records the broker already reported (its high
/// watermarks): they exist, so failing to read them is a harness or broker failure.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(120);

/// One partition's offsets as the broker reported them: records `low..high` exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionOffsets {
    pub topic: String,
    pub partition: i32,
    pub low: i64,
    pub high: i64,
}

/// Low and high watermarks of every partition of `topics` that exists (a missing topic
/// contributes nothing). `None` when the broker did not answer.
pub fn watermarks(
    client: &BaseConsumer,
    topics: &[&str],
    timeout: Duration,
) -> Option<Vec<PartitionOffsets>> {
    let mut offsets = Vec::new();
    for topic in topics {
        for partition in topic_partitions(client, topic, timeout) {
            let (low, high) = client.fetch_watermarks(topic, partition, timeout).ok()?;
            offsets.push(PartitionOffsets {
                topic: (*topic).to_owned(),
                partition,
                low,
                high,
            });
        }
    }
    Some(offsets)
}

fn reader(bootstrap: &str) -> BaseConsumer {
    // Partitions are assigned by hand: the group is never joined and nothing is
    // committed (librdkafka still wants a group.id for any assignment).
    base_config(bootstrap)
        .set("group.id", unique_group_id())
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka consumer for {bootstrap}: {err}"))
}

/// Waits (at most `deadline`) until `topics` hold at least `expected` records in all, by
/// their partitions' watermarks, then reads every partition from its low watermark up to
/// the high watermark seen at that moment: an exact set, duplicates included, nothing
/// that arrives later. When `deadline` passes first, reads what is there, so the
/// caller's assertions show what is missing. Topics that do not exist (yet) count as
/// empty. Records come per partition in offset order.
pub fn consume(
    bootstrap: &str,
    topics: &[&str],
    expected: usize,
    deadline: Duration,
) -> Vec<Record> {
    let client = reader(bootstrap);
    let end = Instant::now() + deadline;
    let mut snapshot: Vec<PartitionOffsets> = Vec::new();
    loop {
        let now = Instant::now();
        let timeout = METADATA_TIMEOUT
            .min(end.saturating_duration_since(now))
            .max(Duration::from_millis(500));
        if let Some(offsets) = watermarks(&client, topics, timeout) {
            let held: i64 = offsets.iter().map(|p| p.high - p.low).sum();
            snapshot = offsets;
            if usize::try_from(held).unwrap_or(0) >= expected {
                break;
            }
        }
        if Instant::now() >= end {
            break;
        }
        std::thread::sleep(
            Duration::from_millis(100).min(end.saturating_duration_since(Instant::now())),
        );
    }
    read_range(&client, bootstrap, &snapshot)
}

/// The `id` headers in `topics`, read again until every one of `want` is there or
/// `deadline` passes (then what was read last, so the caller's assertion names what is
/// missing). Waits on the ids themselves: a count of records can be reached while an
/// event is still to come, when the topics already hold earlier events or copies.
pub fn ids_once_present(
    bootstrap: &str,
    topics: &[&str],
    want: &[String],
    deadline: Duration,
) -> std::collections::HashSet<String> {
    let mut seen = std::collections::HashSet::new();
    crate::wait::poll_until(deadline, || {
        seen = read_all(bootstrap, topics)
            .iter()
            .filter_map(|record| record.header("id"))
            .collect();
        want.iter().all(|id| seen.contains(id)).then_some(())
    });
    seen
}

/// Everything `topics` hold right now (up to their current high watermarks).
pub fn read_all(bootstrap: &str, topics: &[&str]) -> Vec<Record> {
    consume(bootstrap, topics, 0, Duration::ZERO)
}

/// Everything `topics` hold as a `read_committed` consumer sees it right now: every
/// partition from its start up to its last stable offset (records of aborted
/// transactions and transaction markers left out; records of a transaction still open
/// are not reached). Per partition in offset order.
pub fn read_committed(bootstrap: &str, topics: &[&str]) -> Vec<Record> {
    // One topic at a time: a partition EOF names the partition, not its topic.
    topics
        .iter()
        .flat_map(|topic| read_committed_topic(bootstrap, topic))
        .collect()
}

fn read_committed_topic(bootstrap: &str, topic: &str) -> Vec<Record> {
    let client = base_config(bootstrap)
        .set("group.id", unique_group_id())
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("isolation.level", "read_committed")
        .create::<BaseConsumer>()
        .unwrap_or_else(|err| panic!("creating a Kafka consumer for {bootstrap}: {err}"));
    let Some(offsets) = watermarks(&client, &[topic], METADATA_TIMEOUT) else {
        panic!("{bootstrap} did not answer for the watermarks of {topic:?}");
    };
    let mut assignment = TopicPartitionList::new();
    let mut remaining = std::collections::BTreeSet::new();
    for range in offsets.iter().filter(|r| r.high > r.low) {
        assignment
            .add_partition_offset(topic, range.partition, Offset::Beginning)
            .expect("a valid offset");
        remaining.insert(range.partition);
    }
    let mut records = Vec::new();
    if remaining.is_empty() {
        return records;
    }
    client
        .assign(&assignment)
        .unwrap_or_else(|err| panic!("assigning {assignment:?}: {err}"));
    let end = Instant::now() + READ_BACK_TIMEOUT;
    while !remaining.is_empty() {
        let now = Instant::now();
        assert!(
            now < end,
            "reading back {topic} (read_committed) from {bootstrap}: partitions {remaining:?} \
             did not reach their end within {READ_BACK_TIMEOUT:?} ({} records read)",
            records.len()
        );
        match client.poll((end - now).min(Duration::from_millis(200))) {
            Some(Ok(message)) => records.push(Record::from_message(&message)),
            Some(Err(KafkaError::PartitionEOF(partition))) => {
                remaining.remove(&partition);
            }
            Some(Err(err)) => eprintln!("[read_committed] {bootstrap}: {err}"),
            None => {}
        }
    }
    records
}

/// Reads each partition's `low..high` records.
fn read_range(client: &BaseConsumer, bootstrap: &str, ranges: &[PartitionOffsets]) -> Vec<Record> {
    let mut assignment = TopicPartitionList::new();
    let mut remaining: std::collections::BTreeMap<(String, i32), i64> = Default::default();
    for range in ranges.iter().filter(|r| r.high > r.low) {
        assignment
            .add_partition_offset(&range.topic, range.partition, Offset::Offset(range.low))
            .expect("a valid offset");
        remaining.insert((range.topic.clone(), range.partition), range.high);
    }
    let mut records = Vec::new();
    if remaining.is_empty() {
        return records;
    }
    client
        .assign(&assignment)
        .unwrap_or_else(|err| panic!("assigning {assignment:?}: {err}"));
    let end = Instant::now() + READ_BACK_TIMEOUT;
    while !remaining.is_empty() {
        let now = Instant::now();
        assert!(
            now < end,
            "reading back from {bootstrap}: partitions {remaining:?} did not reach their high \
             watermarks within {READ_BACK_TIMEOUT:?} ({} records read)",
            records.len()
        );
        match client.poll((end - now).min(Duration::from_millis(200))) {
            Some(Ok(message)) => {
                let key = (message.topic().to_owned(), message.partition());
                let Some(&high) = remaining.get(&key) else {
                    continue;
                };
                if message.offset() >= high {
                    continue;
                }
                if message.offset() + 1 >= high {
                    remaining.remove(&key);
                }
                records.push(Record::from_message(&message));
            }
            Some(Err(err)) => eprintln!("[consume] {bootstrap}: {err}"),
            None => {}
        }
    }
    records
}

/// A group id no other consumer uses: `outbox-relay-test-<pid>-<counter>`.
pub fn unique_group_id() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "outbox-relay-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
