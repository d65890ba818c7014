//! The outbox table and its publication, as [`super::prepare`] and `slot create` find
//! or make them: the table must exist and be a table (partitioned only where
//! PostgreSQL 13+ can publish it under its root's name), and the publication must
//! exist, publish inserts, and cover exactly what the relay reads (the outbox, or no
//! table for a messages-only relay). Apart from the slot's own steps because it is a
//! different object with its own failure messages; it imports nothing from `slot.rs`.

use crate::pg::conn::{PgConnection, PgError, QueryResult};
use crate::pg::diagnose::SetupError;
use crate::pg::source::{OutboxRelation, SourceSpec, TablePattern};
use crate::pg::sql::{quote_ident, quote_literal, QualifiedName};

fn definite(message: impl Into<String>) -> SetupError {
    SetupError::Definite(message.into())
}

/// `spec` with the tables its patterns match now appended to its tables (sorted by
/// schema; a table already listed is not listed again). Without patterns, `spec` as it
/// is, without a query.
pub async fn resolve_tables(
    conn: &mut PgConnection,
    spec: &SourceSpec,
) -> Result<SourceSpec, PgError> {
    let mut resolved = spec.clone();
    for found in matching_tables(conn, &spec.patterns).await? {
        if !resolved.tables.contains(&found) {
            resolved.tables.push(found);
        }
    }
    Ok(resolved)
}

/// The tables (and partitioned tables) that `patterns` match now, sorted by schema.
pub async fn matching_tables(
    conn: &mut PgConnection,
    patterns: &[TablePattern],
) -> Result<Vec<QualifiedName>, PgError> {
    let mut found = Vec::new();
    for pattern in patterns {
        let rows = conn
            .simple_query(&format!(
                "SELECT n.nspname AS schema, c.relname AS name \
                   FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                  WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition \
                    AND c.relname = {} AND n.nspname LIKE {} ESCAPE '\\' \
                  ORDER BY n.nspname",
                quote_literal(&pattern.name),
                quote_literal(&pattern.schema_like())
            ))
            .await?;
        for row in 0..rows.rows.len() {
            let table = QualifiedName {
                schema: rows.get(row, "schema").unwrap_or_default().to_owned(),
                name: rows.get(row, "name").unwrap_or_default().to_owned(),
            };
            // LIKE's idea of a match and the glob's agree; the glob decides.
            if pattern.matches(&table.schema, &table.name) && !found.contains(&table) {
                found.push(table);
            }
        }
    }
    Ok(found)
}

/// Every outbox table's relation id and whether it is partitioned, in the spec's order.
pub(super) async fn outbox_relations(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    server_version: &str,
    version_num: u32,
) -> Result<Vec<OutboxRelation>, SetupError> {
    let mut found = Vec::with_capacity(spec.tables.len());
    for table in &spec.tables {
        found.push(outbox_relation(conn, table, server_version, version_num).await?);
    }
    Ok(found)
}

async fn outbox_relation(
    conn: &mut PgConnection,
    table: &QualifiedName,
    server_version: &str,
    version_num: u32,
) -> Result<OutboxRelation, SetupError> {
    let exists = conn
        .simple_query(&format!(
            "SELECT c.oid, c.relkind FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {} AND c.relname = {}",
            quote_literal(&table.schema),
            quote_literal(&table.name)
        ))
        .await?;
    if exists.rows.is_empty() {
        return Err(definite(format!(
            "outbox table {table} does not exist in this database: create it (sql/outbox.sql has the default shape) or set [outbox] table to the right name"
        )));
    }
    let oid: u32 = exists
        .get(0, "oid")
        .and_then(|oid| oid.parse().ok())
        .ok_or_else(|| definite(format!("PostgreSQL returned no relation id for {table}")))?;
    let relkind = exists.get(0, "relkind").unwrap_or_default();
    let partitioned = match relkind {
        "r" => false,
        "p" => true,
        other => {
            return Err(definite(format!(
                "{table} is not a table (pg_class.relkind {other:?}): the outbox must be a table or a partitioned table"
            )))
        }
    };
    if partitioned && version_num < 130_000 {
        return Err(definite(format!(
            "{table} is partitioned, and PostgreSQL {server_version} cannot publish a partitioned table's rows under its root's name (publish_via_partition_root needs PostgreSQL 13 or later): upgrade PostgreSQL, or use an unpartitioned outbox"
        )));
    }
    Ok(OutboxRelation {
        table: table.clone(),
        oid,
        partitioned,
    })
}

