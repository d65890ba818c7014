//! The outbox watch: a side connection that vouches, on request, for the positions the
//! relay acknowledges.
//!
//! ```text
//!  pipeline ──request──▶ watch task (ordinary SQL session)
//!                          1. SELECT pg_current_wal_lsn()          → L
//!                          2. read the publication identity        (snapshot after L)
//!                          3. same as when streaming began?
//!  pipeline ◀──Vouched(L)── yes: every outbox row committed before L was published
//!           ◀──Changed──── no:  what changed, and the last position vouched for
//! ```
//!
//! Why: if the outbox leaves the publication (renamed and replaced, dropped from it,
//! publication dropped), its new rows are simply not streamed. Nothing in the stream says
//! so, and an idle relay follows the server's WAL, so it would acknowledge past rows it
//! never saw. The ack tracker therefore never reports a position past the last one
//! vouched for here (see [`crate::relay::ack::AckTracker::vouch`]). Reading the position
//! *before* the identity makes the argument hold: a change committed before `L` is
//! visible to the identity read that follows.
//!
//! The pipeline asks when it has something to acknowledge past the vouched position (a
//! delivery, a status tick), so a check runs at most once per request and never blocks
//! the loop. The same connection writes the acknowledged position into the relay's state
//! table ([`crate::pg::state`]) when the pipeline asks (at most once a second, only while
//! events are acknowledged: [`crate::relay::record`]), for the lost-slot check and the
//! resume after the slot rewound.

use tokio::sync::{mpsc, oneshot};

use crate::pg::conn::{PgConnection, PgError, SessionKind};
use crate::pg::diagnose::SetupError;
use crate::pg::publication::{identities_query, PublicationChange, PublicationIdentity};
use crate::pg::slot::{join_publication, matching_tables};
use crate::pg::source::{OutboxRelation, TablePattern};
use crate::pg::sql::quote_literal;
use crate::pg::sql::QualifiedName;
use crate::pg::state;
use crate::pg::url::ConnectParams;
use crate::pg::Lsn;
use crate::relay::feedback::PROMPT_ACK_GAP;

/// The shortest time between two checks: status updates go out at most that often
/// anyway ([`PROMPT_ACK_GAP`]).
pub const MIN_CHECK_GAP: std::time::Duration = PROMPT_ACK_GAP;

/// What a check found.
#[derive(Debug)]
pub enum WatchReport {
    /// The publication covers the outbox as it did; positions up to this are safe.
    Vouched(Lsn),
    /// It does not any more: what changed, and for which outbox table (`None`: the
    /// publication itself, of a messages-only relay).
    Changed {
        change: PublicationChange,
        table: Option<QualifiedName>,
    },
    /// The side connection failed (retryable like the replication connection).
    Failed(PgError),
    /// The first reading already does not match what the relay prepared.
    Invalid(String),
}

/// What the watch checks and where it records.
#[derive(Debug, Clone)]
pub struct WatchTarget {
    pub publication: String,
    /// Every outbox table as the relay prepared it; none (messages only): only the
    /// publication's identity is watched (pgoutput stops without it).
    pub outboxes: Vec<OutboxRelation>,
    /// Schema-per-tenant patterns: tables they match that appear are added to the
    /// publication and watched from then on; one of theirs that is dropped leaves the
    /// set (its rows up to the drop were streamed).
    pub patterns: Vec<TablePattern>,
    pub state_table: QualifiedName,
    pub slot: String,
}

/// The pipeline's handle on the watch task.
pub struct OutboxWatch {
    requests: mpsc::Sender<()>,
    records: mpsc::Sender<(Lsn, Option<oneshot::Sender<()>>)>,
    reports: mpsc::Receiver<WatchReport>,
    /// Since when a check (or the first reading) is awaited.
    pending_since: Option<std::time::Instant>,
    /// When the last check was asked for: at most one per [`MIN_CHECK_GAP`].
    last_asked: Option<std::time::Instant>,
    /// The task doing the checks (`None`: scripted, in unit tests).
    task: Option<tokio::task::JoinHandle<()>>,
}

