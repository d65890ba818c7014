//! The fakes the pipeline's unit tests drive it with: a scripted replication stream
//! (pgoutput messages written by the test, status updates read back), a sink that hands
//! every record to the test (which answers with the notices it chooses, in the order it
//! chooses), and an outbox watch that vouches for the fake server's WAL position (or
//! holds its answer back). [`Relay`] runs the pipeline on them the way
//! [`crate::relay::run`] does once streaming has started: `stream`, then `drain` after a
//! shutdown.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;
use crate::pg::conn::{CopyEvent, PgError};
use crate::pg::pgoutput::PgTimestamp;
use crate::pg::publication::PublicationChange;
use crate::pg::replication::{PrimaryKeepalive, ReplicationFrame, StandbyStatusUpdate, XLogData};
use crate::pg::sql::QualifiedName;
use crate::pg::Lsn;
use crate::relay::ack::InFlightLimits;
use crate::relay::liveness::LivenessLimits;
use crate::relay::record::Resume;
use crate::relay::router::config::OutboxConfig;
use crate::relay::router::{OutboxEvent, Router};
use crate::relay::source::ReplicationStream;
use crate::relay::txn::{AssemblerOutbox, TxnAssembler};
use crate::relay::watch::{OutboxWatch, WatchReport};
use crate::relay::RelayError;
use crate::sink::checkpoint::Checkpoint;
use crate::sink::{NoticeSender, RecordTag, SendError, Sink, SinkError, SinkNotice};

use super::super::{Pipeline, Start};
pub(super) use super::wire::Row;
use super::wire::{insert_message, relation_message, OUTBOX_OID};

/// Where the slot stands when a scripted pipeline starts.
pub(super) const SLOT_LSN: Lsn = Lsn(0x1_0000);
/// The longest a test waits for a condition before it fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// The stream's end of the script: events the test wrote, status updates back to it.
pub(super) struct ScriptedStream {
    events: mpsc::UnboundedReceiver<Result<CopyEvent, PgError>>,
    statuses: mpsc::UnboundedSender<StandbyStatusUpdate>,
    /// Events the pipeline has taken so far.
    taken: Arc<AtomicUsize>,
}