/// The `CREATE PUBLICATION` the relay runs (and tells a user to run): every outbox
/// table, inserts only and, when an outbox is partitioned, rows published under the
/// root's name so the stream names the outbox, not its partitions.
pub fn create_publication_sql(spec: &SourceSpec, partitioned: bool) -> String {
    let options = if partitioned {
        "publish = 'insert', publish_via_partition_root = true"
    } else {
        "publish = 'insert'"
    };
    if spec.tables.is_empty() {
        // Table-less: pgoutput needs a publication to start, and this one publishes no
        // table; messages are not filtered by publication. (Or only patterns, none of
        // whose tables exists yet: the relay adds them as they appear.)
        return format!(
            "CREATE PUBLICATION {} WITH ({options})",
            quote_ident(&spec.publication)
        );
    }
    let tables: Vec<String> = spec.tables.iter().map(QualifiedName::quoted).collect();
    format!(
        "CREATE PUBLICATION {} FOR TABLE {} WITH ({options})",
        quote_ident(&spec.publication),
        tables.join(", ")
    )
}

pub(super) async fn ensure_publication(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    partitioned: bool,
) -> Result<bool, SetupError> {
    let publication = &spec.publication;
    let table = spec.tables_shown();
    // pubviaroot exists from PostgreSQL 13 on; a partitioned outbox needs 13 (checked
    // before), an unpartitioned one does not care.
    let via_root = if partitioned {
        "pubviaroot"
    } else {
        "false AS pubviaroot"
    };
    let found = conn
        .simple_query(&format!(
            "SELECT pubinsert, {via_root} FROM pg_catalog.pg_publication WHERE pubname = {}",
            quote_literal(publication)
        ))
        .await?;
    let create = create_publication_sql(spec, partitioned);
    if found.rows.is_empty() {
        return match conn.simple_query(&create).await {
            Ok(_) => {
                tracing::info!(%publication, %table, "created publication");
                Ok(true)
            }
            Err(PgError::Db(db)) if db.code == "42501" => Err(definite(format!(
                "publication {publication:?} does not exist and this role may not create it ({}): run `{create}` as the owner of {table} (creating a publication needs ownership of the table and CREATE on the database)",
                db.message
            ))),
            Err(e) => Err(e.into()),
        };
    }
    if found.get(0, "pubinsert") != Some("t") {
        return Err(definite(format!(
            "publication {publication:?} does not publish inserts: run ALTER PUBLICATION {} SET (publish = 'insert')",
            quote_ident(publication)
        )));
    }
    if partitioned && found.get(0, "pubviaroot") != Some("t") {
        return Err(definite(format!(
            "publication {publication:?} publishes the partitioned outbox (of {table}) under its partitions' names, so the relay would not see its rows as events: run ALTER PUBLICATION {} SET (publish_via_partition_root = true), then restart the relay",
            quote_ident(publication)
        )));
    }
    if !spec.outbox() {
        let tables = read_publication_tables(
            conn,
            &format!(
                "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = {} LIMIT 1",
                quote_literal(publication)
            ),
        )
        .await?;
        if let (Some(schema), Some(name)) =
            (tables.get(0, "schemaname"), tables.get(0, "tablename"))
        {
            return Err(definite(format!(
                "publication {publication:?} publishes table {schema}.{name}, and [outbox] enabled = false relays only messages: the relay would stop at its first insert. Use a publication without tables (CREATE PUBLICATION {} WITH (publish = 'insert') under another name, set as [postgres] publication), or drop the tables from it",
                quote_ident(&format!("{publication}_messages"))
            )));
        }
        return Ok(false);
    }
    let mut missing = Vec::new();
    for table in &spec.tables {
        if spec.from_pattern(table) {
            // The relay adds its patterns' tables itself.
            join_publication(conn, publication, table).await?;
        } else if !is_published(conn, publication, table).await? {
            missing.push(table);
        }
    }
    if !missing.is_empty() {
        let shown: Vec<String> = missing.iter().map(ToString::to_string).collect();
        let quoted: Vec<String> = missing.iter().map(|t| t.quoted()).collect();
        let what = if missing.len() == 1 {
            "the outbox table"
        } else {
            "the outbox tables"
        };
        return Err(definite(format!(
            "publication {publication:?} does not include {what} {}: run ALTER PUBLICATION {} ADD TABLE {}. Rows committed to {} before that are not in the stream (PostgreSQL decodes a row with the publication as it was when the row was written): `outbox-relay backfill` sends those still in the table",
            shown.join(", "),
            quote_ident(publication),
            quoted.join(", "),
            if missing.len() == 1 { "it" } else { "them" },
        )));
    }
    Ok(false)
}

