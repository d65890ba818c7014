//! The preflight's findings for the table-less outbox (`[messages]`, `[outbox] enabled =
//! false`): the server can send messages (PostgreSQL 14+), and a messages-only relay's
//! publication publishes no table. Pure, as the other findings.

use super::facts::{not_checked, PgFacts};
use super::Finding;
use crate::pg::slot::{create_publication_sql, SourceSpec, MESSAGES_SINCE};
use crate::pg::sql::quote_ident;

/// `postgres.messages`: with `[messages]`, the server must be PostgreSQL 14 or later.
pub fn version(facts: &PgFacts, spec: &SourceSpec, out: &mut Vec<Finding>) {
    if !spec.messages {
        return;
    }
    let server = &facts.server;
    out.push(if server.version_num >= MESSAGES_SINCE {
        Finding::ok(
            "postgres.messages",
            format!(
                "PostgreSQL {} sends logical decoding messages (pgoutput messages option)",
                server.version
            ),
        )
    } else {
        Finding::problem(
            "postgres.messages",
            format!(
                "PostgreSQL {} cannot send logical decoding messages: pgoutput's messages option ([messages], the table-less outbox) needs PostgreSQL 14 or later",
                server.version
            ),
            "upgrade PostgreSQL, or remove [messages] (enabled = false) and relay an outbox table",
        )
    });
}

/// `outbox.table` and `postgres.publication` of a messages-only relay.
pub fn table_less(facts: &PgFacts, spec: &SourceSpec, out: &mut Vec<Finding>) {
    const ID: &str = "postgres.publication";
    out.push(Finding::ok(
        "outbox.table",
        "[outbox] enabled = false: no outbox table, messages only",
    ));
    let name = &spec.publication;
    let create = create_publication_sql(spec, false);
    let publication = match &facts.publication {
        Ok(publication) => publication,
        Err(e) => return out.push(not_checked(ID, e)),
    };
    out.push(match publication {
        None if facts.server.may_create_in_database || facts.server.superuser => Finding::ok(
            ID,
            format!("publication {name:?} does not exist; the relay will create it: {create}"),
        ),
        None => Finding::problem(
            ID,
            format!("publication {name:?} does not exist and the relay's role has no CREATE on the database, so it cannot create it"),
            format!("run `{create}` as a role with CREATE on the database"),
        ),
        Some(publication) if publication.all_tables || !publication.tables.is_empty() => {
            Finding::problem(
                ID,
                format!("publication {name:?} publishes tables, and a messages-only relay stops at the first insert it sends"),
                format!(
                    "use a publication without tables: {} under another name, set as [postgres] publication (or ALTER PUBLICATION {} DROP TABLE …)",
                    create.replacen(&quote_ident(name), &quote_ident(&format!("{name}_messages")), 1),
                    quote_ident(name)
                ),
            )
        }
        Some(_) => Finding::ok(ID, format!("publication {name:?} publishes no table (messages only)")),
    });
}
