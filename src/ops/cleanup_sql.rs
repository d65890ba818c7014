//! SQL of `outbox-relay cleanup`: pure. Deletes outbox rows older than a cutoff that the
//! slot has provably passed, in short batches, and drops whole partitions of a
//! partitioned outbox.
//!
//! "Provably passed": cleanup takes a snapshot `S` and the WAL insert position `C` at
//! the same moment, and waits until the slot's `confirmed_flush_lsn` reaches `C`. Every
//! transaction visible in `S` committed before `C`, so the relay has acknowledged it
//! (its events are in Kafka). Each batch then deletes only rows whose inserting
//! transaction is visible in `S` ([`visible_in_snapshot`]), whatever their age: a
//! transaction still open at `S` is never touched, even if it began before the cutoff.
//!
//! ```text
//! snapshot S, position C ──▶ wait: slot ≥ C (else refuse: the relay lags)
//!        ──▶ leaves of the outbox: whole old partitions dropped (bound ≤ cutoff, every
//!            row passed), then DELETE … LIMIT batch in short transactions per leaf
//! ```

use crate::pg::sql::{quote_literal, QualifiedName};

/// `xmin` of a row as a full 64-bit transaction id (`xid8`), for
/// `pg_visible_in_snapshot`. PostgreSQL 13+ has no cast from `xid` to `xid8`: the epoch
/// comes from the current transaction's id (no row's `xmin` is newer, and an `xmin`
/// above the current id's low 32 bits is from the previous epoch). Ids below 3
/// (bootstrap, frozen) are visible to every snapshot.
fn xmin_visible_in(snapshot: &str) -> String {
    format!(
        "(xmin::text::bigint < 3 OR pg_catalog.pg_visible_in_snapshot(\
         (CASE WHEN xmin::text::bigint <= (pg_catalog.pg_current_xact_id()::text::bigint & 4294967295) \
               THEN ((pg_catalog.pg_current_xact_id()::text::bigint >> 32) << 32) | xmin::text::bigint \
               ELSE (((pg_catalog.pg_current_xact_id()::text::bigint >> 32) - 1) << 32) | xmin::text::bigint \
          END)::text::xid8, {}::pg_snapshot))",
        quote_literal(snapshot)
    )
}

/// The condition a row must meet to be deleted.
pub fn visible_in_snapshot(snapshot: &str, column: &str, cutoff: &str) -> String {
    format!(
        "{} < {}::timestamptz AND {}",
        crate::pg::sql::quote_ident(column),
        quote_literal(cutoff),
        xmin_visible_in(snapshot)
    )
}

/// Snapshot, position and cutoff, taken at one moment. The position is the WAL *insert*
/// position: a transaction committed with `synchronous_commit = off` is visible before
/// its commit record is written, and must still be covered.
pub fn start_sql(older_than: &str) -> String {
    format!(
        "SELECT pg_catalog.pg_current_snapshot()::text AS snapshot, \
                pg_catalog.pg_current_wal_insert_lsn()::text AS position, \
                (now() - {}::interval)::text AS cutoff",
        quote_literal(older_than)
    )
}

/// The leaves of `table` (itself when not partitioned: `pg_partition_tree` lists nothing
/// for a plain table), with the upper bound of each range partition (NULL for the
/// DEFAULT partition and for a plain table).
pub fn leaves_sql(table: &QualifiedName) -> String {
    let table = quote_literal(&table.quoted());
    format!(
        "SELECT n.nspname AS schema, c.relname AS name, \
                substring(pg_catalog.pg_get_expr(c.relpartbound, c.oid) FROM 'TO \\(''([^'']*)''\\)') AS upper_bound \
           FROM pg_catalog.pg_class c \
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
          WHERE c.relkind = 'r' \
            AND (c.oid = {table}::regclass \
                 OR c.oid IN (SELECT relid FROM pg_catalog.pg_partition_tree({table}::regclass) WHERE isleaf)) \
          ORDER BY 1, 2"
    )
}

/// Whether a whole partition may be dropped: its range ends at or before the cutoff, and
/// every row in it was passed.
pub fn partition_droppable_sql(
    leaf: &QualifiedName,
    upper_bound: &str,
    snapshot: &str,
    cutoff: &str,
) -> String {
    format!(
        "SELECT {}::timestamptz <= {}::timestamptz \
                AND NOT EXISTS (SELECT 1 FROM {} WHERE NOT {}) AS droppable",
        quote_literal(upper_bound),
        quote_literal(cutoff),
        leaf.quoted(),
        xmin_visible_in(snapshot)
    )
}

/// One batch: delete up to `batch` passed rows older than the cutoff from `leaf` (a
/// table, so `ctid` identifies a row); answers with the count as `deleted`.
pub fn delete_batch_sql(
    leaf: &QualifiedName,
    column: &str,
    snapshot: &str,
    cutoff: &str,
    batch: u32,
) -> String {
    format!(
        "WITH deleted AS (DELETE FROM {leaf} WHERE ctid = ANY (ARRAY(SELECT ctid FROM {leaf} WHERE {} LIMIT {batch})) RETURNING 1) \
         SELECT count(*) AS deleted FROM deleted",
        visible_in_snapshot(snapshot, column, cutoff),
        leaf = leaf.quoted(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_deletes_only_old_rows_of_transactions_in_the_snapshot() {
        let leaf = QualifiedName::parse("public.outbox").unwrap();
        let sql = delete_batch_sql(
            &leaf,
            "created_at",
            "10:20:10,12",
            "2026-11-24 00:00:00+00",
            500,
        );
        assert!(
            sql.contains("DELETE FROM \"public\".\"outbox\" WHERE ctid = ANY"),
            "{sql}"
        );
        assert!(
            sql.contains("\"created_at\" < '2026-11-24 00:00:00+00'::timestamptz"),
            "{sql}"
        );
        assert!(sql.contains("'10:20:10,12'::pg_snapshot"), "{sql}");
        assert!(sql.contains("LIMIT 500)) RETURNING 1)"), "{sql}");
    }

    #[test]
    fn values_are_quoted() {
        let sql = start_sql("7 days'); DROP TABLE x; --");
        assert!(
            sql.contains("'7 days''); DROP TABLE x; --'::interval"),
            "{sql}"
        );
    }
}
