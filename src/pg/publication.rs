//! What "the publication publishes the outbox" means, as a value that can be compared:
//! the outbox's relation id, the publication's id and options, and the membership row
//! that puts the table in it. Pure: the query text, parsing its row, and comparing two
//! readings. The relay reads it on a side connection while it streams
//! (the relay's outbox watch, `relay::watch`).
//!
//! Why ids and not names: `ALTER TABLE outbox RENAME TO outbox_old; CREATE TABLE outbox
//! (LIKE outbox_old)` keeps the names in place but leaves the new table out of a
//! `FOR TABLE` publication; `ALTER PUBLICATION … DROP TABLE` followed by `ADD TABLE`
//! keeps the membership but loses the rows written in between. The first changes the
//! relation id behind the name, the second the id of the `pg_publication_rel` row, so
//! comparing ids sees both, however quickly they happen.

use std::fmt;

use crate::pg::conn::QueryResult;
use crate::pg::sql::{quote_ident, quote_literal, QualifiedName};

/// One reading of how the publication covers the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicationIdentity {
    /// The relation id the outbox's name resolves to now (`None`: no such table).
    pub table_oid: Option<u32>,
    /// The publication's id (`None`: no such publication).
    pub publication_oid: Option<u32>,
    pub publishes_insert: bool,
    pub via_root: bool,
    pub all_tables: bool,
    /// Ids of the `pg_publication_rel` rows naming the outbox (`FOR TABLE`), or of the
    /// `pg_publication_namespace` rows naming its schema (`FOR TABLES IN SCHEMA`).
    pub membership: String,
    /// `pg_publication_tables` lists the outbox under its own name.
    pub published: bool,
}

/// The query that reads a [`PublicationIdentity`] of each table, one row each in the
/// tables' order (`ord`), in one round trip and one snapshot; with no table (a
/// messages-only relay) one row that reads the publication alone. Set-based, so a
/// relay watching hundreds of tenants' tables expands the publication's tables
/// (`pg_publication_tables`) once per check, not once per table. Relation ids come from
/// the catalog, not `to_regclass`, which needs USAGE on a schema the relay's role need
/// not have. Runs on PostgreSQL 12 and later (`MATERIALIZED`): columns only newer
/// versions have are read through `to_jsonb` of the catalog row.
pub fn identities_query(publication: &str, tables: &[QualifiedName]) -> String {
    let wanted: Vec<String> = if tables.is_empty() {
        vec!["(0, NULL::name, NULL::name)".to_owned()]
    } else {
        tables
            .iter()
            .enumerate()
            .map(|(ord, table)| {
                format!(
                    "({ord}, {}::name, {}::name)",
                    quote_literal(&table.schema),
                    quote_literal(&table.name)
                )
            })
            .collect()
    };
    let publication = quote_literal(publication);
    format!(
        "WITH wanted (ord, schemaname, tablename) AS (VALUES {}), \
              p AS (SELECT * FROM pg_catalog.pg_publication WHERE pubname = {publication}), \
              published AS MATERIALIZED (SELECT t.schemaname, t.tablename \
                  FROM pg_catalog.pg_publication_tables t WHERE t.pubname = {publication}) \
         SELECT w.ord, \
                c.oid AS table_oid, \
                p.oid AS publication_oid, \
                p.pubinsert AS publishes_insert, \
                coalesce((pg_catalog.to_jsonb(p) ->> 'pubviaroot')::boolean, false) AS via_root, \
                p.puballtables AS all_tables, \
                (SELECT pg_catalog.string_agg(pr.oid::text, ',' ORDER BY pr.oid) \
                   FROM pg_catalog.pg_publication_rel pr \
                  WHERE pr.prpubid = p.oid AND pr.prrelid = c.oid) AS membership, \
                EXISTS (SELECT 1 FROM published t \
                         WHERE t.schemaname = w.schemaname AND t.tablename = w.tablename) AS published \
           FROM wanted w \
           LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = w.schemaname \
           LEFT JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = w.tablename \
           LEFT JOIN p ON true \
          ORDER BY w.ord",
        wanted.join(", ")
    )
}

impl PublicationIdentity {
    /// Parses the rows of [`identities_query`]: one per table (`expected`), in order.
    pub fn from_result(result: &QueryResult, expected: usize) -> Result<Vec<Self>, String> {
        if result.rows.len() != expected {
            return Err(format!(
                "the publication check returned {} rows, expected {expected}",
                result.rows.len()
            ));
        }
        (0..expected)
            .map(|row| Self::from_row(result, row))
            .collect()
    }

    fn from_row(result: &QueryResult, row: usize) -> Result<Self, String> {
        let oid = |column: &str| -> Result<Option<u32>, String> {
            result
                .get(row, column)
                .map(|text| {
                    text.parse()
                        .map_err(|_| format!("{column} is not an id: {text:?}"))
                })
                .transpose()
        };
        let flag = |column: &str| result.get(row, column) == Some("t");
        Ok(PublicationIdentity {
            table_oid: oid("table_oid")?,
            publication_oid: oid("publication_oid")?,
            publishes_insert: flag("publishes_insert"),
            via_root: flag("via_root"),
            all_tables: flag("all_tables"),
            membership: result.get(row, "membership").unwrap_or_default().to_owned(),
            published: flag("published"),
        })
    }
}

