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
use crate::pg::publication::{identity_query, PublicationChange, PublicationIdentity};
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
    /// It does not any more.
    Changed(PublicationChange),
    /// The side connection failed (retryable like the replication connection).
    Failed(PgError),
    /// The first reading already does not match what the relay prepared.
    Invalid(String),
}

/// What the watch checks and where it records.
#[derive(Debug, Clone)]
pub struct WatchTarget {
    pub publication: String,
    pub table: QualifiedName,
    pub outbox_oid: u32,
    pub partitioned: bool,
    /// The outbox table is relayed; `false` (messages only): only the publication's
    /// identity is watched (pgoutput stops without it).
    pub outbox: bool,
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
            table,
            outbox_oid,
            partitioned,
            outbox,
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
            let query = identity_query(&publication, &table);
            let baseline = match read(&mut conn, &query).await {
                Ok((lsn, identity)) => {
                    if outbox && (identity.table_oid != Some(outbox_oid) || !identity.published) {
                        let _ = report_tx
                            .send(WatchReport::Invalid(format!(
                                "the outbox {table} changed while the relay was starting (relation id {:?}, expected {outbox_oid}; published: {})",
                                identity.table_oid, identity.published
                            )))
                            .await;
                        return;
                    }
                    if report_tx.send(WatchReport::Vouched(lsn)).await.is_err() {
                        return;
                    }
                    identity
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
                        match read(&mut conn, &query).await {
                            Ok((lsn, identity)) => {
                                match change_between(&baseline, &identity, partitioned, outbox) {
                                    None => WatchReport::Vouched(lsn),
                                    Some(change) => {
                                        WatchReport::Changed(settled(&mut conn, &query, &baseline, (partitioned, outbox), change).await)
                                    }
                                }
                            }
                            Err(report) => report,
                        }
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

/// What changed since `baseline`; without an outbox table only the publication counts.
fn change_between(
    baseline: &PublicationIdentity,
    now: &PublicationIdentity,
    partitioned: bool,
    outbox: bool,
) -> Option<PublicationChange> {
    if outbox {
        return PublicationChange::between(baseline, now, partitioned);
    }
    if now.publication_oid.is_none() {
        Some(PublicationChange::PublicationDropped)
    } else if now.publication_oid != baseline.publication_oid {
        Some(PublicationChange::PublicationReplaced)
    } else {
        None
    }
}

/// The WAL position, then the identity (in that order: see the module doc).
async fn read(
    conn: &mut PgConnection,
    query: &str,
) -> Result<(Lsn, PublicationIdentity), WatchReport> {
    let position = conn
        .simple_query("SELECT pg_catalog.pg_current_wal_lsn()::text AS lsn")
        .await
        .map_err(WatchReport::Failed)?;
    let lsn: Lsn = position
        .get(0, "lsn")
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| WatchReport::Invalid("pg_current_wal_lsn() returned no position".into()))?;
    let identity = conn
        .simple_query(query)
        .await
        .map_err(WatchReport::Failed)?;
    let identity = PublicationIdentity::from_result(&identity).map_err(WatchReport::Invalid)?;
    Ok((lsn, identity))
}

/// A change seen once, read again to name it right: one reading can straddle a DDL
/// commit (the publication's row read from the statement's snapshot, its tables through
/// the catalog caches, which already see the drop), so `DROP PUBLICATION` could read as
/// "the table left the publication" and get the wrong repair. The second reading starts
/// after the first ended and sees the settled catalog; a change is a change either way
/// (nothing past it is acknowledged), only its name and repair come from the later one.
async fn settled(
    conn: &mut PgConnection,
    query: &str,
    baseline: &PublicationIdentity,
    (partitioned, outbox): (bool, bool),
    first: PublicationChange,
) -> PublicationChange {
    match read(conn, query).await {
        Ok((_, identity)) => {
            change_between(baseline, &identity, partitioned, outbox).unwrap_or(first)
        }
        Err(_) => first,
    }
}
