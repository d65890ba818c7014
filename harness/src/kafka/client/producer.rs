//! A small producer for tests (`acks=all`, idempotent) that sends records in order and
//! waits for every delivery report: [`try_produce_records`], [`produce_records`],
//! [`produce`].

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;

use super::base_config;

/// How long [`produce`] waits for delivery reports (also the producer's
/// `message.timeout.ms`, so a report always comes within it).
pub const PRODUCE_TIMEOUT: Duration = Duration::from_secs(60);

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