impl ReplicationStream for ScriptedStream {
    async fn next_event(&mut self) -> Result<CopyEvent, PgError> {
        match self.events.recv().await {
            Some(event) => {
                self.taken.fetch_add(1, Ordering::SeqCst);
                event
            }
            // The test dropped its end: nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn buffered_event(&mut self) -> Result<Option<CopyEvent>, PgError> {
        match self.events.try_recv() {
            Ok(event) => {
                self.taken.fetch_add(1, Ordering::SeqCst);
                event.map(Some)
            }
            Err(_) => Ok(None),
        }
    }

    async fn send_status(&mut self, update: &StandbyStatusUpdate) -> Result<(), PgError> {
        let _ = self.statuses.send(*update);
        Ok(())
    }

    async fn close(self, _wait: Duration) {}
}

/// A sink that hands each record to the test and answers nothing by itself.
struct ScriptedSink {
    sent: mpsc::UnboundedSender<(OutboxEvent, RecordTag)>,
}

impl Sink for ScriptedSink {
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError> {
        let _ = self.sent.send((event, tag));
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

/// How a scripted pipeline is set up.
#[derive(Debug, Clone)]
pub(super) struct Options {
    pub(super) limits: InFlightLimits,
    pub(super) dead_letter_topic: Option<String>,
    pub(super) status_interval: Duration,
    pub(super) stall_release: Duration,
    pub(super) shutdown_timeout: Duration,
    pub(super) committed: Option<Lsn>,
    /// The session resumes past the slot's position, to what the process delivered
    /// before (the record behind it): the skip up to it, as `run` builds it.
    pub(super) resumed_through: Option<Lsn>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            limits: InFlightLimits {
                events: 1_000,
                bytes: 1 << 20,
            },
            dead_letter_topic: None,
            status_interval: Duration::from_secs(10),
            stall_release: Duration::from_secs(60),
            shutdown_timeout: Duration::from_secs(10),
            committed: None,
            resumed_through: None,
        }
    }
}

/// The fake server's state the watch answers from.
struct Server {
    /// `pg_current_wal_lsn()`: the end of the last transaction written.
    wal: AtomicU64,
    /// Positions written into the state table, in order.
    recorded: Mutex<Vec<Lsn>>,
    /// What changed in the publication, once the test changed it: the watch's checks
    /// report it from then on.
    changed: Mutex<Option<PublicationChange>>,
}

/// What a scripted pipeline returns when its task ends.
type Ended = (Pipeline<ScriptedStream>, Result<(), RelayError>);

/// A pipeline running on scripted fakes, and the test's ends of them.
pub(super) struct Relay {
    events: mpsc::UnboundedSender<Result<CopyEvent, PgError>>,
    statuses: mpsc::UnboundedReceiver<StandbyStatusUpdate>,
    sent: mpsc::UnboundedReceiver<(OutboxEvent, RecordTag)>,
    notices: NoticeSender,
    stop: watch::Sender<bool>,
    /// `true` while the watch holds its answers back.
    hold: watch::Sender<bool>,
    taken: Arc<AtomicUsize>,
    written: usize,
    server: Arc<Server>,
    task: Option<tokio::task::JoinHandle<Ended>>,
    next_xid: u32,
    relation_sent: bool,
    /// The highest flush position reported so far (they must never go back).
    pub(super) flushed: Lsn,
}

impl Relay {
    /// Builds the pipeline as [`crate::relay::run`] does and starts it streaming.
    pub(super) fn start(options: Options) -> Relay {
        let (events, event_rx) = mpsc::unbounded_channel();
        let (status_tx, statuses) = mpsc::unbounded_channel();
        let (sent_tx, sent) = mpsc::unbounded_channel();
        let (notices, notice_rx) = mpsc::unbounded_channel();
        let (stop, mut stop_rx) = watch::channel(false);
        let (hold, hold_rx) = watch::channel(false);
        let taken = Arc::new(AtomicUsize::new(0));
        let server = Arc::new(Server {
            wal: AtomicU64::new(SLOT_LSN.0),
            recorded: Mutex::new(Vec::new()),
            changed: Mutex::new(None),
        });
        let (watch, script) = OutboxWatch::scripted();
        tokio::spawn(answer_watch(script, Arc::clone(&server), hold_rx));
        let router = Router::try_new(&OutboxConfig::default()).expect("default outbox settings");
        let table = QualifiedName::parse("public.outbox").expect("table name");
        let start = Start {
            slot_lsn: SLOT_LSN,
            recorded: SLOT_LSN,
            assembler: TxnAssembler::new(
                vec![AssemblerOutbox {
                    table: table.clone(),
                    oid: OUTBOX_OID,
                    router,
                    entry: 0,
                }],
                0,
            ),
            limits: options.limits,
            liveness: LivenessLimits {
                status_interval: options.status_interval,
                receive_timeout: options.status_interval * 6,
                stall_release: options.stall_release,
            },
            dead_letter_topic: options.dead_letter_topic.clone(),
            publication: "outbox_pub".to_owned(),
            tables: vec![table],
            committed: options
                .committed
                .or(options.resumed_through)
                .map(|lsn| Checkpoint::new("outbox_relay", "7300000000000000001", lsn, None)),
            resume: options.resumed_through.map(|through| Resume {
                from: SLOT_LSN,
                through,
                transactions: 0,
                events: 0,
            }),
        };
        let stream = ScriptedStream {
            events: event_rx,
            statuses: status_tx,
            taken: Arc::clone(&taken),
        };
        let sink: Box<dyn Sink> = Box::new(ScriptedSink { sent: sent_tx });
        let mut pipeline = Pipeline::new(stream, (sink, notice_rx), watch, start, Metrics::new());
        let interval = options.status_interval;
        let shutdown_timeout = options.shutdown_timeout;
        let task = tokio::spawn(async move {
            // What run_attempt does with a started pipeline.
            let streamed = pipeline.stream(interval, &mut stop_rx).await;
            pipeline.log_unfinished_resume();
            let ended = match streamed {
                Ok(()) => {
                    let beat = crate::relay::takeover::heartbeat(interval);
                    pipeline.drain(shutdown_timeout, beat).await
                }
                Err(error) => Err(error),
            };
            (pipeline, ended)
        });
        Relay {
            events,
            statuses,
            sent,
            notices,
            stop,
            hold,
            taken,
            written: 0,
            server,
            task: Some(task),
            next_xid: 700,
            relation_sent: false,
            flushed: SLOT_LSN,
        }
    }

