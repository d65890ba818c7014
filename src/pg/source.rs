//! What the relay needs on the source: the slot, the publication, the outbox tables and
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
    /// The outbox tables, in the configuration's order; empty for a table-less
    /// deployment (messages only), whose publication publishes no table.
    pub tables: Vec<QualifiedName>,
    /// Where the relay records its slot ([`crate::pg::state`]).
    pub state_table: QualifiedName,
    /// Make the slot a failover slot where the server supports it (PostgreSQL 17+).
    pub failover: bool,
    /// Ask pgoutput for logical decoding messages (`messages 'true'`, PostgreSQL 14+).
    pub messages: bool,
}

impl SourceSpec {
    /// Outbox tables are relayed; `false`: a table-less deployment (messages only).
    pub fn outbox(&self) -> bool {
        !self.tables.is_empty()
    }

    /// The tables as messages name them: `a.outbox, b.outbox`.
    pub fn tables_shown(&self) -> String {
        let names: Vec<String> = self.tables.iter().map(ToString::to_string).collect();
        names.join(", ")
    }
}

/// One outbox table as the source found it: the stream names it by its relation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRelation {
    pub table: QualifiedName,
    /// Its `pg_class` OID when the relay prepared the source.
    pub oid: u32,
    /// A partitioned table, published through its root.
    pub partitioned: bool,
}
