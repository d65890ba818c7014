//! The replication stream as the pipeline sees it: events in, status updates out.
//!
//! ```text
//!             next_event()      ─▶ ┌────────────────────┐
//!  pipeline   buffered_event()  ─▶ │ ReplicationStream  │ PgConnection in CopyBoth mode
//!             send_status(...)  ─▶ └────────────────────┘ (a scripted fake in unit tests)
//! ```
//!
//! The loop ([`crate::relay::pipeline`]) needs four things of the connection once
//! `START_REPLICATION` has answered: the next event (waiting for it, cancel-safe, so it
//! can sit in a `select!`), an event already received (without waiting, to take a
//! whole read's worth in one turn), a status update sent, and a polite close. Behind
//! this trait the loop's decisions (ordering, the ack invariant, backpressure, status
//! updates, shutdown) are tested in milliseconds with a scripted stream
//! (`pipeline/tests/script.rs`); the real connection is the integration suite's.
//! Preparing the source (publication, slot, checks) is not part of it: that happens
//! before a pipeline exists ([`crate::relay::run()`]).

use std::future::Future;
use std::time::Duration;

use crate::pg::conn::{CopyEvent, PgConnection, PgError};
use crate::pg::replication::StandbyStatusUpdate;

/// A replication stream that has started (CopyBoth mode).
pub trait ReplicationStream: Send {
    /// The next event, waiting for it. Must be cancel-safe: the loop drops this future
    /// whenever another branch of its `select!` is taken, and nothing received may be
    /// lost with it.
    fn next_event(&mut self) -> impl Future<Output = Result<CopyEvent, PgError>> + Send;

    /// The next event if it has been received already (`None`: waiting would be needed).
    fn buffered_event(&mut self) -> Result<Option<CopyEvent>, PgError>;

    /// Send a standby status update.
    fn send_status(
        &mut self,
        update: &StandbyStatusUpdate,
    ) -> impl Future<Output = Result<(), PgError>> + Send;

    /// Leave the stream politely (bounded by `wait`); errors are ignored: this is the end.
    fn close(self, wait: Duration) -> impl Future<Output = ()> + Send;
}

impl ReplicationStream for PgConnection {
    fn next_event(&mut self) -> impl Future<Output = Result<CopyEvent, PgError>> + Send {
        self.next_copy_event()
    }

    fn buffered_event(&mut self) -> Result<Option<CopyEvent>, PgError> {
        self.buffered_copy_event()
    }

    fn send_status(
        &mut self,
        update: &StandbyStatusUpdate,
    ) -> impl Future<Output = Result<(), PgError>> + Send {
        PgConnection::send_status(self, update)
    }

    fn close(self, wait: Duration) -> impl Future<Output = ()> + Send {
        PgConnection::close(self, wait)
    }
}
