//! Why a step against PostgreSQL failed, classified once, where it arises: transient
//! (a retry can outlive it) or definite (stop, and say how to fix it).
//!
//! A server error's wording is never matched: it differs between versions and follows
//! `lc_messages`. Its SQLSTATE is read, and for the failures with a known fix — a server
//! in recovery, a role without REPLICATION, an invalidated slot, a missing publication —
//! the relay asks the server's catalogs on a fresh session ([`server_facts`]) and
//! reports what they say ([`classify`], pure).
//!
//! ```text
//! PgError ──is_transient?──▶ SetupError::Pg (retry)
//!    │ definite
//!    ▼
//! server_facts (pg_is_in_recovery, pg_roles, pg_replication_slots, pg_publication)
//!    ▼
//! classify ──▶ InRecovery | NoReplicationPrivilege | SlotInvalidated | SlotMissing
//!              | PublicationMissing | PermissionDenied | DatabaseMissing | Pg
//! ```

mod setup_error;

use crate::pg::conn::{DbError, PgConnection, PgError, SessionKind};
use crate::pg::source::SourceSpec;
use crate::pg::sql::quote_literal;
use crate::pg::url::ConnectParams;
pub use setup_error::SetupError;

/// SQLSTATEs a retry can outlive: `admin_shutdown` (server restart or
/// `pg_terminate_backend`), `crash_shutdown`, `cannot_connect_now` (starting up),
/// `too_many_connections`, `object_in_use` (slot held by another process), and the
/// connection exceptions (class 08).
const TRANSIENT_SQLSTATES: &[&str] = &["57P01", "57P02", "57P03", "53300", "55006"];
const TRANSIENT_SQLSTATE_CLASSES: &[&str] = &["08"];
/// `object_in_use`: another process streams from the slot.
pub const SLOT_IN_USE: &str = "55006";
const INSUFFICIENT_PRIVILEGE: &str = "42501";
const INVALID_CATALOG_NAME: &str = "3D000";
const UNDEFINED_OBJECT: &str = "42704";

impl PgError {
    /// Whether a retry (a new connection, with backoff) can outlive this error.
    pub fn is_transient(&self) -> bool {
        match self {
            PgError::Connect { .. }
            | PgError::ConnectTimeout { .. }
            | PgError::Io(_)
            | PgError::Closed { .. }
            | PgError::NoPrimary { .. } => true,
            PgError::Db(db) => {
                TRANSIENT_SQLSTATES.contains(&db.code.as_str())
                    || TRANSIENT_SQLSTATE_CLASSES
                        .iter()
                        .any(|class| db.code.starts_with(class))
            }
            PgError::Authentication { .. }
            | PgError::Protocol(_)
            | PgError::NotPostgres { .. }
            | PgError::TlsConfig(_)
            | PgError::Tls { .. }
            | PgError::Frame(_) => false,
        }
    }
}

/// Whether a notice on the replication stream says PostgreSQL is skipping changes
/// because the publication is missing. PostgreSQL 18 no longer fails when a publication
/// named in START_REPLICATION does not exist at a point of the WAL: pgoutput sends
/// `WARNING: skipped loading publication "name"` and leaves out every change of that
/// part of the WAL, outbox inserts included (up to 17 it is an ERROR, 42704). The
/// relay must stop there, before it acknowledges past the skipped rows. Matched on the
/// publication's name (an identifier, never translated) in a WARNING, not on the
/// wording.
pub fn skips_publication(notice: &DbError, publication: &str) -> bool {
    notice.severity == "WARNING" && notice.message.contains(&format!("\"{publication}\""))
}

/// What the catalogs say, asked after a definite-looking failure.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerFacts {
    pub in_recovery: bool,
    /// The role has REPLICATION (or is a superuser).
    pub may_replicate: bool,
    /// The slot, when it exists: its `wal_status` and `invalidation_reason`.
    pub slot: Option<SlotFacts>,
    pub publication_exists: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlotFacts {
    pub wal_status: Option<String>,
    pub invalidation_reason: Option<String>,
}

