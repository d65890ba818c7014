//! Sinks: where routed events go. A sink accepts events and later reports each one's
//! delivery; only a successful report lets the acknowledgement move past it.
//!
//! "Sent" and "delivered" are different states: [`Sink::send`] only hands an event over,
//! the [`SinkNotice`] arriving on the channel given at construction says it is durable
//! (for stdout: written and flushed; for Kafka: acknowledged by the brokers, `acks=all`).

pub mod checkpoint;
pub mod kafka;
pub mod kafka_config;
pub mod kafka_eos;
pub mod kafka_errors;
pub mod kafka_log;
pub mod kafka_placement;
pub mod kafka_probe;
pub mod kafka_secrets;
pub mod kafka_topics;
pub mod stdout;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::mpsc;

pub use crate::event::TxnSeq;
use crate::event::{OutboxEvent, Ticket};
use crate::lsn::Lsn;
use crate::metrics::Metrics;
use checkpoint::Checkpoint;
use kafka_config::KafkaConfig;

/// `[sink]`: where events go.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    #[serde(rename = "type", default)]
    pub kind: SinkKind,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// One JSON line per event on stdout: the embedded default, no Kafka needed.
    #[default]
    Stdout,
    /// Kafka through librdkafka: idempotent producer, `acks=all`; needs `[kafka]`.
    Kafka,
}

/// What the relay asks of a sink it builds.
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// Events in flight at most (sizes the producer queue).
    pub max_in_flight: usize,
    /// Bytes in flight at most (sizes the producer queue's `queue.buffering.max.kbytes`).
    pub max_in_flight_bytes: u64,
    /// Keep each event until its report, so a refused one can go to the dead-letter
    /// topic.
    pub keep_events: bool,
    /// Where the sink counts what it delivered, per topic.
    pub metrics: Arc<Metrics>,
    /// The slot streamed from, when the sink serves the relay's stream: with `[kafka]
    /// exactly_once` the sink is transactional (one `transactional.id` per slot). `None`
    /// (a backfill) always builds a plain idempotent producer, which cannot fence the
    /// running relay.
    pub slot: Option<String>,
    /// The column of the `partition` placement, if any: named when a record asks for a
    /// partition its topic does not have.
    pub partition_column: Option<String>,
}

/// Builds a sink for each pipeline attempt.
pub type MakeSink =
    Arc<dyn Fn(NoticeSender, SinkOptions) -> Result<Box<dyn Sink>, SinkError> + Send + Sync>;

/// The sink a configuration chose, ready to build once per attempt.
#[derive(Clone)]
pub enum SinkSpec {
    Stdout,
    Kafka(KafkaConfig),
    /// A sink from outside this crate (tests use an in-memory one).
    Custom(MakeSink),
}

impl fmt::Debug for SinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SinkSpec::Stdout => f.write_str("Stdout"),
            SinkSpec::Kafka(kafka) => f.debug_tuple("Kafka").field(kafka).finish(),
            SinkSpec::Custom(_) => f.write_str("Custom"),
        }
    }
}

impl SinkSpec {
    /// A new sink sending its notices to `notices`.
    pub fn build(
        &self,
        notices: NoticeSender,
        options: SinkOptions,
    ) -> Result<Box<dyn Sink>, SinkError> {
        Ok(match self {
            SinkSpec::Stdout => {
                Box::new(stdout::StdoutSink::stdout(notices).counting_into(options.metrics))
            }
            SinkSpec::Kafka(kafka) => Box::new(kafka::KafkaSink::new(
                kafka,
                notices,
                kafka_config::QueueBound {
                    messages: options.max_in_flight,
                    bytes: options.max_in_flight_bytes,
                },
                options.keep_events,
                options.metrics,
                options.slot.as_deref(),
                options.partition_column,
            )?),
            SinkSpec::Custom(make) => make(notices, options)?,
        })
    }
}

/// Where a topic stands for a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicStatus {
    /// Records can be sent to it.
    Ready,
    /// Being created or checked; a [`SinkNotice::Topic`] follows.
    Waiting,
    /// Refused for good (an illegal name): its events are dead letters.
    Refused(String),
}

/// A future a sink returns from a trait method (the trait stays object safe).
pub type SinkFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Travels with a record through the sink and back in its notice: which undelivered
/// event of the ack tracker it settles, and whether it is a dead-letter record (whose
/// own failures are handled differently from an event's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordTag {
    pub ticket: Ticket,
    pub dead_letter: bool,
}

/// What a sink tells the pipeline, asynchronously.
#[derive(Debug)]
pub enum SinkNotice {
    /// The record tagged `tag` is durable.
    Delivered { tag: RecordTag },
    /// The record tagged `tag` was refused for good, for a reason of its own (too
    /// large, malformed, a topic name Kafka refuses).
    Failed {
        tag: RecordTag,
        failure: DeliveryFailure,
    },
    /// A transient failure, or the sink cannot go on (a fatal idempotent-producer
    /// error): rebuild it and resend everything not yet acknowledged, in order.
    Retry { reason: String },
    /// A failure only the operator can fix (authorization, configuration): stop
    /// without acknowledging it.
    Stop { reason: String },
    /// The client reported an error; it may have become fatal (librdkafka does not
    /// flag fatal errors in its error callback, so the pipeline asks the client).
    ClientError,
    /// An exactly-once sink's open Kafka transaction may be due for its commit: call
    /// [`Sink::flush`].
    Due,
    /// A topic [`Sink::topic_status`] was preparing is ready, or why not.
    Topic {
        topic: String,
        outcome: Result<(), SinkError>,
    },
}