impl OutboxWatch {
    /// Starts the task: connects, takes the baseline reading and vouches for the first
    /// position (the first report).
    pub fn start(target: WatchTarget, connect: ConnectParams) -> Self {
        let WatchTarget {
            publication,
            outboxes,
            patterns,
            state_table,
            slot,
        } = target;
        let (requests, mut request_rx) = mpsc::channel::<()>(1);
        let (records, mut record_rx) = mpsc::channel::<(Lsn, Option<oneshot::Sender<()>>)>(1);
        let (report_tx, reports) = mpsc::channel(4);
        let task = tokio::spawn(async move {
            let mut conn = match PgConnection::connect(&connect, SessionKind::Sql).await {
                Ok(conn) => conn,
                Err(error) => {
                    let _ = report_tx.send(WatchReport::Failed(error)).await;
                    return;
                }
            };
            let mut watched = Watched::new(publication, outboxes, patterns);
            let mut baseline = match watched.read(&mut conn).await {
                Ok((lsn, identities)) => {
                    if let Some(problem) = first_reading_problem(&watched.outboxes, &identities) {
                        let _ = report_tx.send(WatchReport::Invalid(problem)).await;
                        return;
                    }
                    if report_tx.send(WatchReport::Vouched(lsn)).await.is_err() {
                        return;
                    }
                    identities
                }
                Err(report) => {
                    let _ = report_tx.send(report).await;
                    return;
                }
            };
            loop {
                let report = tokio::select! {
                    request = request_rx.recv() => {
                        if request.is_none() {
                            return;
                        }
                        watched.check(&mut conn, &mut baseline).await
                    }
                    Some((lsn, done)) = record_rx.recv() => {
                        match conn.simple_query(&state::acknowledged_sql(&state_table, &slot, lsn)).await {
                            Ok(_) => {
                                if let Some(done) = done {
                                    let _ = done.send(());
                                }
                                continue;
                            }
                            Err(error) => WatchReport::Failed(error),
                        }
                    }
                };
                let done = !matches!(report, WatchReport::Vouched(_));
                if report_tx.send(report).await.is_err() || done {
                    return;
                }
            }
        });
        OutboxWatch {
            requests,
            records,
            reports,
            // The first report comes without a request.
            pending_since: Some(tokio::time::Instant::now().into_std()),
            last_asked: None,
            task: Some(task),
        }
    }

    /// A watch without a task: the other end, [`WatchScript`], receives the requests and
    /// the records and sends the reports (unit tests of the pipeline).
    #[cfg(test)]
    pub fn scripted() -> (Self, WatchScript) {
        let (requests, request_rx) = mpsc::channel(1);
        let (records, record_rx) = mpsc::channel(1);
        let (report_tx, reports) = mpsc::channel(4);
        let watch = OutboxWatch {
            requests,
            records,
            reports,
            pending_since: Some(tokio::time::Instant::now().into_std()),
            last_asked: None,
            task: None,
        };
        let script = WatchScript {
            requests: request_rx,
            records: record_rx,
            reports: report_tx,
        };
        (watch, script)
    }

    /// Asks for a check unless one is under way, at most one per [`MIN_CHECK_GAP`]: a
    /// busy stream would otherwise query PostgreSQL back to back. Returns when it may
    /// ask again if it is too soon now.
    pub fn request(&mut self, now: std::time::Instant) -> Option<std::time::Instant> {
        if self.pending_since.is_some() {
            return None;
        }
        if let Some(next) = self.last_asked.map(|last| last + MIN_CHECK_GAP) {
            if now < next {
                return Some(next);
            }
        }
        self.ask(now);
        None
    }

    /// Asks for a check now unless one is under way (the final update at shutdown).
    pub fn request_now(&mut self) {
        if self.pending_since.is_none() {
            self.ask(tokio::time::Instant::now().into_std());
        }
    }

    fn ask(&mut self, now: std::time::Instant) {
        if self.requests.try_send(()).is_ok() {
            self.pending_since = Some(now);
            self.last_asked = Some(now);
        }
    }

    /// How long the awaited check has been under way (a side connection that stopped
    /// answering would otherwise stop every acknowledgement without a word).
    pub fn waiting_for(&self, now: std::time::Instant) -> std::time::Duration {
        self.pending_since
            .map_or(std::time::Duration::ZERO, |since| {
                now.saturating_duration_since(since)
            })
    }

    /// Writes `lsn` as the acknowledged position into the state table; `false` when a
    /// write is still queued (ask again later: the next one carries a newer position).
    pub fn record(&mut self, lsn: Lsn) -> bool {
        self.records.try_send((lsn, None)).is_ok()
    }

    /// Writes `lsn` into the state table and waits (at most `wait`) until it is written:
    /// the last record at shutdown. Whether it was.
    pub async fn record_and_wait(&mut self, lsn: Lsn, wait: std::time::Duration) -> bool {
        let (done, written) = oneshot::channel();
        let written =
            async { self.records.send((lsn, Some(done))).await.is_ok() && written.await.is_ok() };
        tokio::time::timeout(wait, written).await.unwrap_or(false)
    }

    /// The next report (cancel-safe: use it in `select!`). `None` once the task ended
    /// without a report, which it never does while the handle lives.
    pub async fn next_report(&mut self) -> Option<WatchReport> {
        let report = self.reports.recv().await;
        self.pending_since = None;
        report
    }
}

