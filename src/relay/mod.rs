//! The relay: transaction assembly, routing, acknowledgement, and the pipeline loop that
//! ties them to the replication connection and a sink.

pub mod ack;
pub mod pipeline;
pub mod router;
pub mod txn;

use crate::config::ConfigError;
use crate::pg::conn::PgError;
use crate::pg::pgoutput::DecodeError;
use crate::pg::slot::SetupError;
use crate::sink::SinkError;

/// Why the relay stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Pg(#[from] PgError),
    #[error(transparent)]
    Setup(SetupError),
    #[error("cannot decode a pgoutput message from PostgreSQL: {0}")]
    Decode(#[from] DecodeError),
    #[error("the replication stream broke the protocol: {0}")]
    Assembly(#[from] txn::AssemblyError),
    #[error(
        "{0}; the relay stops without acknowledging it (fix the row's producer, then restart)"
    )]
    Route(#[from] txn::RoutedRowError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("internal error in the ack tracker: {0}")]
    Ack(#[from] ack::AckError),
    #[error("PostgreSQL ended the replication stream")]
    StreamEnded,
}

impl From<SetupError> for RelayError {
    fn from(e: SetupError) -> Self {
        match e {
            SetupError::Pg(pg) => RelayError::Pg(pg),
            other => RelayError::Setup(other),
        }
    }
}