/// A definite refusal of one record (oversize, malformed, illegal topic).
#[derive(Debug)]
pub struct DeliveryFailure {
    pub reason: String,
    /// Refused for its size: the only failure after which a dead-letter record may be
    /// sent again without its value.
    pub too_large: bool,
    /// The event, kept while in flight so it can go to the dead-letter topic.
    pub event: Option<Box<OutboxEvent>>,
}

/// What an exactly-once sink's checkpoints are about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub slot: String,
    /// PostgreSQL's system identifier.
    pub system_id: String,
}

/// Sender half handed to sinks for their notices.
pub type NoticeSender = mpsc::UnboundedSender<SinkNotice>;

/// Why [`Sink::send`] did not take an event.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The producer queue is full: try again after some deliveries.
    #[error("producer queue is full")]
    QueueFull(Box<OutboxEvent>),
    /// This event can never be delivered (too large, illegal topic...).
    #[error("{reason}")]
    Refused {
        reason: String,
        too_large: bool,
        event: Box<OutboxEvent>,
    },
    /// The sink itself failed.
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// A sink failure.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("writing to stdout failed: {0}")]
    Stdout(#[from] std::io::Error),
    #[error("cannot create the Kafka producer: {0}")]
    KafkaSetup(String),
    #[error("Kafka producer failed: {0}")]
    KafkaFatal(String),
    /// A transient failure: the producer is rebuilt and everything unacknowledged is
    /// sent again.
    #[error("Kafka delivery failed: {0}; rebuilding the producer and resending everything not yet acknowledged")]
    KafkaRetry(String),
    /// A failure the operator must fix; the message says how.
    #[error("{0}")]
    KafkaStop(String),
    /// Kafka refuses this topic for good (an illegal name): its events are dead letters.
    #[error("topic {topic:?}: {reason}")]
    Topic { topic: String, reason: String },
    /// The topic could not be checked or created because the brokers did not answer:
    /// retry later, the event is not at fault.
    #[error("topic {topic:?}: {reason}")]
    TopicUnavailable { topic: String, reason: String },
}

impl SinkError {
    /// Whether a new pipeline attempt (a new sink, everything unacknowledged sent
    /// again) can outlive this error.
    pub fn is_transient(&self) -> bool {
        match self {
            SinkError::KafkaFatal(_)
            | SinkError::KafkaRetry(_)
            | SinkError::TopicUnavailable { .. } => true,
            SinkError::Stdout(_)
            | SinkError::KafkaSetup(_)
            | SinkError::KafkaStop(_)
            | SinkError::Topic { .. } => false,
        }
    }
}

/// Where events go. The pipeline knows a sink only through this trait.
pub trait Sink: Send {
    /// Hand one record over. Its notice, carrying `tag`, arrives later on the notice
    /// channel.
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError>;

    /// Push out anything buffered (called at transaction ends, before status updates
    /// and at shutdown) so its notices can follow.
    fn flush(&mut self) -> Result<(), SinkError>;

    /// Whether records for `topic` can be sent now. A sink that must prepare topics
    /// starts doing so when it first sees one (without blocking) and answers
    /// [`TopicStatus::Waiting`]; a [`SinkNotice::Topic`] follows, which the pipeline
    /// hands back through [`Sink::topic_prepared`]. Sinks without topics: always ready.
    fn topic_status(&mut self, _topic: &str) -> TopicStatus {
        TopicStatus::Ready
    }

    /// The outcome of a topic [`Sink::topic_status`] was preparing.
    fn topic_prepared(&mut self, _topic: &str, _outcome: &Result<(), SinkError>) {}

    /// Make sure `topic` can take records, waiting for the answer (the dead-letter
    /// topic, before streaming starts).
    fn ensure_topic<'a>(&'a mut self, _topic: &'a str) -> SinkFuture<'a, Result<(), SinkError>> {
        Box::pin(async { Ok(()) })
    }

    /// Called once streaming has started (the slot is this relay's), before the first
    /// record: an exactly-once sink fences older producers of its transactional id and
    /// answers the last committed checkpoint, whose transactions the pipeline skips.
    fn begin_session<'a>(
        &'a mut self,
        _session: &'a Session,
    ) -> SinkFuture<'a, Result<Option<Checkpoint>, SinkError>> {
        Box::pin(async { Ok(None) })
    }

    /// A PostgreSQL transaction begins, whose commit record is at `commit_lsn`; its
    /// first `skipped` events were dropped as already committed (a split transaction).
    fn transaction_begin(&mut self, _commit_lsn: Lsn, _skipped: u64) {}

    /// The PostgreSQL transaction ending at `end_lsn` is complete: every one of its
    /// records was handed over.
    fn transaction_end(&mut self, _end_lsn: Lsn) -> Result<(), SinkError> {
        self.flush()
    }

    /// A failure after which the relay must stop rather than start again (an
    /// exactly-once producer fenced by a newer one).
    fn stop_reason(&self) -> Option<String> {
        None
    }

    /// Why the sink cannot go on, when it has failed for good (a fatal idempotent
    /// producer error: librdkafka does not flag those in its error callback, so the
    /// pipeline asks after a [`SinkNotice::ClientError`] or a retry).
    fn fatal_error(&self) -> Option<String> {
        None
    }
}
