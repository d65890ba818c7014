//! Sinks: where routed events go, and the one small vocabulary the pipeline speaks with
//! them. The pipeline knows a sink only through [`Sink`] and the [`SinkNotice`]s it sends;
//! each sink keeps its own error table, retries, transactions and timers inside it.
//!
//! ```text
//!            send(event, tag) ─▶ ┌──────┐
//! pipeline   flush()          ─▶ │ sink │── its own I/O, error table, retries,
//!   ▲        poll() per Wake  ─▶ └──────┘   transactions, timers
//!   │                               │
//!   └──────── SinkNotice ◀──────────┘ Delivered{tag}     durable: the ack may pass it
//!                                     Refused{tag, ...}  this record, for a reason of its
//!                                                        own: a dead letter
//!                                     Retry{reason}      transient: a new attempt resends
//!                                                        from the acknowledged position
//!                                     Stop{reason}       definite: the operator must act
//!                                     Wake               call poll() once
//! ```
//!
//! What a sink must do (a second sink is a new file here, a [`SinkSpec`] to build it,
//! or [`SinkSpec::Custom`] from outside the crate; the pipeline does not change):
//!
//! - **Sent is not delivered.** [`Sink::send`] only hands a record over; the
//!   [`SinkNotice::Delivered`] carrying its tag says it is durable (stdout: written and
//!   flushed; Kafka: acknowledged by the brokers, `acks=all`; exactly-once: its Kafka
//!   transaction committed). Only that notice lets the acknowledgement pass the record,
//!   so a sink never reports a record before it is durable. Reports may come in any
//!   order: the ack tracker orders them.
//! - **One answer per record.** Every record handed over is answered once, `Delivered`
//!   or `Refused`, unless the sink ends the attempt first (`Retry`, `Stop`, or an error
//!   from a method): then nothing unanswered is acknowledged, and a new sink gets
//!   everything again, in order, or the relay stops.
//! - **Classify each failure once, inside the sink.** A record refused for a reason of
//!   its own (too large, malformed, a topic that can never take it) is
//!   [`SinkNotice::Refused`] or [`SendError::Refused`]: it becomes a dead letter, or the
//!   relay stops when there is no dead-letter topic. A transient failure is
//!   [`SinkNotice::Retry`] or [`SinkError::Retry`]; one only the operator can fix is
//!   [`SinkNotice::Stop`] or [`SinkError::Stop`], with the fix in its text. The pipeline
//!   never asks a sink why.
//! - **Backpressure.** [`SendError::QueueFull`] gives the record back: the pipeline
//!   keeps it first in line, stops reading, and offers it again after the next notice
//!   (or status tick); a sink answering it must send a notice once room is back.
//! - **Notices are cheap.** They go through the unbounded channel given at construction,
//!   from any thread, one per delivery report (the hot path: nothing else per record).
//!   Work the sink must do on the pipeline's task (a timer, a client error to look into,
//!   an answer from a background task) is announced by [`SinkNotice::Wake`]; the
//!   pipeline then calls [`Sink::poll`] once, in the channel's order, which answers `Ok`
//!   or a [`SinkError`] (retry or stop).
//! - **The rest is optional.** Topics ([`Sink::topic_status`], [`Sink::ensure_topic`]),
//!   a session start ([`Sink::begin_session`]: a checkpoint of what the destination
//!   already holds) and the source's transaction boundaries have defaults that suit a
//!   sink without topics or transactions (stdout, the tests' memory sink).

pub mod checkpoint;
pub mod kafka;
pub mod kafka_checkpoint;
pub mod kafka_config;
pub mod kafka_delivery;
pub mod kafka_eos;
pub mod kafka_eos_state;
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
    /// Being created or checked; a [`SinkNotice::Wake`] follows once it is known.
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

/// What a sink tells the pipeline, asynchronously (see the module doc).
#[derive(Debug)]
pub enum SinkNotice {
    /// The record tagged `tag` is durable.
    Delivered { tag: RecordTag },
    /// The record tagged `tag` was refused for good, for a reason of its own (too
    /// large, malformed, a topic the destination refuses): dead-letter it.
    Refused {
        tag: RecordTag,
        failure: DeliveryFailure,
    },
    /// A transient failure: end this attempt; a new sink gets everything not yet
    /// acknowledged, in order. `reason` is the text the operator sees.
    Retry { reason: String },
    /// A failure only the operator can fix (authorization, configuration): stop
    /// without acknowledging anything more. `reason` says what to do.
    Stop { reason: String },
    /// The sink has bookkeeping to do on the pipeline's task: call [`Sink::poll`] once.
    Wake,
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

/// A sink failure, classified once where it happens: whether a new attempt can outlive
/// it is decided by the variant. The texts are the sink's own, shown as they are.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The sink cannot be built (its configuration): definite.
    #[error("{0}")]
    Setup(String),
    /// A transient failure: a new attempt (a new sink, everything not yet acknowledged
    /// sent again, in order) can outlive it.
    #[error("{0}")]
    Retry(String),
    /// A failure the operator must fix; the message says how.
    #[error("{0}")]
    Stop(String),
    /// The destination refuses this topic for good (an illegal name): its events are
    /// dead letters.
    #[error("topic {topic:?}: {reason}")]
    TopicRefused { topic: String, reason: String },
    /// The topic could not be checked or created because the destination did not
    /// answer: retry later, the event is not at fault.
    #[error("topic {topic:?}: {reason}")]
    TopicUnavailable { topic: String, reason: String },
}

impl SinkError {
    /// Whether a new pipeline attempt (a new sink, everything unacknowledged sent
    /// again) can outlive this error.
    pub fn is_transient(&self) -> bool {
        match self {
            SinkError::Retry(_) | SinkError::TopicUnavailable { .. } => true,
            SinkError::Setup(_) | SinkError::Stop(_) | SinkError::TopicRefused { .. } => false,
        }
    }
}

/// Where events go. The pipeline knows a sink only through this trait and its notices
/// (the module doc says what a sink must do); `send` and `flush` are all a sink without
/// topics, sessions or background work needs.
pub trait Sink: Send {
    /// Hand one record over. Its notice, carrying `tag`, arrives later on the notice
    /// channel.
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError>;

    /// Push out anything buffered (called at transaction ends, before status updates
    /// and at shutdown) so its notices can follow.
    fn flush(&mut self) -> Result<(), SinkError>;

    /// Called once for each [`SinkNotice::Wake`], in the channel's order: do the
    /// bookkeeping the sink woke the pipeline for. `Err` ends the attempt (retry or
    /// stop, by the error's variant).
    fn poll(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Whether records for `topic` can be sent now. A sink that must prepare topics
    /// starts doing so when it first sees one (without blocking) and answers
    /// [`TopicStatus::Waiting`], then sends a [`SinkNotice::Wake`] once it knows (its
    /// [`Sink::poll`] takes the outcome in). Sinks without topics: always ready.
    fn topic_status(&mut self, _topic: &str) -> TopicStatus {
        TopicStatus::Ready
    }

    /// Make sure `topic` can take records, waiting for the answer (the dead-letter
    /// topic, before streaming starts; each topic of a backfill).
    fn ensure_topic<'a>(&'a mut self, _topic: &'a str) -> SinkFuture<'a, Result<(), SinkError>> {
        Box::pin(async { Ok(()) })
    }

    /// Called once streaming has started (the slot is this relay's), before the first
    /// record: a sink that keeps its own checkpoint (Kafka exactly-once: fencing older
    /// producers, then reading the last committed one) answers it, and the pipeline
    /// skips the transactions it covers.
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
}
