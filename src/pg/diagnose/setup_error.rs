//! [`SetupError`]: what went wrong with the source, each variant with the message that
//! tells the operator what to do (the SQL to run, the setting to change, the command
//! that recovers). The words live here, apart from the classification in
//! `diagnose.rs`, which decides which variant a failure is; whether a variant is
//! transient is part of the type ([`SetupError::is_transient`]).

use crate::pg::conn::PgError;
use crate::pg::sql::{quote_ident, quote_literal, QualifiedName};

/// A problem with the source. Definite (retrying will not fix it) unless
/// [`SetupError::is_transient`] says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A standby, or a primary restarting from a backup: it may be promoted, so wait.
    #[error("PostgreSQL is in recovery (a standby, or a server restoring from a backup): the relay streams from a primary and does not stream while in recovery; waiting for it to be promoted (to decode on this standby instead, PostgreSQL 16+: set [postgres] primary_url to its primary)")]
    InRecovery,
    #[error("PostgreSQL has wal_level={found}, logical replication needs wal_level=logical: set wal_level=logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL")]
    WalLevel { found: String },
    #[error("role {user:?} may not stream the WAL: logical replication needs a role with the REPLICATION attribute; run ALTER ROLE {} WITH REPLICATION, or use a role that has it", quote_ident(user))]
    NoReplicationPrivilege { user: String },
    #[error(
        "permission denied for role {user:?}: {message}; grant it the privilege PostgreSQL names"
    )]
    PermissionDenied { user: String, message: String },
    #[error("{message}: check the database name in [postgres] url (the outbox table's database)")]
    DatabaseMissing { message: String },
    #[error("replication slot {slot:?} is invalidated ({}): {}. Events in that WAL can no longer be read from the slot. Drop it with SELECT pg_drop_replication_slot({}), create a new one knowingly with `outbox-relay slot create --accept-gap --config FILE` (it starts at the current position), then re-send the outbox rows written since the last acknowledged position with `outbox-relay backfill --config FILE --since TIME`", invalidated_state(reason.as_deref()), invalidation_cause(reason.as_deref()), quote_literal(slot))]
    SlotInvalidated {
        slot: String,
        /// `invalidation_reason` (PostgreSQL 17 and later).
        reason: Option<String>,
    },
    /// The slot went away after the attempt prepared it: the next attempt applies the
    /// lost-slot rules ([`crate::pg::state`]).
    #[error(
        "replication slot {slot:?} disappeared while the relay was starting to stream from it"
    )]
    SlotMissing { slot: String },
    #[error("publication {publication:?} does not exist{} (PostgreSQL: {server_said}); was it dropped? {}. {}", if *exists_now { " at the point of the WAL the slot reads (it exists now, created after that point)" } else { "" }, recreate(publication, tables), unread_wal_advice(slot, *exists_now))]
    PublicationMissing {
        publication: String,
        tables: Vec<QualifiedName>,
        slot: String,
        /// It exists in the catalog now: the slot's unread WAL predates it.
        exists_now: bool,
        /// The server's own message (an ERROR up to 17, a WARNING from 18 on).
        server_said: String,
    },
    /// Another process streams from the slot (seen before anything was written: a
    /// relay waiting for the slot changes nothing).
    #[error("replication slot {slot:?} is active for PID {pid}")]
    SlotActive { slot: String, pid: i32 },
    /// A problem of the source found while preparing it ([`crate::pg::slot`]: the outbox
    /// table, the publication, the slot's creation), its fix in the text. Only this
    /// layer builds it: the relay and the operator commands have their own definite
    /// errors.
    #[error("{0}")]
    Definite(String),
    #[error(transparent)]
    Pg(#[from] PgError),
}

impl SetupError {
    /// Whether a new attempt (with backoff) can outlive this error.
    pub fn is_transient(&self) -> bool {
        match self {
            SetupError::InRecovery
            | SetupError::SlotMissing { .. }
            | SetupError::SlotActive { .. } => true,
            SetupError::Pg(pg) => pg.is_transient(),
            _ => false,
        }
    }
}

fn invalidated_state(reason: Option<&str>) -> String {
    match reason {
        Some(reason) => format!("wal_status = lost, invalidation_reason = {reason}"),
        None => "wal_status = lost".to_owned(),
    }
}

/// Why a slot was invalidated (PostgreSQL 17 and later name the cause in
/// `invalidation_reason`; 18 adds `idle_timeout`).
fn invalidation_cause(reason: Option<&str>) -> String {
    match reason {
        Some("idle_timeout") => "it was unused for longer than idle_replication_slot_timeout (PostgreSQL 18), so PostgreSQL stopped keeping the WAL it needed; set that timeout above the longest time the relay may be stopped, or 0 to turn it off".to_owned(),
        // A slot on a standby (16: `conflicting`; 17+: these reasons).
        Some(reason @ ("rows_removed" | "wal_level_insufficient" | "a recovery conflict on the standby")) => {
            let said = if reason.starts_with('a') {
                "PostgreSQL 16 does not tell this from the WAL it needed being removed, max_slot_wal_keep_size".to_owned()
            } else {
                format!("PostgreSQL gives the reason {reason:?}")
            };
            format!("decoding on a standby, the slot met a recovery conflict: the primary removed catalog rows it still needed (turn hot_standby_feedback on and give the standby a physical slot, primary_slot_name), or the primary's wal_level fell below logical ({said})")
        }
        None | Some("wal_removed") => {
            "the WAL it needed was removed, usually because of max_slot_wal_keep_size".to_owned()
        }
        Some(other) => format!("PostgreSQL gives the reason {other:?}"),
    }
}

fn unread_wal_advice(slot: &str, exists_now: bool) -> String {
    let lead = if exists_now {
        "It exists now, but the slot's unread WAL predates it"
    } else {
        "If PostgreSQL still reports it missing after that, the slot's unread WAL predates the new publication"
    };
    format!(
        "{lead}: drop the slot (SELECT pg_drop_replication_slot({})), create a new one knowingly (`outbox-relay slot create --accept-gap --config FILE`), and re-send the outbox rows written since the last acknowledged position (`outbox-relay backfill --config FILE --since TIME`)",
        quote_literal(slot)
    )
}

/// How to create the publication again: for every outbox table, or without a table
/// for a messages-only relay.
fn recreate(publication: &str, tables: &[QualifiedName]) -> String {
    if tables.is_empty() {
        return format!(
            "Recreate it: CREATE PUBLICATION {} WITH (publish = 'insert')",
            quote_ident(publication)
        );
    }
    let shown: Vec<String> = tables.iter().map(ToString::to_string).collect();
    let quoted: Vec<String> = tables.iter().map(QualifiedName::quoted).collect();
    format!(
        "Recreate it as the owner of {}: CREATE PUBLICATION {} FOR TABLE {} WITH (publish = 'insert')",
        shown.join(", "),
        quote_ident(publication),
        quoted.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invalidated_slot_names_its_cause() {
        let text = |reason: Option<&str>| {
            SetupError::SlotInvalidated {
                slot: "s".into(),
                reason: reason.map(str::to_owned),
            }
            .to_string()
        };
        assert!(text(None).contains("max_slot_wal_keep_size"));
        assert!(text(Some("wal_removed")).contains("max_slot_wal_keep_size"));
        let idle = text(Some("idle_timeout"));
        assert!(idle.contains("idle_replication_slot_timeout"), "{idle}");
        assert!(!idle.contains("max_slot_wal_keep_size"), "{idle}");
        assert!(text(Some("rows_removed")).contains("\"rows_removed\""));
    }
}
