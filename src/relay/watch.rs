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

mod primary;
mod watched;

use primary::PrimarySide;
use watched::{first_reading_change, Watched};

use crate::pg::conn::{PgConnection, PgError, SessionKind};
use crate::pg::publication::PublicationChange;
use crate::pg::source::{OutboxRelation, TablePattern};
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
    /// Decoding on a standby: the primary, where the record and a pattern's new tables
    /// are written while the standby is in recovery.
    pub primary: Option<ConnectParams>,
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
            primary,
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
            let mut primary = PrimarySide::new(primary);
            let mut baseline = match watched.read(&mut conn).await {
                Ok((lsn, identities)) => {
                    if let Some((change, table)) =
                        first_reading_change(&watched.outboxes, &identities)
                    {
                        let _ = report_tx.send(WatchReport::Changed { change, table }).await;
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
                        watched.check(&mut conn, &mut primary, &mut baseline).await
                    }
                    Some((lsn, done)) = record_rx.recv() => {
                        let sql = state::acknowledged_sql(&state_table, &slot, lsn);
                        let written = match primary.for_writes(&mut conn).await {
                            Ok(Some(on_primary)) => on_primary.simple_query(&sql).await,
                            Ok(None) => conn.simple_query(&sql).await,
                            Err(error) => Err(error),
                        };
                        match written {
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
    /// Whether this call asked: `false` when the next report answers an earlier request.
    pub fn request_now(&mut self) -> bool {
        self.pending_since.is_none() && self.ask(tokio::time::Instant::now().into_std())
    }

    fn ask(&mut self, now: std::time::Instant) -> bool {
        let asked = self.requests.try_send(()).is_ok();
        if asked {
            self.pending_since = Some(now);
            self.last_asked = Some(now);
        }
        asked
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

#[cfg(test)]
mod tests;