    /// The fake server's current end of WAL.
    pub(super) fn wal(&self) -> Lsn {
        Lsn(self.server.wal.load(Ordering::SeqCst))
    }

    fn frame(&mut self, wal_start: Lsn, data: Bytes) {
        let frame = ReplicationFrame::XLogData(XLogData {
            wal_start,
            wal_end: self.wal(),
            send_time: PgTimestamp(0),
            data,
        });
        self.push(CopyEvent::Frame(frame));
    }

    fn push(&mut self, event: CopyEvent) {
        self.written += 1;
        let _ = self.events.send(Ok(event));
    }

    /// Writes one committed transaction with these rows (the Relation message before
    /// the first); returns its end LSN. Each transaction takes 0x1000 bytes of WAL.
    pub(super) fn commit(&mut self, rows: &[Row]) -> Lsn {
        let begin = self.wal();
        let commit_lsn = Lsn(begin.0 + 0xF00);
        let end_lsn = Lsn(begin.0 + 0x1000);
        self.server.wal.store(end_lsn.0, Ordering::SeqCst);
        let xid = self.next_xid;
        self.next_xid += 1;
        let mut begin_message = BytesMut::new();
        begin_message.put_u8(b'B');
        begin_message.put_u64(commit_lsn.0);
        begin_message.put_i64(0);
        begin_message.put_u32(xid);
        self.frame(begin, begin_message.freeze());
        if !self.relation_sent {
            self.relation_sent = true;
            self.frame(Lsn::ZERO, relation_message());
        }
        for (index, row) in rows.iter().enumerate() {
            let at = Lsn(begin.0 + 0x10 * (u64::try_from(index).unwrap_or(0) + 1));
            self.frame(at, insert_message(row));
        }
        let mut commit = BytesMut::new();
        commit.put_u8(b'C');
        commit.put_u8(0);
        commit.put_u64(commit_lsn.0);
        commit.put_u64(end_lsn.0);
        commit.put_i64(0);
        self.frame(commit_lsn, commit.freeze());
        end_lsn
    }

    /// A keepalive at the server's end of WAL.
    pub(super) fn keepalive(&mut self, reply_requested: bool) {
        let keepalive = PrimaryKeepalive {
            wal_end: self.wal(),
            send_time: PgTimestamp(0),
            reply_requested,
        };
        self.push(CopyEvent::Frame(ReplicationFrame::Keepalive(keepalive)));
    }

    /// The stream ends with the server's error.
    pub(super) fn fail(&mut self, error: PgError) {
        self.written += 1;
        let _ = self.events.send(Err(error));
    }

    /// The publication no longer publishes the outbox as it did: the watch's checks say
    /// so from now on.
    pub(super) fn change_publication(&self, change: PublicationChange) {
        *self.server.changed.lock().expect("not poisoned") = Some(change);
    }

    /// Whether the pipeline has taken everything written so far.
    pub(super) fn read_everything(&self) -> bool {
        self.taken.load(Ordering::SeqCst) == self.written
    }

    /// The next record handed to the sink.
    pub(super) async fn next_sent(&mut self) -> (OutboxEvent, RecordTag) {
        tokio::time::timeout(PATIENCE, self.sent.recv())
            .await
            .expect("a record handed to the sink in time")
            .expect("the sink is alive")
    }