/// How the publication stopped covering the outbox as it did when the relay started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicationChange {
    PublicationDropped,
    PublicationReplaced,
    InsertsNoLongerPublished,
    PartitionRootNoLongerUsed,
    TableDropped,
    TableReplaced { was: u32, now: u32 },
    TableLeftPublication,
    MembershipReplaced,
}

impl PublicationChange {
    /// Compares a reading with the one taken when streaming began. `partitioned`: the
    /// outbox is published through its root, which must stay so.
    pub fn between(
        baseline: &PublicationIdentity,
        now: &PublicationIdentity,
        partitioned: bool,
    ) -> Option<PublicationChange> {
        if now.publication_oid.is_none() {
            return Some(PublicationChange::PublicationDropped);
        }
        if now.publication_oid != baseline.publication_oid {
            return Some(PublicationChange::PublicationReplaced);
        }
        if now.table_oid.is_none() {
            return Some(PublicationChange::TableDropped);
        }
        if let (Some(was), Some(now_oid)) = (baseline.table_oid, now.table_oid) {
            if was != now_oid {
                return Some(PublicationChange::TableReplaced { was, now: now_oid });
            }
        }
        if !now.publishes_insert {
            return Some(PublicationChange::InsertsNoLongerPublished);
        }
        if partitioned && !now.via_root {
            return Some(PublicationChange::PartitionRootNoLongerUsed);
        }
        if !now.published {
            return Some(PublicationChange::TableLeftPublication);
        }
        if now.membership != baseline.membership || now.all_tables != baseline.all_tables {
            return Some(PublicationChange::MembershipReplaced);
        }
        None
    }

    /// The repair, as SQL where one statement does it. `tables`: every outbox table of
    /// the relay (the publication must publish them all), `table`: the one that changed.
    pub fn repair(
        &self,
        publication: &str,
        tables: &[QualifiedName],
        table: Option<&QualifiedName>,
    ) -> String {
        let publication = quote_ident(publication);
        let table = table.map_or_else(|| "the outbox table".to_owned(), QualifiedName::quoted);
        match self {
            PublicationChange::PublicationDropped | PublicationChange::PublicationReplaced
                if tables.is_empty() =>
            {
                format!(
                    "make sure publication {publication} exists (CREATE PUBLICATION {publication} WITH (publish = 'insert'))"
                )
            }
            PublicationChange::PublicationDropped | PublicationChange::PublicationReplaced => {
                let all: Vec<String> = tables.iter().map(QualifiedName::quoted).collect();
                let all = all.join(", ");
                format!(
                    "make sure publication {publication} publishes inserts of {all} (CREATE PUBLICATION {publication} FOR TABLE {all} WITH (publish = 'insert'))"
                )
            }
            PublicationChange::InsertsNoLongerPublished => {
                format!("ALTER PUBLICATION {publication} SET (publish = 'insert')")
            }
            PublicationChange::PartitionRootNoLongerUsed => format!(
                "ALTER PUBLICATION {publication} SET (publish_via_partition_root = true)"
            ),
            PublicationChange::TableDropped => format!(
                "recreate {table} (or set [outbox] table to where the application writes now) and ALTER PUBLICATION {publication} ADD TABLE {table}"
            ),
            PublicationChange::TableReplaced { .. } | PublicationChange::TableLeftPublication => {
                format!("ALTER PUBLICATION {publication} ADD TABLE {table}")
            }
            PublicationChange::MembershipReplaced => format!(
                "check that {table} stays in publication {publication} (it was removed and added again)"
            ),
        }
    }
}

