//! What the outbox watch compares, for one run of its task: the tables (growing as
//! patterns match new ones), the query that reads their identities, the comparison with
//! the baseline, and the discovery of a pattern's new tables. The task and its channels
//! are in `watch.rs`.

use crate::pg::conn::{PgConnection, PgError};
use crate::pg::diagnose::SetupError;
use crate::pg::publication::{identities_query, PublicationChange, PublicationIdentity};
use crate::pg::slot::{join_publication, matching_tables, read_publication_tables, wait_replayed};
use crate::pg::source::{OutboxRelation, TablePattern};
use crate::pg::sql::{quote_literal, QualifiedName};
use crate::pg::Lsn;

use super::primary::PrimarySide;
use super::WatchReport;

/// SQLSTATEs of a table, or its schema, that is not there (any more): `undefined_table`,
/// `invalid_schema_name`.
const GONE: [&str; 2] = ["42P01", "3F000"];

/// The first reading must find every outbox as the relay prepared it: the publication
/// there, the same relation id behind the outbox's name, and published. What changed
/// between the preparation and this reading otherwise, and for which outbox (reported
/// like any later change: the position from which rows may be missing is the start).
pub(super) fn first_reading_change(
    outboxes: &[OutboxRelation],
    identities: &[PublicationIdentity],
) -> Option<(PublicationChange, Option<QualifiedName>)> {
    outboxes
        .iter()
        .zip(identities)
        .find_map(|(outbox, identity)| {
            let change = match identity.table_oid {
                _ if identity.publication_oid.is_none() => PublicationChange::PublicationDropped,
                None => PublicationChange::TableDropped,
                Some(now) if now != outbox.oid => PublicationChange::TableReplaced {
                    was: outbox.oid,
                    now,
                },
                Some(_) if !identity.published => PublicationChange::TableLeftPublication,
                Some(_) => return None,
            };
            Some((change, Some(outbox.table.clone())))
        })
}

/// What the watch watches, for one run of the task: the tables (growing as patterns
/// match new ones), the patterns, and the query that reads them.
pub(super) struct Watched {
    publication: String,
    pub(super) outboxes: Vec<OutboxRelation>,
    patterns: Vec<TablePattern>,
    query: String,
}

impl Watched {
    pub(super) fn new(
        publication: String,
        outboxes: Vec<OutboxRelation>,
        patterns: Vec<TablePattern>,
    ) -> Self {
        let mut watched = Watched {
            publication,
            outboxes,
            patterns,
            query: String::new(),
        };
        watched.rebuild();
        watched
    }

    fn rebuild(&mut self) {
        let tables: Vec<QualifiedName> = self.outboxes.iter().map(|o| o.table.clone()).collect();
        self.query = identities_query(&self.publication, &tables);
    }

    /// One check: vouch for the position read first, or report the change. A pattern's
    /// table that was dropped (or replaced: its successor is found as a new table)
    /// leaves the set; tables the patterns match now and the set lacks join it.
    pub(super) async fn check(
        &mut self,
        conn: &mut PgConnection,
        primary: &mut PrimarySide,
        baseline: &mut Vec<PublicationIdentity>,
    ) -> WatchReport {
        let (lsn, mut now) = match self.read(conn).await {
            Ok(read) => read,
            Err(report) => return report,
        };
        let gone = self.gone_from_patterns(baseline, &now);
        if !gone.is_empty() {
            for index in gone.into_iter().rev() {
                let table = self.outboxes.remove(index).table;
                baseline.remove(index);
                now.remove(index);
                tracing::info!(%table, "an outbox table of a pattern was dropped: it leaves the relay's tables (its rows up to the drop were streamed)");
            }
            self.rebuild();
        }
        if let Some(first) = self.change(baseline, &now) {
            return self.settled(conn, baseline, first).await;
        }
        match self.discover(conn, primary).await {
            Ok(false) => {}
            Ok(true) => match self.read(conn).await {
                Ok((_, fresh)) => *baseline = fresh,
                Err(report) => return report,
            },
            Err(report) => return report,
        }
        WatchReport::Vouched(lsn)
    }

    /// Indices of the pattern tables dropped or replaced since `baseline`.
    fn gone_from_patterns(
        &self,
        baseline: &[PublicationIdentity],
        now: &[PublicationIdentity],
    ) -> Vec<usize> {
        self.outboxes
            .iter()
            .zip(baseline.iter().zip(now))
            .enumerate()
            .filter(|(_, (outbox, _))| {
                self.patterns
                    .iter()
                    .any(|p| p.matches(&outbox.table.schema, &outbox.table.name))
            })
            .filter(|(_, (outbox, (baseline, now)))| {
                matches!(
                    PublicationChange::between(baseline, now, outbox.partitioned),
                    Some(PublicationChange::TableDropped | PublicationChange::TableReplaced { .. })
                )
            })
            .map(|(index, _)| index)
            .collect()
    }

