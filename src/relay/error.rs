//! Why the relay stopped or restarts. Whether a new attempt can outlive a failure is
//! part of its type, decided where the failure is understood:
//!
//! ```text
//!   RelayError::Transient(..)  a new attempt (new connection and sink, everything not
//!                              acknowledged sent again) can outlive it: retried with backoff
//!   RelayError::Definite(..)   only the operator can fix it: the relay stops, the message
//!                              says how
//!   RelayError::Pg(..)         PostgreSQL failed and what that means is not known yet: the
//!                              attempt asks the server once (pg::diagnose::explain) and
//!                              ends with one of the two above in its place (relay::run)
//! ```
//!
//! Each layer's error converts into one of them by its own variants: a sink's
//! [`SinkError`] (`Retry` and `TopicUnavailable` are transient), the source's
//! [`SetupError`] (waiting for a promotion or for the slot is transient, the rest is
//! the operator's), a [`Stall`](crate::relay::liveness::Stall) (transient: reconnect), a
//! decoding or protocol failure (definite). The pipeline builds its own failures as one
//! or the other directly. The supervisor only looks at which of the two it got.

use crate::pg::conn::PgError;
use crate::pg::diagnose::{SetupError, SLOT_IN_USE};
use crate::pg::pgoutput::DecodeError;
use crate::pg::Lsn;
use crate::relay::{ack, messages, txn};
use crate::sink::SinkError;