/// How many times a read of `pg_publication_tables` is made at most when tables it
/// listed were dropped before it opened them.
const PUBLICATION_READS: u32 = 10;

/// Runs `sql`, a query that reads `pg_publication_tables`, and runs it again when a
/// table dropped meanwhile failed it. PostgreSQL 16 and later open every table the
/// view lists (to list its columns), after listing them: a table dropped in between (a
/// tenant's outbox of a pattern, offboarded while the relay runs) fails the whole query
/// with "could not open relation with OID …" (SQLSTATE `XX000`), although nothing is
/// wrong. That open waited for the drop's lock, so the drop has committed, and the
/// next read lists the tables without it.
pub async fn read_publication_tables(
    conn: &mut PgConnection,
    sql: &str,
) -> Result<QueryResult, PgError> {
    let mut reads = 1;
    loop {
        match conn.simple_query(sql).await {
            Err(error) if reads < PUBLICATION_READS && dropped_while_listed(&error) => {
                tracing::debug!(%error, "a table of the publication was dropped while the publication was read: reading it again");
                reads += 1;
            }
            result => return result,
        }
    }
}

/// The error of a read of `pg_publication_tables` that a table dropped meanwhile failed
/// (see [`read_publication_tables`]).
fn dropped_while_listed(error: &PgError) -> bool {
    matches!(error, PgError::Db(db)
        if db.code == "XX000" && db.message.starts_with("could not open relation with OID "))
}

/// `pg_publication_tables` lists `table` in `publication` (under its own name).
pub async fn is_published(
    conn: &mut PgConnection,
    publication: &str,
    table: &QualifiedName,
) -> Result<bool, PgError> {
    let found = read_publication_tables(
        conn,
        &format!(
            "SELECT 1 FROM pg_catalog.pg_publication_tables WHERE pubname = {} AND schemaname = {} AND tablename = {}",
            quote_literal(publication),
            quote_literal(&table.schema),
            quote_literal(&table.name)
        ),
    )
    .await?;
    Ok(!found.rows.is_empty())
}

/// Adds a pattern's `table` to the publication unless it is in it already; logs the
/// position from which its rows are streamed. Rows committed to it before that
/// position are not in the stream, and the log says so: `outbox-relay backfill
/// --table` sends those still in the table.
pub async fn join_publication(
    conn: &mut PgConnection,
    publication: &str,
    table: &QualifiedName,
) -> Result<(), SetupError> {
    if is_published(conn, publication, table).await? {
        return Ok(());
    }
    let add = format!(
        "ALTER PUBLICATION {} ADD TABLE {}",
        quote_ident(publication),
        table.quoted()
    );
    match conn.simple_query(&add).await {
        Ok(_) => {}
        Err(PgError::Db(db)) if db.code == "42501" => {
            return Err(definite(format!(
                "outbox table {table} matches an [[outbox]] pattern but is not in publication {publication:?}, and this role may not add it ({}): its rows are not streamed. Run `{add}` as the owner of {table} (a tenant's provisioning can do it in the transaction that creates the table), then restart the relay; rows written to it before are sent with `outbox-relay backfill --since -infinity --table {table}`",
                db.message
            )))
        }
        Err(error) => return Err(error.into()),
    }
    let position = conn
        .simple_query("SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn")
        .await?;
    let joined_at = position.get(0, "lsn").unwrap_or("?").to_owned();
    tracing::warn!(
        %table,
        %publication,
        joined_at = %joined_at,
        "an outbox table of a pattern joined the publication: its rows are streamed from here on; rows committed to it before {joined_at} are not in the stream, send those still in the table with `outbox-relay backfill --since -infinity --table {table}`"
    );
    Ok(())
}