    /// Adds the tables the patterns match and the set lacks: to the publication (unless
    /// in it already; [`join_publication`] logs from where they are streamed) and to the
    /// set. Whether any joined. On a standby in recovery the table joins on the primary,
    /// and the standby's replay of that is awaited before its catalog is read again.
    async fn discover(
        &mut self,
        conn: &mut PgConnection,
        primary: &mut PrimarySide,
    ) -> Result<bool, WatchReport> {
        if self.patterns.is_empty() {
            return Ok(false);
        }
        let found = matching_tables(conn, &self.patterns)
            .await
            .map_err(WatchReport::Failed)?;
        let mut joined = false;
        for table in found {
            if self.outboxes.iter().any(|o| o.table == table) {
                continue;
            }
            let joining = match primary
                .for_writes(conn)
                .await
                .map_err(WatchReport::Failed)?
            {
                Some(on_primary) => {
                    match join_publication(on_primary, &self.publication, &table).await {
                        Ok(()) => wait_replayed(conn, on_primary).await,
                        failed => failed,
                    }
                }
                None => join_publication(conn, &self.publication, &table).await,
            };
            match joining {
                Ok(()) => {}
                // Dropped (or its schema) between the listing and the ALTER PUBLICATION,
                // which waited for the drop's lock: nothing to watch.
                Err(SetupError::Pg(PgError::Db(db))) if GONE.contains(&db.code.as_str()) => {
                    tracing::info!(%table, "an outbox table of a pattern was dropped as it was found: nothing to stream from it");
                    continue;
                }
                Err(SetupError::Pg(error)) => return Err(WatchReport::Failed(error)),
                Err(other) => return Err(WatchReport::Invalid(other.to_string())),
            }
            let relation = conn
                .simple_query(&format!(
                    "SELECT c.oid, c.relkind FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = {} AND c.relname = {}",
                    quote_literal(&table.schema),
                    quote_literal(&table.name)
                ))
                .await
                .map_err(WatchReport::Failed)?;
            let Some(oid) = relation.get(0, "oid").and_then(|oid| oid.parse().ok()) else {
                // Dropped again meanwhile: nothing to watch.
                continue;
            };
            self.outboxes.push(OutboxRelation {
                partitioned: relation.get(0, "relkind") == Some("p"),
                table,
                oid,
            });
            joined = true;
        }
        if joined {
            self.rebuild();
        }
        Ok(joined)
    }

    /// What changed since `baseline`, for the first outbox (in the configuration's
    /// order) that changed; without an outbox table only the publication counts.
    pub(super) fn change(
        &self,
        baseline: &[PublicationIdentity],
        now: &[PublicationIdentity],
    ) -> Option<(PublicationChange, Option<QualifiedName>)> {
        if self.outboxes.is_empty() {
            let (baseline, now) = (baseline.first()?, now.first()?);
            return if now.publication_oid.is_none() {
                Some((PublicationChange::PublicationDropped, None))
            } else if now.publication_oid != baseline.publication_oid {
                Some((PublicationChange::PublicationReplaced, None))
            } else {
                None
            };
        }
        self.outboxes
            .iter()
            .zip(baseline.iter().zip(now))
            .find_map(|(outbox, (baseline, now))| {
                PublicationChange::between(baseline, now, outbox.partitioned)
                    .map(|change| (change, Some(outbox.table.clone())))
            })
    }

    /// The WAL position, then the identities (in that order: see the module doc).
    pub(super) async fn read(
        &self,
        conn: &mut PgConnection,
    ) -> Result<(Lsn, Vec<PublicationIdentity>), WatchReport> {
        let position = conn
            // On a standby (decoding there), what it has replayed: the catalog it reads
            // next is at least that far.
            .simple_query(
                "SELECT (CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn() \
                         ELSE pg_catalog.pg_current_wal_lsn() END)::text AS lsn",
            )
            .await
            .map_err(WatchReport::Failed)?;
        let lsn: Lsn = position
            .get(0, "lsn")
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| {
                WatchReport::Invalid("pg_current_wal_lsn() returned no position".into())
            })?;
        // The identities read through pg_publication_tables, which a pattern's table
        // dropped meanwhile can fail: read again then.
        let identities = read_publication_tables(conn, &self.query)
            .await
            .map_err(WatchReport::Failed)?;
        let identities = PublicationIdentity::from_result(&identities, self.outboxes.len().max(1))
            .map_err(WatchReport::Invalid)?;
        Ok((lsn, identities))
    }

    /// A change seen once, read again to name it right: one reading can straddle a DDL
    /// commit (the publication's row read from the statement's snapshot, its tables
    /// through the catalog caches, which already see the drop), so `DROP PUBLICATION`
    /// could read as "the table left the publication" and get the wrong repair. The
    /// second reading starts after the first ended and sees the settled catalog; a
    /// change is a change either way (nothing past it is acknowledged), only its name
    /// and repair come from the later one.
    async fn settled(
        &self,
        conn: &mut PgConnection,
        baseline: &[PublicationIdentity],
        first: (PublicationChange, Option<QualifiedName>),
    ) -> WatchReport {
        let (change, table) = match self.read(conn).await {
            Ok((_, identities)) => self.change(baseline, &identities).unwrap_or(first),
            Err(_) => first,
        };
        WatchReport::Changed { change, table }
    }
}
