//! The outbox table and its publication, as [`super::prepare`] and `slot create` find
//! or make them: the table must exist and be a table (partitioned only where
//! PostgreSQL 13+ can publish it under its root's name), and the publication must
//! exist, publish inserts, and cover exactly what the relay reads (the outbox, or no
//! table for a messages-only relay). Apart from the slot's own steps because it is a
//! different object with its own failure messages; it imports nothing from `slot.rs`.

use crate::pg::conn::{PgConnection, PgError};
use crate::pg::diagnose::SetupError;
use crate::pg::source::SourceSpec;
use crate::pg::sql::{quote_ident, quote_literal};

fn definite(message: impl Into<String>) -> SetupError {
    SetupError::Definite(message.into())
}

/// The outbox table's relation id and whether it is partitioned.
pub(super) async fn outbox_relation(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    server_version: &str,
    version_num: u32,
) -> Result<(u32, bool), SetupError> {
    let table = &spec.table;
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
    let outbox_oid: u32 = exists
        .get(0, "oid")
        .and_then(|oid| oid.parse().ok())
        .ok_or_else(|| definite(format!("PostgreSQL returned no relation id for {table}")))?;
    let relkind = exists.get(0, "relkind").unwrap_or_default();
    let outbox_partitioned = match relkind {
        "r" => false,
        "p" => true,
        other => {
            return Err(definite(format!(
                "{table} is not a table (pg_class.relkind {other:?}): the outbox must be a table or a partitioned table"
            )))
        }
    };
    if outbox_partitioned && version_num < 130_000 {
        return Err(definite(format!(
            "{table} is partitioned, and PostgreSQL {server_version} cannot publish a partitioned table's rows under its root's name (publish_via_partition_root needs PostgreSQL 13 or later): upgrade PostgreSQL, or use an unpartitioned outbox"
        )));
    }

    Ok((outbox_oid, outbox_partitioned))
}

/// The `CREATE PUBLICATION` the relay runs (and tells a user to run): inserts only and,
/// for a partitioned outbox, rows published under the root's name so the stream names
/// the outbox, not its partitions.
pub fn create_publication_sql(spec: &SourceSpec, partitioned: bool) -> String {
    let options = if partitioned {
        "publish = 'insert', publish_via_partition_root = true"
    } else {
        "publish = 'insert'"
    };
    if !spec.outbox {
        // Table-less: pgoutput needs a publication to start, and this one publishes no
        // table; messages are not filtered by publication.
        return format!(
            "CREATE PUBLICATION {} WITH ({options})",
            quote_ident(&spec.publication)
        );
    }
    format!(
        "CREATE PUBLICATION {} FOR TABLE {} WITH ({options})",
        quote_ident(&spec.publication),
        spec.table.quoted()
    )
}

pub(super) async fn ensure_publication(
    conn: &mut PgConnection,
    spec: &SourceSpec,
    partitioned: bool,
) -> Result<bool, SetupError> {
    let publication = &spec.publication;
    let table = &spec.table;
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
            "publication {publication:?} publishes the partitioned outbox {table} under its partitions' names, so the relay would not see its rows as events: run ALTER PUBLICATION {} SET (publish_via_partition_root = true), then restart the relay",
            quote_ident(publication)
        )));
    }
    if !spec.outbox {
        let tables = conn
            .simple_query(&format!(
                "SELECT schemaname, tablename FROM pg_catalog.pg_publication_tables WHERE pubname = {} LIMIT 1",
                quote_literal(publication)
            ))
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
    let includes = conn
        .simple_query(&format!(
            "SELECT 1 FROM pg_catalog.pg_publication_tables WHERE pubname = {} AND schemaname = {} AND tablename = {}",
            quote_literal(publication),
            quote_literal(&table.schema),
            quote_literal(&table.name)
        ))
        .await?;
    if includes.rows.is_empty() {
        return Err(definite(format!(
            "publication {publication:?} does not include the outbox table {table}: run ALTER PUBLICATION {} ADD TABLE {}",
            quote_ident(publication),
            table.quoted()
        )));
    }
    Ok(false)
}
