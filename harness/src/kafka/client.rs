//! Blocking Kafka client helpers for tests: topics (admin + metadata), a reader that reads
//! exactly up to the partitions' high watermarks, and a small producer that waits for
//! its delivery reports. Re-exported by `support::kafka`.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::super::wait::poll_until;

/// Deadline for one metadata request.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline for topic creation and for its partitions to show up in metadata.
const CREATE_TOPIC_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`produce`] waits for delivery reports (also the producer's
/// `message.timeout.ms`, so a report always comes within it).
pub const PRODUCE_TIMEOUT: Duration = Duration::from_secs(60);

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

/// Every topic name the broker lists in its metadata, sorted.
pub fn list_topics(bootstrap: &str) -> Vec<String> {
    let metadata = metadata_client(bootstrap)
        .fetch_metadata(None, METADATA_TIMEOUT)
        .unwrap_or_else(|err| panic!("metadata request to {bootstrap}: {err}"));
    let mut names: Vec<String> = metadata
        .topics()
        .iter()
        .filter(|t| t.error().is_none())
        .map(|t| t.name().to_owned())
        .collect();
    names.sort();
    names
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

/// Creates `name` with `partitions` partitions (replication factor 1) and waits until
/// metadata shows all of them with a leader. Panics on any error, "already exists"
/// included.
pub fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = base_config(bootstrap)
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka admin client for {bootstrap}: {err}"));
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new()
        .request_timeout(Some(CREATE_TOPIC_TIMEOUT))
        .operation_timeout(Some(CREATE_TOPIC_TIMEOUT));
    let results = block_on(admin.create_topics([&topic], &options))
        .unwrap_or_else(|err| panic!("creating topic {name:?} on {bootstrap}: {err}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("creating topic {topic:?} on {bootstrap}: {code}");
        }
    }
    let client = metadata_client(bootstrap);
    let want = usize::try_from(partitions).expect("partition count is positive");
    let found = poll_until(CREATE_TOPIC_TIMEOUT, || {
        (topic_partitions(&client, name, METADATA_TIMEOUT).len() >= want).then_some(())
    });
    if found.is_none() {
        panic!(
            "topic {name:?} created on {bootstrap} but its {partitions} partitions did not \
             show up in metadata within {CREATE_TOPIC_TIMEOUT:?}"
        );
    }
}

/// Grows `topic` to `total` partitions and waits until metadata shows them all with a
/// leader. Panics on any error.
pub fn add_partitions(bootstrap: &str, topic: &str, total: usize) {
    let admin: AdminClient<DefaultClientContext> = base_config(bootstrap)
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka admin client for {bootstrap}: {err}"));
    let options = AdminOptions::new()
        .request_timeout(Some(CREATE_TOPIC_TIMEOUT))
        .operation_timeout(Some(CREATE_TOPIC_TIMEOUT));
    let results = block_on(admin.create_partitions([&NewPartitions::new(topic, total)], &options))
        .unwrap_or_else(|err| panic!("adding partitions to {topic:?} on {bootstrap}: {err}"));
    for result in results {
        if let Err((topic, code)) = result {
            panic!("adding partitions to {topic:?} on {bootstrap}: {code}");
        }
    }
    let client = metadata_client(bootstrap);
    let found = poll_until(CREATE_TOPIC_TIMEOUT, || {
        (topic_partitions(&client, topic, METADATA_TIMEOUT).len() >= total).then_some(())
    });
    assert!(
        found.is_some(),
        "{topic:?} on {bootstrap} did not show {total} partitions within {CREATE_TOPIC_TIMEOUT:?}"
    );
}

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

/// Deletes every topic that is not internal (`__…`) and waits until metadata lists none
/// of them: the shared broker looks fresh to the next test.
pub fn delete_all_topics(bootstrap: &str) {
    let names: Vec<String> = list_topics(bootstrap)
        .into_iter()
        .filter(|name| !name.starts_with("__"))
        .collect();
    if names.is_empty() {
        return;
    }
    let admin: AdminClient<DefaultClientContext> = base_config(bootstrap)
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka admin client for {bootstrap}: {err}"));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let options = AdminOptions::new()
        .request_timeout(Some(CREATE_TOPIC_TIMEOUT))
        .operation_timeout(Some(CREATE_TOPIC_TIMEOUT));
    let results = block_on(admin.delete_topics(&refs, &options))
        .unwrap_or_else(|err| panic!("deleting topics {names:?} on {bootstrap}: {err}"));
    for result in results {
        if let Err((topic, code)) = result {
            if code != RDKafkaErrorCode::UnknownTopicOrPartition {
                panic!("deleting topic {topic:?} on {bootstrap}: {code}");
            }
        }
    }
    let gone = poll_until(CREATE_TOPIC_TIMEOUT, || {
        let left: Vec<String> = list_topics(bootstrap)
            .into_iter()
            .filter(|name| names.contains(name))
            .collect();
        left.is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "topics {names:?} deleted on {bootstrap} but still listed after {CREATE_TOPIC_TIMEOUT:?}"
    );
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

/// A record to produce. `partition: None` lets the producer's partitioner choose (by key
/// hash when there is a key).
#[derive(Debug, Clone, Default)]
pub struct OutgoingRecord<'a> {
    pub topic: &'a str,
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
    pub timestamp_ms: Option<i64>,
}

/// Where a produced record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

/// Sends delivery reports (index of the record in the batch, result) to the producer's
/// caller.
struct DeliveryChannel(Mutex<Sender<(usize, Result<Delivered, KafkaError>)>>);

impl ClientContext for DeliveryChannel {}

impl ProducerContext for DeliveryChannel {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, index: usize) {
        let report = match result {
            Ok(message) => Ok(Delivered {
                partition: message.partition(),
                offset: message.offset(),
            }),
            Err((err, _)) => Err(err.clone()),
        };
        let sender = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let _ = sender.send((index, report));
    }
}

/// Produces `records` in order through one producer (`acks=all`, idempotent) and waits
/// for every delivery report, returning them in the order of `records`. Panics if a
/// report does not come within [`PRODUCE_TIMEOUT`] (the producer's message timeout, so
/// a stalled broker yields an error report first).
pub fn try_produce_records(
    bootstrap: &str,
    records: &[OutgoingRecord<'_>],
) -> Vec<Result<Delivered, KafkaError>> {
    let (sender, receiver): (_, Receiver<(usize, Result<Delivered, KafkaError>)>) = mpsc::channel();
    let message_timeout_ms = PRODUCE_TIMEOUT.as_millis().to_string();
    let producer: BaseProducer<DeliveryChannel> = base_config(bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", &message_timeout_ms)
        .create_with_context(DeliveryChannel(Mutex::new(sender)))
        .unwrap_or_else(|err| panic!("creating a Kafka producer for {bootstrap}: {err}"));

    for (index, record) in records.iter().enumerate() {
        let mut message: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(record.topic, index);
        message.partition = record.partition;
        message.key = record.key;
        message.payload = record.value;
        message.timestamp = record.timestamp_ms;
        if !record.headers.is_empty() {
            let headers = record
                .headers
                .iter()
                .fold(OwnedHeaders::new(), |headers, &(key, value)| {
                    headers.insert(Header { key, value })
                });
            message.headers = Some(headers);
        }
        // The local queue is large; if it is full, serve delivery reports and retry.
        loop {
            match producer.send(message) {
                Ok(()) => break,
                Err((err, returned)) => {
                    assert!(
                        matches!(
                            err,
                            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
                        ),
                        "producing to {} on {bootstrap}: {err}",
                        record.topic
                    );
                    message = returned;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }

    let mut reports: Vec<Option<Result<Delivered, KafkaError>>> = vec![None; records.len()];
    let mut missing = records.len();
    let end = Instant::now() + PRODUCE_TIMEOUT + Duration::from_secs(10);
    while missing > 0 {
        let now = Instant::now();
        assert!(
            now < end,
            "{missing} of {} delivery reports from {bootstrap} missing after {:?}",
            records.len(),
            PRODUCE_TIMEOUT
        );
        producer.poll((end - now).min(Duration::from_millis(50)));
        while let Ok((index, report)) = receiver.try_recv() {
            if reports[index].replace(report).is_none() {
                missing -= 1;
            }
        }
    }
    reports
        .into_iter()
        .map(|r| r.expect("all reports"))
        .collect()
}

/// Like [`try_produce_records`] but panics on a failed delivery.
pub fn produce_records(bootstrap: &str, records: &[OutgoingRecord<'_>]) -> Vec<Delivered> {
    try_produce_records(bootstrap, records)
        .into_iter()
        .enumerate()
        .map(|(index, report)| {
            report.unwrap_or_else(|err| {
                panic!(
                    "delivering record {index} to {} on {bootstrap}: {err}",
                    records[index].topic
                )
            })
        })
        .collect()
}

/// Produces one record with a UTF-8 key and value and waits for its delivery.
pub fn produce(bootstrap: &str, topic: &str, key: &str, value: &str) -> Delivered {
    produce_records(
        bootstrap,
        &[OutgoingRecord {
            topic,
            key: Some(key.as_bytes()),
            value: Some(value.as_bytes()),
            ..OutgoingRecord::default()
        }],
    )[0]
}

/// Runs a future to completion on the current thread. The admin client's futures are
/// completed by librdkafka's own threads, so no async runtime is needed (and these
/// helpers work even when called from inside one).
fn block_on<F: Future>(future: F) -> F::Output {
    struct ThreadWaker(Thread);
    impl Wake for ThreadWaker {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}
