//! The operator commands beside `run`: everything the command line does other than
//! stream. They use the relay's parts (its settings, router and ack tracker), the
//! PostgreSQL side and the sinks; nothing that runs while streaming uses them
//! (`tests/architecture.rs` holds the relay to that).
//!
//! ```text
//! check      check/           preflight: gather facts (I/O, read-only) → findings (pure)
//! init       init.rs          the set-up script of init_sql.rs (pure), printed or applied
//! slot       slot.rs          create (past a lost slot's gap only when asked), status, drop
//!            slot_report.rs   what they say: the status, the gap to backfill (pure)
//! cleanup    cleanup.rs       the wait and the batches around cleanup_sql.rs (pure)
//! backfill   backfill.rs      re-send the outbox rows since a time through the sink
//! ```
//!
//! The command line (`src/main.rs`) loads the configuration and calls these; what they
//! did comes back as values, with the text the operator reads.
//!
//! As in the relay, the pure parts take values and return values and are unit-tested;
//! the I/O parts are thin.

pub mod backfill;
pub mod check;
pub mod cleanup;
pub mod cleanup_sql;
pub mod init;
pub mod init_sql;
pub mod slot;
pub mod slot_report;

use crate::relay::{Definite, RelayError};

/// A definite failure of a command: its message says what to do.
fn definite(message: impl Into<String>) -> RelayError {
    Definite::Command(message.into()).into()
}
