//! Pure: what the preflight knows about the PostgreSQL side ([`PgFacts`], gathered by
//! `gather`, written by hand in the tests) and what it checks them against
//! ([`Target`]). A leaf of the check: the findings of `postgres`,
//! `slot` and `messages` all read these values, and none of them
//! needs another to do so.

use crate::pg::slot::SourceSpec;
use crate::pg::state::SlotRecord;
use crate::relay::router::{AdditionalField, Router, RouterColumns};

use super::Finding;

/// Server-wide settings and the role, from one query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerSettings {
    pub version: String,
    pub version_num: u32,
    pub in_recovery: bool,
    pub wal_level: String,
    pub max_replication_slots: u32,
    pub used_replication_slots: u32,
    pub max_wal_senders: u32,
    pub active_wal_senders: u32,
    pub user: String,
    pub database: String,
    pub rolreplication: bool,
    pub superuser: bool,
    /// CREATE on the database (needed to create the publication).
    pub may_create_in_database: bool,
    /// `max_slot_wal_keep_size` in bytes; `None` when unlimited (-1).
    pub max_slot_wal_keep_size: Option<i64>,
    /// `synchronized_standby_slots` (PostgreSQL 17+).
    pub synchronized_standby_slots: Option<String>,
    /// Privileges of `pg_read_all_stats` (another walsender's `reply_time`) and of
    /// `pg_signal_backend` (ending it): a standby's takeover from a silent relay.
    pub reads_all_stats: bool,
    pub signals_backends: bool,
    /// A standby's `hot_standby_feedback` and `primary_slot_name` (decoding there needs
    /// both: without them the primary's vacuum removes catalog rows the slot reads).
    pub hot_standby_feedback: bool,
    pub primary_slot_name: String,
}

/// The outbox table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableFacts {
    /// `pg_class.relkind`: `r` table, `p` partitioned table.
    pub relkind: String,
    /// The role is (a member of) the owner.
    pub owned: bool,
    pub columns: Vec<ColumnFacts>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ColumnFacts {
    pub name: String,
    pub type_oid: u32,
    /// `format_type`, for messages.
    pub type_name: String,
    pub not_null: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicationFacts {
    pub inserts: bool,
    pub via_root: bool,
    pub all_tables: bool,
    /// Relations it publishes (`schema.table`), as `pg_publication_tables` lists them.
    pub tables: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotFacts {
    pub plugin: Option<String>,
    pub slot_type: String,
    pub database: Option<String>,
    pub wal_status: Option<String>,
    pub invalidation_reason: Option<String>,
    pub active_pid: Option<i32>,
    /// `pg_current_wal_lsn() - restart_lsn`.
    pub retained_bytes: Option<i64>,
    pub failover: bool,
}

/// The relay's record table ([`crate::pg::state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateFacts {
    Exists {
        may_select: bool,
        may_insert: bool,
        may_update: bool,
        /// The record of the slot (`None` also when it could not be read).
        record: Option<SlotRecord>,
    },
    Missing {
        schema_exists: bool,
        may_create: bool,
    },
}

/// Everything gathered; a fact whose query failed holds the error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgFacts {
    pub server: ServerSettings,
    /// A `replication=database` session and `IDENTIFY_SYSTEM`, as the relay opens it.
    pub replication_session: Result<(), String>,
    /// Each outbox table, in the configuration's order.
    pub tables: Vec<Result<Option<TableFacts>, String>>,
    pub publication: Result<Option<PublicationFacts>, String>,
    pub slot: Result<Option<SlotFacts>, String>,
    pub state: Result<StateFacts, String>,
}

/// What the facts are checked against.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub spec: &'a SourceSpec,
    /// The routers' columns of each outbox table, in the spec's order.
    pub outboxes: Vec<OutboxTarget<'a>>,
    /// `--config FILE`, for the commands the fixes name.
    pub config_hint: String,
}

/// The columns one outbox table's router reads, and the entry it is checked as.
#[derive(Debug, Clone)]
pub struct OutboxTarget<'a> {
    pub columns: RouterColumns<'a>,
    pub additional: &'a [AdditionalField],
    /// The configuration key of its entry: `outbox`, or `outbox[2]` in a list.
    pub key: String,
    /// The table is one its entry's pattern matched (its findings name it).
    pub pattern: bool,
}

impl<'a> OutboxTarget<'a> {
    /// The single `[outbox]`'s table.
    pub fn of(router: &'a Router) -> Self {
        Self::entry(router, "outbox".to_owned(), false)
    }

    pub fn entry(router: &'a Router, key: String, pattern: bool) -> Self {
        OutboxTarget {
            columns: router.columns(),
            additional: router.additional(),
            key,
            pattern,
        }
    }
}

/// A finding whose fact could not be gathered: the query's error, and how to get it.
pub(super) fn not_checked(id: &str, error: &str) -> Finding {
    Finding::problem(
        id,
        format!("could not be checked: {error}"),
        "run the check with the relay's own role against the primary; the error names what is missing",
    )
}
