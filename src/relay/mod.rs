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

mod error;

pub use error::{Definite, RelayError, Transient};
