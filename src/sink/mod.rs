//! Sinks: where routed events go. A sink accepts events and later reports each one's
//! delivery; only a successful report lets the acknowledgement move past it.
//!
//! "Sent" and "delivered" are different states: [`Sink::send`] only hands an event over,
//! the [`DeliveryReport`] arriving on the channel given at construction says it is
//! durable (for stdout: written and flushed; for Kafka: acknowledged by the brokers).

pub mod stdout;

use tokio::sync::mpsc;

use crate::relay::router::OutboxEvent;

/// Identifies the transaction an event belongs to, for the ack tracker.
pub type TxnSeq = u64;

/// The outcome of one event's delivery.
#[derive(Debug)]
pub struct DeliveryReport {
    pub txn: TxnSeq,
    pub result: Result<(), SinkError>,
}

/// Sender half handed to sinks for their delivery reports.
pub type ReportSender = mpsc::UnboundedSender<DeliveryReport>;

/// A sink failure.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("writing to stdout failed: {0}")]
    Stdout(#[from] std::io::Error),
}

/// Where events go.
pub trait Sink: Send {
    /// Hand one event over. Its delivery report arrives later on the report channel.
    fn send(&mut self, event: &OutboxEvent, txn: TxnSeq) -> Result<(), SinkError>;

    /// Push out anything buffered (called at transaction ends, before status updates
    /// and at shutdown) so its delivery reports can follow.
    fn flush(&mut self) -> Result<(), SinkError>;
}