impl Drop for OutboxWatch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The task's end of a [scripted](OutboxWatch::scripted) watch.
#[cfg(test)]
pub struct WatchScript {
    /// A check asked for.
    pub requests: mpsc::Receiver<()>,
    /// A position to record, and whom to tell once it is written.
    pub records: mpsc::Receiver<(Lsn, Option<oneshot::Sender<()>>)>,
    /// Reports for the pipeline (the first one comes without a request).
    pub reports: mpsc::Sender<WatchReport>,
}

/// The first reading must find every outbox as the relay prepared it: the same relation
/// id behind its name, and published.
fn first_reading_problem(
    outboxes: &[OutboxRelation],
    identities: &[PublicationIdentity],
) -> Option<String> {
    outboxes.iter().zip(identities).find_map(|(outbox, identity)| {
        (identity.table_oid != Some(outbox.oid) || !identity.published).then(|| {
            format!(
                "the outbox {} changed while the relay was starting (relation id {:?}, expected {}; published: {})",
                outbox.table, identity.table_oid, outbox.oid, identity.published
            )
        })
    })
}

/// What the watch watches, for one run of the task: the tables (growing as patterns
/// match new ones), the patterns, and the query that reads them.
struct Watched {
    publication: String,
    outboxes: Vec<OutboxRelation>,
    patterns: Vec<TablePattern>,
    query: String,
}

impl Watched {
    fn new(
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
    async fn check(
        &mut self,
        conn: &mut PgConnection,
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
        match self.discover(conn).await {
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
    /// set. Whether any joined.
    async fn discover(&mut self, conn: &mut PgConnection) -> Result<bool, WatchReport> {
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
            join_publication(conn, &self.publication, &table)
                .await
                .map_err(|error| match error {
                    SetupError::Pg(error) => WatchReport::Failed(error),
                    other => WatchReport::Invalid(other.to_string()),
                })?;
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
    fn change(
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
    async fn read(
        &self,
        conn: &mut PgConnection,
    ) -> Result<(Lsn, Vec<PublicationIdentity>), WatchReport> {
        let position = conn
            .simple_query("SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn")
            .await
            .map_err(WatchReport::Failed)?;
        let lsn: Lsn = position
            .get(0, "lsn")
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| {
                WatchReport::Invalid("pg_current_wal_lsn() returned no position".into())
            })?;
        let identities = conn
            .simple_query(&self.query)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(table_oid: u32, membership: &str) -> PublicationIdentity {
        PublicationIdentity {
            table_oid: Some(table_oid),
            publication_oid: Some(500),
            publishes_insert: true,
            via_root: false,
            all_tables: false,
            membership: membership.into(),
            published: true,
        }
    }

    fn outbox(name: &str, oid: u32) -> OutboxRelation {
        OutboxRelation {
            table: QualifiedName::parse(name).unwrap(),
            oid,
            partitioned: false,
        }
    }

    #[test]
    fn a_change_to_any_outbox_is_reported_with_that_table() {
        let outboxes = vec![outbox("a.outbox", 10), outbox("b.outbox", 20)];
        let reading = Watched::new("p".into(), outboxes.clone(), Vec::new());
        let baseline = vec![identity(10, "1"), identity(20, "2")];
        assert_eq!(reading.change(&baseline, &baseline), None);
        // b's table left the publication: b is named, not a.
        let mut now = baseline.clone();
        now[1].published = false;
        now[1].membership.clear();
        assert_eq!(
            reading.change(&baseline, &now),
            Some((
                PublicationChange::TableLeftPublication,
                Some(QualifiedName::parse("b.outbox").unwrap())
            ))
        );
        // b's name now belongs to another table.
        let mut now = baseline.clone();
        now[1].table_oid = Some(21);
        assert!(matches!(
            reading.change(&baseline, &now),
            Some((PublicationChange::TableReplaced { was: 20, now: 21 }, Some(ref t))) if t.to_string() == "b.outbox"
        ));
        assert_eq!(first_reading_problem(&outboxes, &baseline), None);
        let problem = first_reading_problem(&outboxes, &now).unwrap();
        assert!(problem.contains("b.outbox"), "{problem}");
    }

    #[test]
    fn without_outbox_tables_only_the_publication_counts() {
        let reading = Watched::new("p".into(), Vec::new(), Vec::new());
        let baseline = vec![identity(0, "")];
        let mut now = baseline.clone();
        now[0].published = false;
        assert_eq!(reading.change(&baseline, &now), None);
        now[0].publication_oid = None;
        assert_eq!(
            reading.change(&baseline, &now),
            Some((PublicationChange::PublicationDropped, None))
        );
    }
}
