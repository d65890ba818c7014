//! Sinks: where routed events go. A sink accepts events and later reports each one's
//! delivery; only a successful report lets the acknowledgement move past it.
//!
//! "Sent" and "delivered" are different states: [`Sink::send`] only hands an event over,
//! the [`SinkNotice`] arriving on the channel given at construction says it is durable
//! (for stdout: written and flushed; for Kafka: acknowledged by the brokers, `acks=all`).

pub mod kafka;
pub mod kafka_config;
pub mod kafka_errors;
pub mod kafka_topics;
pub mod stdout;

use tokio::sync::mpsc;

pub use crate::event::TxnSeq;
use crate::event::{OutboxEvent, Ticket};

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
    /// A topic requested with `KafkaSink::request_topic` is ready, or why not.
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

/// Where events go.
pub trait Sink: Send {
    /// Hand one record over. Its notice, carrying `tag`, arrives later on the notice
    /// channel.
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError>;

    /// Push out anything buffered (called at transaction ends, before status updates
    /// and at shutdown) so its notices can follow.
    fn flush(&mut self) -> Result<(), SinkError>;
}
