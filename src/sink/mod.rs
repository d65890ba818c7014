//! Sinks: where routed events go. A sink accepts events and later reports each one's
//! delivery; only a successful report lets the acknowledgement move past it.
//!
//! "Sent" and "delivered" are different states: [`Sink::send`] only hands an event over,
//! the [`SinkNotice`] arriving on the channel given at construction says it is durable
//! (for stdout: written and flushed; for Kafka: acknowledged by the brokers, `acks=all`).

pub mod kafka;
pub mod stdout;

use tokio::sync::mpsc;

use crate::relay::router::OutboxEvent;

/// Identifies the transaction an event belongs to, for the ack tracker.
pub type TxnSeq = u64;

/// What a sink tells the pipeline, asynchronously.
#[derive(Debug)]
pub enum SinkNotice {
    /// One event of transaction `txn` is durable.
    Delivered { txn: TxnSeq },
    /// One event of transaction `txn` was refused for good.
    Failed {
        txn: TxnSeq,
        failure: DeliveryFailure,
    },
    /// The sink cannot go on (e.g. a fatal idempotent-producer error): rebuild it and
    /// resend everything not yet acknowledged.
    Fatal { reason: String },
    /// The client reported an error; it may have become fatal (librdkafka does not
    /// flag fatal errors in its error callback, so the pipeline asks the client).
    ClientError,
}

/// A definite per-event refusal (oversize, illegal topic, authorization).
#[derive(Debug)]
pub struct DeliveryFailure {
    pub reason: String,
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
    #[error("topic {topic:?}: {reason}")]
    Topic { topic: String, reason: String },
    /// The topic could not be checked or created because the brokers did not answer:
    /// retry later, the event is not at fault.
    #[error("topic {topic:?}: {reason}")]
    TopicUnavailable { topic: String, reason: String },
}

/// Where events go.
pub trait Sink: Send {
    /// Hand one event over. Its notice arrives later on the notice channel.
    fn send(&mut self, event: OutboxEvent, txn: TxnSeq) -> Result<(), SendError>;

    /// Push out anything buffered (called at transaction ends, before status updates
    /// and at shutdown) so its notices can follow.
    fn flush(&mut self) -> Result<(), SinkError>;
}
