//! What the relay needs on the source: the slot, the publication, the outbox table and
//! the options that decide how they are set up. A plain value that names nothing of the
//! crate but [`crate::pg::sql`]'s table name: the preparation ([`crate::pg::slot`]) and
//! the diagnosis of its failures ([`crate::pg::diagnose`]) both take it, so it lives
//! apart from both, and the import between them runs one way (slot to diagnose, for
//! [`SetupError`](crate::pg::diagnose::SetupError)).

use crate::pg::sql::QualifiedName;

/// What the relay needs on the source.
#[derive(Debug, Clone)]
pub struct SourceSpec {
    pub slot: String,
    pub publication: String,
    pub table: QualifiedName,
    /// Where the relay records its slot ([`crate::pg::state`]).
    pub state_table: QualifiedName,
    /// Make the slot a failover slot where the server supports it (PostgreSQL 17+).
    pub failover: bool,
    /// The outbox table is relayed; `false`: a table-less deployment (messages only),
    /// whose publication publishes no table.
    pub outbox: bool,
    /// Ask pgoutput for logical decoding messages (`messages 'true'`, PostgreSQL 14+).
    pub messages: bool,
}
