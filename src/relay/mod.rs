//! The relay: transaction assembly, routing, acknowledgement, and the pipeline loop that
//! ties them to the replication connection and a sink; only what runs while streaming.
//! The operator commands that use these parts live in `ops`, which the relay never names.

pub mod ack;
pub mod backoff;
pub mod deadletter;
pub mod feedback;
pub mod lag;
pub mod liveness;
pub mod messages;
pub mod pipeline;
pub mod record;
pub mod router;
pub mod run;
pub mod settings;
pub mod source;
pub mod takeover;
pub mod txn;
pub mod watch;

pub use run::run;

/// Log messages that mark a step of the relay's life, shared with the tests that wait
/// for them (so a rewording cannot silently turn a wait or a check into a no-op).
pub mod log {
    /// The replication stream is about to start (setup done).
    pub const STARTING_REPLICATION: &str = "starting replication";
    /// The first SIGTERM/SIGINT was handled: no more reading, deliveries drain.
    pub const SHUTDOWN_REQUESTED: &str = "shutdown requested: no more reading, draining deliveries";
    /// A retryable error ended an attempt; another follows after a backoff.
    pub const RETRYING: &str =
        "relay interrupted; retrying (streaming resumes from the slot's acknowledged position)";
    /// Exactly-once: a replayed PostgreSQL transaction was split over Kafka transactions
    /// and only its first events are committed; the rest is sent.
    pub const RESUMING_SPLIT: &str =
        "exactly-once: resuming a transaction split over Kafka transactions after its committed events";
    /// Another process streams from the slot: this relay waits as the standby (said
    /// once each time it starts waiting).
    pub const WAITING_FOR_SLOT: &str =
        "replication slot is in use by another process; waiting to take over";
    /// A standby ends the walsender of a relay that went silent, to take the slot over.
    pub const TAKING_OVER: &str =
        "the relay streaming from the slot is silent: ending its walsender to take over";
}

use crate::pg::conn::PgError;
use crate::pg::diagnose::{SetupError, SLOT_IN_USE};
use crate::pg::pgoutput::DecodeError;
use crate::pg::Lsn;
use crate::sink::SinkError;

/// Why the relay stopped (or restarts).
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Pg(#[from] PgError),
    #[error(transparent)]
    Setup(Box<SetupError>),
    #[error("cannot decode a pgoutput message from PostgreSQL: {0}")]
    Decode(#[from] DecodeError),
    #[error("the replication stream broke the protocol: {0}")]
    Assembly(#[from] txn::AssemblyError),
    #[error("{0}; no [dead_letter] topic is configured, so the relay stops without acknowledging it (fix the row or configure a dead-letter topic, then restart)")]
    Route(#[from] txn::RoutedRowError),
    #[error("{0}; no [dead_letter] topic is configured, so the relay stops without acknowledging it (fix the writer, or configure a dead-letter topic, then restart)")]
    Message(messages::MessageError),
    #[error("event at {lsn} for topic {topic:?} cannot be delivered: {reason}; no [dead_letter] topic is configured, so the relay stops without acknowledging it")]
    Undeliverable {
        topic: String,
        lsn: Lsn,
        reason: String,
    },
    #[error("{reason}; no [dead_letter] topic is configured, so the relay stops without acknowledging it")]
    RefusedWithoutDeadLetter { reason: String },
    #[error("the dead-letter topic refused a record: {0}; the event is not acknowledged: fix the dead-letter topic or its settings (or [kafka.properties] message.max.bytes), then restart")]
    DeadLetterRefused(String),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("internal error in the ack tracker: {0}")]
    Ack(#[from] ack::AckError),
    #[error("PostgreSQL ended the replication stream")]
    StreamEnded,
    #[error("metrics: {0}; change [metrics] listen")]
    Metrics(String),
    #[error("nothing received from PostgreSQL for {secs} s although it was asked to reply (network cut or blackholed?)")]
    Silent { secs: u64 },
    #[error("the outbox watch's connection to PostgreSQL did not answer for {secs} s (network cut or blackholed?); nothing past its last check is acknowledged meanwhile")]
    WatchSilent { secs: u64 },
    #[error("the oldest undelivered event has waited {secs} s for Kafka's confirmation ({in_flight} events in flight; a broker or one partition is stuck): releasing the replication connection so PostgreSQL is not held (its shutdown waits for acknowledgements); the events are sent again after reconnecting")]
    SinkStalled { secs: u64, in_flight: u64 },
    #[error("{change}: outbox rows committed after {since} may not have been streamed, so the relay stops without acknowledging anything past {since}. Repair: {repair}; then re-send the rows written to the outbox since {since} (they stay in the table unless deleted) and restart the relay")]
    OutboxUnpublished {
        change: String,
        repair: String,
        since: Lsn,
    },
    #[error("the server is a different PostgreSQL cluster (system identifier {to}, was {from}): check [postgres] url; the relay does not follow a slot to another cluster")]
    SystemChanged { from: String, to: String },
}

impl From<SetupError> for RelayError {
    fn from(e: SetupError) -> Self {
        match e {
            SetupError::Pg(pg) => RelayError::Pg(pg),
            other => RelayError::Setup(Box::new(other)),
        }
    }
}

impl RelayError {
    /// Whether PostgreSQL refused the slot because another process streams from it
    /// (a standby relay waiting to take over).
    pub fn slot_in_use(&self) -> bool {
        match self {
            RelayError::Pg(PgError::Db(db)) => db.code == SLOT_IN_USE,
            RelayError::Setup(setup) => matches!(**setup, SetupError::SlotActive { .. }),
            _ => false,
        }
    }

    /// Retryable errors restart the pipeline (with backoff) from the slot's
    /// acknowledged position; all others stop the relay with their message. Each layer
    /// classifies its own errors where they arise; this only asks them.
    pub fn is_retryable(&self) -> bool {
        match self {
            RelayError::Pg(pg) => pg.is_transient(),
            RelayError::Setup(setup) => setup.is_transient(),
            RelayError::Sink(sink) => sink.is_transient(),
            RelayError::StreamEnded
            | RelayError::Silent { .. }
            | RelayError::WatchSilent { .. }
            | RelayError::SinkStalled { .. } => true,
            RelayError::Decode(_)
            | RelayError::Assembly(_)
            | RelayError::Route(_)
            | RelayError::Message(_)
            | RelayError::Undeliverable { .. }
            | RelayError::RefusedWithoutDeadLetter { .. }
            | RelayError::DeadLetterRefused(_)
            | RelayError::Ack(_)
            | RelayError::Metrics(_)
            | RelayError::OutboxUnpublished { .. }
            | RelayError::SystemChanged { .. } => false,
        }
    }
}