/// Why the relay stopped (or restarts): see the module doc.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// A new attempt can outlive it.
    #[error(transparent)]
    Transient(#[from] Transient),
    /// Only the operator can fix it; the message says how.
    #[error(transparent)]
    Definite(#[from] Definite),
    /// A PostgreSQL failure not yet explained (the attempt explains it before it ends).
    #[error(transparent)]
    Pg(#[from] PgError),
}

/// A failure a new attempt can outlive.
#[derive(Debug, thiserror::Error)]
pub enum Transient {
    /// A connection that failed or broke, or a server error that passes (a restart, a
    /// conflict, too many connections).
    #[error(transparent)]
    Pg(PgError),
    /// The source is not ready yet: in recovery, its slot busy (a standby relay) or
    /// gone while starting.
    #[error(transparent)]
    Setup(Box<SetupError>),
    /// The sink's own transient failure (a broker away, a topic not answering).
    #[error(transparent)]
    Sink(SinkError),
    #[error("PostgreSQL ended the replication stream")]
    StreamEnded,
    #[error("nothing received from PostgreSQL for {secs} s although it was asked to reply (network cut or blackholed?)")]
    Silent { secs: u64 },
    #[error("the outbox watch's connection to PostgreSQL did not answer for {secs} s (network cut or blackholed?); nothing past its last check is acknowledged meanwhile")]
    WatchSilent { secs: u64 },
    #[error("the oldest undelivered event has waited {secs} s for Kafka's confirmation ({in_flight} events in flight; a broker or one partition is stuck): releasing the replication connection so PostgreSQL is not held (its shutdown waits for acknowledgements); the events are sent again after reconnecting")]
    SinkStalled { secs: u64, in_flight: u64 },
}

/// A failure only the operator can fix.
#[derive(Debug, thiserror::Error)]
pub enum Definite {
    /// The source is unusable as it is (a setting, a privilege, a lost slot, ...).
    #[error(transparent)]
    Setup(Box<SetupError>),
    /// The sink's own definite failure (its configuration, an authorization).
    #[error(transparent)]
    Sink(SinkError),
    #[error("cannot decode a pgoutput message from PostgreSQL: {0}")]
    Decode(DecodeError),
    #[error("the replication stream broke the protocol: {0}")]
    Assembly(txn::AssemblyError),
    #[error("{0}; no [dead_letter] topic is configured, so the relay stops without acknowledging it (fix the row or configure a dead-letter topic, then restart)")]
    Route(txn::RoutedRowError),
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
    #[error("internal error in the ack tracker: {0}")]
    Ack(ack::AckError),
    #[error("metrics: {0}; change [metrics] listen")]
    Metrics(String),
    #[error("{change}: outbox rows committed after {since} may not have been streamed, so the relay stops without acknowledging anything past {since}. Repair: {repair}; then re-send the rows written to the outbox since {since} (they stay in the table unless deleted) and restart the relay")]
    OutboxUnpublished {
        change: String,
        repair: String,
        since: Lsn,
    },
    /// The outbox watch's first reading does not match what the relay prepared.
    #[error("{0}")]
    OutboxChangedWhileStarting(String),
    #[error("the server is a different PostgreSQL cluster (system identifier {to}, was {from}): check [postgres] url; the relay does not follow a slot to another cluster")]
    SystemChanged { from: String, to: String },
    /// An operator command cannot do what it was asked; the message says why and what
    /// to do.
    #[error("{0}")]
    Command(String),
}

impl From<SetupError> for RelayError {
    /// An explained problem of the source, transient or definite by its variant
    /// ([`SetupError::is_transient`], next to the variants in `pg::diagnose`).
    fn from(setup: SetupError) -> Self {
        match setup {
            SetupError::Pg(pg) if pg.is_transient() => Transient::Pg(pg).into(),
            setup if setup.is_transient() => Transient::Setup(Box::new(setup)).into(),
            setup => Definite::Setup(Box::new(setup)).into(),
        }
    }
}

impl From<SinkError> for RelayError {
    /// The sink's failure, transient or definite by the variant the sink chose
    /// ([`SinkError::is_transient`]).
    fn from(sink: SinkError) -> Self {
        if sink.is_transient() {
            Transient::Sink(sink).into()
        } else {
            Definite::Sink(sink).into()
        }
    }
}

impl From<DecodeError> for RelayError {
    fn from(error: DecodeError) -> Self {
        Definite::Decode(error).into()
    }
}

impl From<txn::AssemblyError> for RelayError {
    fn from(error: txn::AssemblyError) -> Self {
        Definite::Assembly(error).into()
    }
}

impl From<ack::AckError> for RelayError {
    fn from(error: ack::AckError) -> Self {
        Definite::Ack(error).into()
    }
}

impl RelayError {
    /// Whether PostgreSQL refused the slot because another process streams from it
    /// (a standby relay waiting to take over).
    pub fn slot_in_use(&self) -> bool {
        match self {
            RelayError::Pg(PgError::Db(db))
            | RelayError::Transient(Transient::Pg(PgError::Db(db))) => db.code == SLOT_IN_USE,
            RelayError::Transient(Transient::Setup(setup)) => {
                matches!(**setup, SetupError::SlotActive { .. })
            }
            _ => false,
        }
    }

    /// Whether a new attempt can outlive this error: [`RelayError::Transient`]. A
    /// PostgreSQL error not yet explained (only inside an attempt) counts by its kind.
    pub fn is_retryable(&self) -> bool {
        match self {
            RelayError::Transient(_) => true,
            RelayError::Definite(_) => false,
            RelayError::Pg(pg) => pg.is_transient(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layer_classifies_by_its_own_variants() {
        let retry = RelayError::from(SinkError::Retry("broker away".into()));
        assert!(matches!(retry, RelayError::Transient(Transient::Sink(_))));
        let stop = RelayError::from(SinkError::Stop("not authorized".into()));
        assert!(matches!(stop, RelayError::Definite(Definite::Sink(_))));
        let unavailable = RelayError::from(SinkError::TopicUnavailable {
            topic: "t".into(),
            reason: "no answer".into(),
        });
        assert!(unavailable.is_retryable());
        let refused = RelayError::from(SinkError::TopicRefused {
            topic: "t".into(),
            reason: "illegal name".into(),
        });
        assert!(!refused.is_retryable());

        let recovery = RelayError::from(SetupError::InRecovery);
        assert!(matches!(
            recovery,
            RelayError::Transient(Transient::Setup(_))
        ));
        let busy = RelayError::from(SetupError::SlotActive {
            slot: "s".into(),
            pid: 7,
        });
        assert!(busy.slot_in_use() && busy.is_retryable());
        let wal_level = RelayError::from(SetupError::WalLevel {
            found: "replica".into(),
        });
        assert!(matches!(
            wal_level,
            RelayError::Definite(Definite::Setup(_))
        ));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let explained_io = RelayError::from(SetupError::Pg(PgError::Io(io)));
        assert!(matches!(
            explained_io,
            RelayError::Transient(Transient::Pg(_))
        ));
    }
}