impl fmt::Display for PublicationChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PublicationChange::PublicationDropped => f.write_str("the publication was dropped"),
            PublicationChange::PublicationReplaced => {
                f.write_str("the publication was dropped and created again")
            }
            PublicationChange::InsertsNoLongerPublished => {
                f.write_str("the publication no longer publishes inserts")
            }
            PublicationChange::PartitionRootNoLongerUsed => f.write_str(
                "the publication no longer publishes the partitioned outbox through its root",
            ),
            PublicationChange::TableDropped => f.write_str("the outbox table was dropped or renamed"),
            PublicationChange::TableReplaced { was, now } => write!(
                f,
                "the outbox's name now belongs to another table (relation id {now}, was {was}): it was renamed or dropped and created again, and the new table is not the one the publication published"
            ),
            PublicationChange::TableLeftPublication => {
                f.write_str("the outbox table was removed from the publication")
            }
            PublicationChange::MembershipReplaced => {
                f.write_str("the outbox table was removed from the publication and added again")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn baseline() -> PublicationIdentity {
        PublicationIdentity {
            table_oid: Some(16400),
            publication_oid: Some(16410),
            publishes_insert: true,
            via_root: false,
            all_tables: false,
            membership: "16411".into(),
            published: true,
        }
    }

    #[test]
    fn the_same_reading_is_no_change() {
        assert_eq!(
            PublicationChange::between(&baseline(), &baseline(), false),
            None
        );
    }

    #[test]
    fn every_way_of_losing_the_outbox_is_seen() {
        type Edit = fn(&mut PublicationIdentity);
        let cases: Vec<(Edit, PublicationChange)> = vec![
            (
                |i| i.publication_oid = None,
                PublicationChange::PublicationDropped,
            ),
            (
                |i| i.publication_oid = Some(1),
                PublicationChange::PublicationReplaced,
            ),
            (|i| i.table_oid = None, PublicationChange::TableDropped),
            (
                |i| {
                    i.table_oid = Some(17000);
                    i.published = false;
                    i.membership.clear();
                },
                PublicationChange::TableReplaced {
                    was: 16400,
                    now: 17000,
                },
            ),
            (
                |i| i.publishes_insert = false,
                PublicationChange::InsertsNoLongerPublished,
            ),
            (
                |i| {
                    i.published = false;
                    i.membership.clear();
                },
                PublicationChange::TableLeftPublication,
            ),
            (
                |i| i.membership = "16999".into(),
                PublicationChange::MembershipReplaced,
            ),
        ];
        for (change, expected) in cases {
            let mut now = baseline();
            change(&mut now);
            assert_eq!(
                PublicationChange::between(&baseline(), &now, false),
                Some(expected.clone()),
                "{now:?}"
            );
            let table = QualifiedName::parse("public.outbox").unwrap();
            let repair =
                expected.repair("outbox_relay", std::slice::from_ref(&table), Some(&table));
            assert!(!repair.is_empty());
            assert!(!expected.to_string().is_empty());
        }
    }

    #[test]
    fn the_repair_names_the_table_that_changed_and_recreates_the_publication_for_all() {
        let tables = vec![
            QualifiedName::parse("t1.outbox").unwrap(),
            QualifiedName::parse("t2.outbox").unwrap(),
        ];
        let left = PublicationChange::TableLeftPublication.repair("p", &tables, Some(&tables[1]));
        assert_eq!(left, "ALTER PUBLICATION \"p\" ADD TABLE \"t2\".\"outbox\"");
        let dropped = PublicationChange::PublicationDropped.repair("p", &tables, None);
        assert!(
            dropped.contains("FOR TABLE \"t1\".\"outbox\", \"t2\".\"outbox\" WITH"),
            "{dropped}"
        );
        let alone = PublicationChange::PublicationDropped.repair("p", &[], None);
        assert!(
            alone.contains("CREATE PUBLICATION \"p\" WITH (publish = 'insert')"),
            "{alone}"
        );
    }

    #[test]
    fn a_partitioned_outbox_must_stay_published_through_its_root() {
        let mut start = baseline();
        start.via_root = true;
        let mut now = start.clone();
        now.via_root = false;
        assert_eq!(
            PublicationChange::between(&start, &now, true),
            Some(PublicationChange::PartitionRootNoLongerUsed)
        );
        assert_eq!(PublicationChange::between(&start, &now, false), None);
    }

    #[test]
    fn parses_the_row_and_refuses_garbage() {
        let result = QueryResult {
            columns: [
                "table_oid",
                "publication_oid",
                "publishes_insert",
                "via_root",
                "all_tables",
                "membership",
                "published",
            ]
            .map(String::from)
            .to_vec(),
            column_types: vec![26, 26, 16, 16, 16, 25, 16],
            rows: vec![vec![
                Some("16400".into()),
                Some("16410".into()),
                Some("t".into()),
                Some("f".into()),
                Some("f".into()),
                Some("16411".into()),
                Some("t".into()),
            ]],
        };
        assert_eq!(
            PublicationIdentity::from_result(&result, 1).unwrap(),
            vec![baseline()]
        );
        assert!(PublicationIdentity::from_result(&result, 2).is_err());
        let mut bad = result.clone();
        bad.rows[0][0] = Some("x".into());
        assert!(PublicationIdentity::from_result(&bad, 1).is_err());
        let mut empty = result;
        empty.rows.clear();
        assert!(PublicationIdentity::from_result(&empty, 1).is_err());
    }

    #[test]
    fn the_query_quotes_names() {
        let table = QualifiedName::parse("public.outbox").unwrap();
        let other = QualifiedName::parse("t1.outbox").unwrap();
        let sql = identities_query("pub'x", &[table, other]);
        assert!(sql.contains("'pub''x'"), "{sql}");
        assert!(
            sql.contains("(0, 'public'::name, 'outbox'::name), (1, 't1'::name, 'outbox'::name)"),
            "{sql}"
        );
        assert!(sql.ends_with("ORDER BY w.ord"), "{sql}");
        let alone = identities_query("p", &[]);
        assert!(
            alone.contains("VALUES (0, NULL::name, NULL::name)"),
            "{alone}"
        );
    }
}