/// Ask the server on a fresh session (the failed one may be gone). `Err` when even that
/// session fails: its own error, classified by SQLSTATE.
pub async fn server_facts(
    connect: &ConnectParams,
    spec: &SourceSpec,
) -> Result<ServerFacts, PgError> {
    let mut conn = PgConnection::connect(connect, SessionKind::Sql).await?;
    let slot = quote_literal(&spec.slot);
    // wal_status exists from PostgreSQL 13 on, invalidation_reason from 17 on (read
    // through jsonb: NULL before 17 instead of failing).
    let facts = conn
        .simple_query(&format!(
            "SELECT pg_catalog.pg_is_in_recovery() AS in_recovery, \
                    (SELECT r.rolreplication OR r.rolsuper FROM pg_catalog.pg_roles r \
                      WHERE r.rolname = current_user) AS may_replicate, \
                    EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = {slot}) AS slot_exists, \
                    (SELECT wal_status FROM pg_catalog.pg_replication_slots WHERE slot_name = {slot}) AS wal_status, \
                    (SELECT pg_catalog.to_jsonb(s) ->> 'invalidation_reason' \
                       FROM pg_catalog.pg_replication_slots s WHERE slot_name = {slot}) AS invalidation_reason, \
                    EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = {}) AS publication_exists",
            quote_literal(&spec.publication)
        ))
        .await;
    conn.close(std::time::Duration::from_secs(1)).await;
    let facts = facts?;
    let yes = |column| facts.get(0, column) == Some("t");
    Ok(ServerFacts {
        in_recovery: yes("in_recovery"),
        may_replicate: yes("may_replicate"),
        slot: yes("slot_exists").then(|| SlotFacts {
            wal_status: facts.get(0, "wal_status").map(str::to_owned),
            invalidation_reason: facts.get(0, "invalidation_reason").map(str::to_owned),
        }),
        publication_exists: yes("publication_exists"),
    })
}

/// Classify a failure met while connecting, preparing or streaming: pure. `facts` are
/// what [`server_facts`] found (or why it could not ask); transient errors come back
/// unchanged, without facts.
pub fn classify(
    error: PgError,
    facts: Option<Result<ServerFacts, PgError>>,
    spec: &SourceSpec,
    user: &str,
) -> SetupError {
    if error.is_transient() {
        return error.into();
    }
    let PgError::Db(db) = &error else {
        return error.into();
    };
    let publication_missing = |exists_now| SetupError::PublicationMissing {
        publication: spec.publication.clone(),
        tables: spec.tables.clone(),
        slot: spec.slot.clone(),
        exists_now,
        server_said: db.message.clone(),
    };
    match facts {
        Some(Ok(facts)) => {
            if facts.in_recovery && !spec.decode_on_standby {
                return SetupError::InRecovery;
            }
            if !facts.may_replicate {
                return SetupError::NoReplicationPrivilege {
                    user: user.to_owned(),
                };
            }
            match &facts.slot {
                Some(slot) if slot.wal_status.as_deref() == Some("lost") => {
                    return SetupError::SlotInvalidated {
                        slot: spec.slot.clone(),
                        reason: slot.invalidation_reason.clone(),
                    }
                }
                None => {
                    return SetupError::SlotMissing {
                        slot: spec.slot.clone(),
                    }
                }
                Some(_) => {}
            }
            if !facts.publication_exists {
                return publication_missing(false);
            }
            // The publication exists now, yet the stream says it is missing (the ERROR
            // of 13-17, the WARNING of 18): the slot reads WAL from before it.
            if db.code == UNDEFINED_OBJECT || skips_publication(db, &spec.publication) {
                return publication_missing(true);
            }
        }
        // The fresh session itself was refused for a definite reason.
        Some(Err(PgError::Db(refused))) if !PgError::Db(refused.clone()).is_transient() => {
            return by_sqlstate(&refused, user).unwrap_or_else(|| error.into());
        }
        Some(Err(_)) | None => {}
    }
    if skips_publication(db, &spec.publication) {
        return publication_missing(false);
    }
    by_sqlstate(db, user).unwrap_or_else(|| error.into())
}

/// Definite errors known by their SQLSTATE alone.
fn by_sqlstate(db: &DbError, user: &str) -> Option<SetupError> {
    match db.code.as_str() {
        INSUFFICIENT_PRIVILEGE => Some(SetupError::PermissionDenied {
            user: user.to_owned(),
            message: db.message.clone(),
        }),
        INVALID_CATALOG_NAME => Some(SetupError::DatabaseMissing {
            message: db.message.clone(),
        }),
        _ => None,
    }
}