    /// A record handed to the sink already, without waiting.
    pub(super) fn sent_now(&mut self) -> Option<(OutboxEvent, RecordTag)> {
        self.sent.try_recv().ok()
    }

    /// The sink confirms the record tagged `tag`.
    pub(super) fn deliver(&self, tag: RecordTag) {
        self.notice(SinkNotice::Delivered { tag });
    }

    pub(super) fn notice(&self, notice: SinkNotice) {
        self.notices
            .send(notice)
            .expect("the pipeline takes notices");
    }

    /// The next status update (checked to never move the flush position back).
    pub(super) async fn next_status(&mut self) -> StandbyStatusUpdate {
        let update = tokio::time::timeout(PATIENCE, self.statuses.recv())
            .await
            .expect("a status update in time")
            .expect("the stream is alive");
        assert!(
            update.flush >= self.flushed,
            "the flush position went back from {} to {}",
            self.flushed,
            update.flush
        );
        assert!(
            update.write >= update.flush,
            "write behind flush: {update:?}"
        );
        self.flushed = update.flush;
        update
    }

    /// Waits for a status update acknowledging `lsn`; no update on the way may
    /// acknowledge past it.
    pub(super) async fn acknowledged(&mut self, lsn: Lsn) -> StandbyStatusUpdate {
        loop {
            let update = self.next_status().await;
            assert!(
                update.flush <= lsn,
                "acknowledged {} past {lsn}",
                update.flush
            );
            if update.flush == lsn {
                return update;
            }
        }
    }

    /// Asks the pipeline for a status update the way PostgreSQL does (a keepalive with
    /// a reply requested) and returns it: everything queued before is taken into account.
    pub(super) async fn ask_status(&mut self) -> StandbyStatusUpdate {
        self.keepalive(true);
        let wal = self.wal();
        loop {
            let update = self.next_status().await;
            if update.write >= wal && self.read_everything() {
                return update;
            }
        }
    }

    /// The watch holds its answers back (`true`) or answers again.
    pub(super) fn hold_vouching(&self, hold: bool) {
        let _ = self.hold.send(hold);
    }

    /// Positions written into the state table so far.
    pub(super) fn recorded(&self) -> Vec<Lsn> {
        self.server.recorded.lock().expect("not poisoned").clone()
    }

    /// Waits until the state table holds `lsn` (or a later position).
    pub(super) async fn recorded_through(&self, lsn: Lsn) {
        let recorded = async {
            while self.recorded().last().is_none_or(|&last| last < lsn) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        tokio::time::timeout(PATIENCE, recorded)
            .await
            .expect("the position recorded in time");
    }

    /// Requests a shutdown.
    pub(super) fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits for the pipeline to end (an error, or a shutdown after its drain).
    pub(super) async fn ended(&mut self) -> Ended {
        let task = self.task.take().expect("the pipeline ends once");
        tokio::time::timeout(PATIENCE, task)
            .await
            .expect("the pipeline ended in time")
            .expect("the pipeline did not panic")
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The watch task of the fake server: vouches for its end of WAL at each request
/// (unless held), and records what it is asked to record.
async fn answer_watch(
    mut script: crate::relay::watch::WatchScript,
    server: Arc<Server>,
    mut hold: watch::Receiver<bool>,
) {
    let wal = |server: &Server| Lsn(server.wal.load(Ordering::SeqCst));
    if script
        .reports
        .send(WatchReport::Vouched(wal(&server)))
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            request = script.requests.recv() => {
                if request.is_none() {
                    return;
                }
                if hold.wait_for(|held| !*held).await.is_err() {
                    return;
                }
                let changed = server.changed.lock().expect("not poisoned").clone();
                let report = match changed {
                    Some(change) => WatchReport::Changed {
                        change,
                        table: QualifiedName::parse("public.outbox").ok(),
                    },
                    None => WatchReport::Vouched(wal(&server)),
                };
                if script.reports.send(report).await.is_err() {
                    return;
                }
            }
            Some((lsn, done)) = script.records.recv() => {
                server.recorded.lock().expect("not poisoned").push(lsn);
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
        }
    }
}
