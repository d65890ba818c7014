//! Blocking Kafka client helpers for tests: topics (admin + metadata), a reader that
//! copes with tansu's unreliable end offsets, and a small producer that waits for its
//! delivery reports. Re-exported by `support::kafka`.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
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
/// How often [`consume`] looks for partitions of topics that do not exist yet.
const METADATA_REFRESH: Duration = Duration::from_millis(500);

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

/// Reads `topics` from offset 0 of every partition until it has at least `expected`
/// records and then nothing new arrives for `idle` (so duplicates beyond `expected` are
/// returned too), or until `deadline` has passed since the call. Never panics on a
/// missing topic: topics created after the call are picked up (metadata is re-read
/// until each topic has partitions). Records come in arrival order, which within a
/// partition is offset order.
pub fn consume(
    bootstrap: &str,
    topics: &[&str],
    expected: usize,
    idle: Duration,
    deadline: Duration,
) -> Vec<Record> {
    let started = Instant::now();
    let end = started + deadline;
    // Partitions are assigned by hand: the group is never joined and nothing is
    // committed (librdkafka still wants a group.id for any assignment), and no offset
    // lookup (ListOffsets) is needed because reading starts at offset 0.
    let consumer: BaseConsumer = base_config(bootstrap)
        .set("group.id", unique_group_id())
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "100")
        .set("isolation.level", "read_uncommitted")
        .create()
        .unwrap_or_else(|err| panic!("creating a Kafka consumer for {bootstrap}: {err}"));

    let mut assigned: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut pending_topics: Vec<&str> = topics.to_vec();
    let mut next_refresh = started;
    let mut records: Vec<Record> = Vec::new();
    let mut last_new = started;
    loop {
        let now = Instant::now();
        if now >= end || (records.len() >= expected && now.duration_since(last_new) >= idle) {
            break;
        }
        if !pending_topics.is_empty() && now >= next_refresh {
            let timeout = METADATA_REFRESH.min(end - now);
            let mut new_partitions = TopicPartitionList::new();
            pending_topics.retain(|topic| {
                let partitions = topic_partitions(&consumer, topic, timeout);
                for &partition in &partitions {
                    if assigned.insert(((*topic).to_owned(), partition)) {
                        new_partitions
                            .add_partition_offset(topic, partition, Offset::Offset(0))
                            .expect("offset 0 is valid");
                    }
                }
                partitions.is_empty()
            });
            if new_partitions.count() > 0 {
                consumer
                    .incremental_assign(&new_partitions)
                    .unwrap_or_else(|err| panic!("assigning {new_partitions:?}: {err}"));
            }
            next_refresh = Instant::now() + METADATA_REFRESH;
        }
        let now = Instant::now();
        if now >= end {
            break;
        }
        match consumer.poll((end - now).min(Duration::from_millis(100))) {
            Some(Ok(message)) => {
                records.push(Record::from_message(&message));
                last_new = Instant::now();
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