/// [`classify`] after asking the server, for errors that are not transient.
pub async fn explain(error: PgError, connect: &ConnectParams, spec: &SourceSpec) -> SetupError {
    let facts = match &error {
        PgError::Db(_) if !error.is_transient() => Some(server_facts(connect, spec).await),
        _ => None,
    };
    classify(error, facts, spec, &connect.user)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::sql::QualifiedName;

    fn spec() -> SourceSpec {
        SourceSpec {
            slot: "outbox_relay".into(),
            publication: "outbox_relay".into(),
            tables: vec![QualifiedName::parse("public.outbox").unwrap()],
            patterns: Vec::new(),
            state_table: QualifiedName::parse("public.outbox_relay_state").unwrap(),
            failover: true,
            messages: false,
            decode_on_standby: false,
        }
    }

    fn db(severity: &str, code: &str, message: &str) -> DbError {
        DbError {
            severity: severity.into(),
            code: code.into(),
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    fn error(code: &str) -> PgError {
        // The wording is irrelevant to the classification: a translated server says
        // something else entirely.
        PgError::Db(db("ERROR", code, "ein Fehler"))
    }

    fn healthy() -> ServerFacts {
        ServerFacts {
            in_recovery: false,
            may_replicate: true,
            slot: Some(SlotFacts {
                wal_status: Some("reserved".into()),
                invalidation_reason: None,
            }),
            publication_exists: true,
        }
    }

    fn classified(code: &str, facts: ServerFacts) -> SetupError {
        classify(error(code), Some(Ok(facts)), &spec(), "app")
    }

    #[test]
    fn transient_errors_are_not_diagnosed() {
        for code in ["57P01", "57P02", "57P03", "53300", "55006", "08006"] {
            let setup = classify(error(code), None, &spec(), "app");
            assert!(setup.is_transient(), "{code}: {setup:?}");
        }
        let io = PgError::Io(std::io::Error::other("reset"));
        assert!(classify(io, None, &spec(), "app").is_transient());
    }

    #[test]
    fn the_catalogs_name_the_failure_whatever_the_wording() {
        let recovering = ServerFacts {
            in_recovery: true,
            ..healthy()
        };
        let setup = classified("0A000", recovering);
        assert!(matches!(setup, SetupError::InRecovery) && setup.is_transient());

        let no_replication = ServerFacts {
            may_replicate: false,
            ..healthy()
        };
        let text = classified("42501", no_replication).to_string();
        assert!(
            text.contains("ALTER ROLE \"app\" WITH REPLICATION"),
            "{text}"
        );

        let lost = ServerFacts {
            slot: Some(SlotFacts {
                wal_status: Some("lost".into()),
                invalidation_reason: Some("idle_timeout".into()),
            }),
            ..healthy()
        };
        let setup = classified("55000", lost);
        assert!(!setup.is_transient());
        let text = setup.to_string();
        for needle in [
            "is invalidated",
            "idle_replication_slot_timeout",
            "pg_drop_replication_slot('outbox_relay')",
            "--accept-gap",
            "backfill",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }

        let gone = ServerFacts {
            slot: None,
            ..healthy()
        };
        assert!(classified("42704", gone).is_transient());

        let no_publication = ServerFacts {
            publication_exists: false,
            ..healthy()
        };
        let text = classified("42704", no_publication).to_string();
        assert!(
            text.contains("publication \"outbox_relay\" does not exist (PostgreSQL: ein Fehler);"),
            "{text}"
        );
        assert!(text.contains("CREATE PUBLICATION"), "{text}");

        let text = classified("42704", healthy()).to_string();
        assert!(text.contains("created after that point"), "{text}");
        assert!(text.contains("--accept-gap"), "{text}");
    }

    #[test]
    fn without_facts_the_sqlstate_decides() {
        let refused = PgError::Db(db("FATAL", "42501", "permission denied for database app"));
        let setup = classify(error("XX000"), Some(Err(refused)), &spec(), "app");
        assert!(
            matches!(&setup, SetupError::PermissionDenied { message, .. } if message.contains("database app")),
            "{setup:?}"
        );
        let setup = classify(error("3D000"), None, &spec(), "app");
        assert!(
            matches!(setup, SetupError::DatabaseMissing { .. }),
            "{setup:?}"
        );
        let setup = classify(error("XX000"), None, &spec(), "app");
        assert!(matches!(setup, SetupError::Pg(_)) && !setup.is_transient());
    }

    #[test]
    fn a_skipped_publication_warning_stops_like_the_error_of_older_versions() {
        // As PostgreSQL 18 sends it in the middle of the stream.
        let warning = DbError {
            detail: Some("The publication does not exist at this point in the WAL.".into()),
            ..db(
                "WARNING",
                "55000",
                "skipped loading publication \"outbox_relay\"",
            )
        };
        assert!(skips_publication(&warning, "outbox_relay"));
        assert!(
            !skips_publication(&warning, "outbox"),
            "another publication's name"
        );
        let notice = DbError {
            severity: "NOTICE".into(),
            ..warning.clone()
        };
        assert!(!skips_publication(&notice, "outbox_relay"));
        let no_publication = ServerFacts {
            publication_exists: false,
            ..healthy()
        };
        let text = classify(
            PgError::Db(warning.clone()),
            Some(Ok(no_publication)),
            &spec(),
            "app",
        )
        .to_string();
        assert!(text.contains("CREATE PUBLICATION"), "{text}");
        // Recreated since: the slot still reads WAL from before it.
        let text = classify(PgError::Db(warning), Some(Ok(healthy())), &spec(), "app").to_string();
        assert!(text.contains("created after that point"), "{text}");
    }
}
