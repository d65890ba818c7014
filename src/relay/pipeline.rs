//! The pipeline loop: replication stream in, events to the sink, delivery notices to the
//! ack tracker, status updates out.
//!
//! One `biased` select, priorities in order:
//! 1. shutdown: stop reading, drain in-flight deliveries (bounded), final status update;
//! 2. sink notices: they free in-flight room, move the flush LSN, and say when a new
//!    topic is ready;
//! 3. the status timer: keeps the walsender alive even while reading is paused, and a
//!    deferred update when the acknowledged position moved within the last
//!    [`PROMPT_ACK_GAP`](crate::relay::feedback::PROMPT_ACK_GAP);
//! 4. new input from PostgreSQL, only while fewer than `max_in_flight` events and
//!    fewer than `max_in_flight_bytes` bytes are undelivered and no record waits (for
//!    its topic, or for producer queue room): backpressure by not reading.
//!
//! A turn takes every delivery report already queued (one pump and one look at the
//! acknowledged position for all of them), and the frames already in the receive buffer
//! after the one it waited for (at most `FRAMES_PER_TURN`, the bounds checked before
//! each): under load the loop turns once per read from the socket, not once per frame.
//! The two deferred timers (an owed status update, an owed record) are made once and
//! moved only when their due time changes.
//!
//! The loop speaks to the sink only through [`Sink`] and its [`SinkNotice`]s (delivered,
//! refused, retry, stop, wake; see [`crate::sink`]): Kafka's error table, transactions
//! and fencing are the sink's. Nothing in the loop waits for the sink: a sink preparing
//! a new topic answers [`TopicStatus::Waiting`](crate::sink::TopicStatus::Waiting) and wakes the loop when it knows; the
//! events behind it wait, in order, in `waiting`, while status updates go on.
//!
//! The loop reads PostgreSQL only through [`ReplicationStream`] (a started
//! `PgConnection`, or the unit tests' scripted stream: `pipeline/tests.rs`), and is built
//! by `Pipeline::new` from a `Start` that [`crate::relay::run()`] decides once the
//! source is prepared.
//!
//! The loop, its bounds and liveness are here; the sink side (queueing, pumping, notices,
//! dead letters) is `pipeline/deliveries.rs`, status updates and the ends of an attempt
//! (settle, drain) `pipeline/status.rs`, the stream's steps (decoding, assembly, the
//! checkpoint's skip) `pipeline/steps.rs`, logical decoding messages
//! `pipeline/messages.rs`. Every state transition lives in the pure parts (`txn`,
//! `router`, `ack`, `deadletter`); this loop only moves values between them. Retryable failures end the
//! attempt; [`crate::relay::run()`] starts a new one from the slot's acknowledged
//! position, so anything in flight is sent again (at-least-once) and nothing is skipped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};

use crate::metrics::{unix_ms_now, AgeWriter, Metrics};
use crate::pg::conn::PgConnection;
use crate::pg::pgoutput::PgTimestamp;
use crate::pg::sql::QualifiedName;
use crate::pg::Lsn;
use crate::relay::ack::{AckTracker, InFlightLimits};
use crate::relay::lag::CommitTimes;
use crate::relay::liveness::{Liveness, LivenessLimits, TickInput};
use crate::relay::record::{Recorder, Resume};
use crate::relay::router::OutboxEvent;
use crate::relay::source::ReplicationStream;
use crate::relay::takeover::heartbeat;
use crate::relay::txn::TxnAssembler;
use crate::relay::watch::OutboxWatch;
use crate::relay::RelayError;
use crate::sink::checkpoint::Checkpoint;
use crate::sink::{RecordTag, Sink, SinkNotice};

mod deliveries;
mod messages;
mod status;
mod steps;
#[cfg(test)]
mod tests;

/// `/healthz` fails when the loop has not turned for this many status intervals.
pub(super) const HEALTHY_TICKS: u32 = 3;
/// How long closing the connection politely may take at shutdown.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Resolves once shutdown was requested.
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|requested| *requested).await.is_err() {
        // The shutdown sender is gone without a request: never resolve.
        std::future::pending::<()>().await;
    }
}

/// Counters for progress logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Progress {
    pub(super) events: u64,
    pub(super) dead_lettered: u64,
    pub(super) transactions: u64,
    pub(super) flush_lsn: Lsn,
}

/// A record counted in the ack tracker and not yet handed to the sink.
pub(super) struct Waiting {
    event: OutboxEvent,
    tag: RecordTag,
}

/// Where a new record joins the waiting queue: at the back (in order), or at the front
/// when it replaces the record being handed over (its dead-letter record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Front,
    Back,
}

pub(super) struct Pipeline<S = PgConnection> {
    conn: S,
    sink: Box<dyn Sink>,
    notices: mpsc::UnboundedReceiver<SinkNotice>,
    tracker: AckTracker,
    assembler: TxnAssembler,
    /// `[relay] max_in_flight` and `max_in_flight_bytes`.
    limits: InFlightLimits,
    dead_letter_topic: Option<String>,
    /// The outbox tables (for the repair advice when the watch sees a change).
    tables: Vec<QualifiedName>,
    /// The publication streamed from, to recognise notices about it (and for the
    /// repair advice when the watch sees a change).
    publication: String,
    /// Records not yet handed to the sink, in order: waiting for their topic to be
    /// created (off the loop) or for producer queue room. Input pauses meanwhile.
    waiting: VecDeque<Waiting>,
    progress: Progress,
    logged: Progress,
    /// When PostgreSQL, the watch or the sink is taken for dead.
    liveness: Liveness,
    /// Commit times of the transactions not yet acknowledged (lag and latency).
    commit_times: CommitTimes,
    metrics: Arc<Metrics>,
    /// When the last status update went out, and the flush position it carried.
    last_status_at: Instant,
    last_reported: Lsn,
    /// When to write the acknowledged position into the state table.
    recorder: Recorder,
    /// A record owed, due at this instant.
    record_due: Option<tokio::time::Instant>,
    /// Skipping what the state table's record shows delivered (`committed` was built
    /// from it): counted until the first transaction past it.
    resume: Option<Resume>,
    /// The open transaction carried an event (or a dead letter).
    txn_had_events: bool,
    /// A status update owed for a moved position, due at this instant.
    status_due: Option<tokio::time::Instant>,
    /// Vouches for the positions acknowledged (the outbox is still published).
    watch: OutboxWatch,
    /// Exactly-once: the last checkpoint Kafka committed before this session; the
    /// transactions it covers are skipped ([`skip_for`]).
    committed: Option<Checkpoint>,
    /// Events of the open transaction still to skip (`u64::MAX`: all of them).
    skip_left: u64,
    /// Writers of `metrics.oldest_undelivered` and `metrics.oldest_unacknowledged_commit`
    /// (carried over from earlier attempts).
    undelivered_age: AgeWriter,
    lag_age: AgeWriter,
}

/// Where a pipeline starts and what bounds it, decided before streaming
/// ([`crate::relay::run`]) from the settings and the prepared source.
pub(super) struct Start {
    /// The slot's acknowledged position: nothing before it is sent, and it is the
    /// first flush position reported.
    pub(super) slot_lsn: Lsn,
    /// What the state table holds already (the recorder writes only past it).
    pub(super) recorded: Lsn,
    /// Turns decoded messages into transactions and routed events.
    pub(super) assembler: TxnAssembler,
    /// `[relay] max_in_flight` and `max_in_flight_bytes`.
    pub(super) limits: InFlightLimits,
    /// The status interval, the receive timeout and the stall release.
    pub(super) liveness: LivenessLimits,
    pub(super) dead_letter_topic: Option<String>,
    pub(super) publication: String,
    /// The outbox tables, in the configuration's order (dead-letter headers).
    pub(super) tables: Vec<QualifiedName>,
    /// The transactions to skip: a checkpoint Kafka committed (exactly-once), or the
    /// state table's record shaped as one.
    pub(super) committed: Option<Checkpoint>,
    /// Counted while skipping what the record covers.
    pub(super) resume: Option<Resume>,
}

impl<S: ReplicationStream> Pipeline<S> {
    /// A pipeline on a started stream, a sink built for it (sending to `notices`) and
    /// the outbox watch vouching for the positions it acknowledges. Nothing is
    /// acknowledged before the watch's first report.
    pub(super) fn new(
        stream: S,
        (sink, notices): (Box<dyn Sink>, mpsc::UnboundedReceiver<SinkNotice>),
        mut watch: OutboxWatch,
        start: Start,
        metrics: Arc<Metrics>,
    ) -> Self {
        let Start {
            slot_lsn,
            recorded,
            assembler,
            limits,
            liveness,
            dead_letter_topic,
            publication,
            tables,
            committed,
            resume,
        } = start;
        let mut tracker = AckTracker::new(slot_lsn, assembler.next_seq());
        // Nothing is acknowledged until the watch has vouched for it.
        tracker.cap_at(slot_lsn);
        let progress = Progress {
            flush_lsn: slot_lsn,
            ..Progress::default()
        };
        let now = now();
        let mut recorder = Recorder::new(recorded);
        // What this process delivered before its last session ended, past the record
        // (PostgreSQL was gone, so nothing could record it): recorded now, before the
        // stream, by the watch's connection. A process killed before this session has
        // skipped that far would otherwise send it all again, and after a broker outage
        // and a PostgreSQL crash that can be many thousands of events (a chaos run of
        // the CI suite: 15,357 after one relay kill -9).
        if let Some(through) = resume.as_ref().map(|r| r.through).filter(|&t| t > recorded) {
            if watch.record(through) {
                recorder.written(through, now);
            }
        }
        Pipeline {
            conn: stream,
            sink,
            notices,
            tracker,
            assembler,
            limits,
            dead_letter_topic,
            tables,
            publication,
            waiting: VecDeque::new(),
            progress,
            logged: progress,
            liveness: Liveness::new(liveness, now),
            commit_times: CommitTimes::default(),
            last_status_at: now,
            last_reported: slot_lsn,
            recorder,
            record_due: None,
            resume,
            txn_had_events: false,
            status_due: None,
            watch,
            committed,
            skip_left: 0,
            // What earlier attempts left waiting still waits: the ages go on from there.
            undelivered_age: AgeWriter::new(&metrics.oldest_undelivered),
            lag_age: AgeWriter::new(&metrics.oldest_unacknowledged_commit),
            metrics,
        }
    }

    /// What this attempt counted so far.
    pub(super) fn progress(&self) -> Progress {
        self.progress
    }

    /// The position up to which every transaction was delivered (whatever was
    /// acknowledged): for the next session's resume ([`crate::relay::record::Delivered`]).
    pub(super) fn delivered_through(&mut self) -> Lsn {
        self.tracker.delivered_through()
    }

    /// Closes the replication stream politely (bounded by `wait`).
    pub(super) async fn close(self, wait: Duration) {
        self.conn.close(wait).await;
    }
    pub(super) async fn stream(
        &mut self,
        interval: Duration,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), RelayError> {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The heartbeat a standby watches (crate::relay::takeover): a status update at
        // least every `beat`, whatever else the loop is doing; its first tick is now.
        let beat = heartbeat(interval);
        let mut heartbeat = tokio::time::interval(beat);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // One timer each for the owed status update and the owed record, moved only when
        // their due time changes: a timer made anew at every turn of the loop registers
        // with the runtime's clock and wakes its driver, per frame under load.
        let mut status_timer = DueTimer::new();
        let mut record_timer = DueTimer::new();
        loop {
            let reading = self.reading();
            status_timer.arm(self.status_due);
            record_timer.arm(self.record_due);
            tokio::select! {
                biased;
                () = stopped(stop) => {
                    tracing::info!("{}", super::log::SHUTDOWN_REQUESTED);
                    return Ok(());
                }
                _ = heartbeat.tick() => {
                    // Skipped when an update went out within the last half beat (prompt
                    // acknowledgements under load): the gap stays under 1.5 beats.
                    if now().saturating_duration_since(self.last_status_at) >= beat / 2 {
                        self.send_status(false).await?;
                    }
                }
                Some(notice) = self.notices.recv() => {
                    self.on_notice(notice)?;
                    // The reports that came meanwhile, in the same turn: one pump and one
                    // look at the acknowledged position for all of them.
                    self.take_ready_notices()?;
                    self.pump()?;
                    self.report_progress_promptly().await?;
                }
                Some(report) = self.watch.next_report() => {
                    self.on_watch_report(report)?;
                    self.report_progress_promptly().await?;
                }
                () = status_timer.elapsed(), if self.status_due.is_some() => {
                    self.status_due = None;
                    self.send_status(false).await?;
                }
                () = record_timer.elapsed(), if self.record_due.is_some() => {
                    self.record_due = None;
                    self.record_position();
                }
                _ = timer.tick() => {
                    // The loop turns: /healthz stays good for a few more intervals.
                    let deadline = unix_ms_now().saturating_add(
                        u64::try_from((interval * HEALTHY_TICKS).as_millis()).unwrap_or(u64::MAX),
                    );
                    Metrics::set(&self.metrics.health.loop_deadline_unix_ms, deadline);
                    self.pump()?;
                    let probe = self.check_liveness(reading)?;
                    self.send_status(probe).await?;
                    self.log_progress();
                }
                event = self.conn.next_event(), if reading => {
                    self.liveness.received(now());
                    let event = match event {
                        Ok(event) => event,
                        Err(error) => return Err(self.stream_failed(error).await),
                    };
                    self.on_copy_event(event).await?;
                    // The frames already received, in the same turn while there is room:
                    // one turn per read from the socket, not per frame. Bounded, so that
                    // delivery reports (which free the room) are taken between batches.
                    for _ in 1..FRAMES_PER_TURN {
                        if !self.reading() {
                            break;
                        }
                        let buffered = match self.conn.buffered_event() {
                            Ok(buffered) => buffered,
                            Err(error) => return Err(self.stream_failed(error).await),
                        };
                        match buffered {
                            Some(event) => self.on_copy_event(event).await?,
                            None => break,
                        }
                    }
                }
            }
        }
    }

    /// Whether the loop reads from PostgreSQL now: nothing waits to be sent, and the
    /// in-flight bounds have room.
    fn reading(&self) -> bool {
        self.waiting.is_empty() && self.tracker.has_room(self.limits)
    }

    /// Called on every status tick ([`Liveness::tick`]); returns whether this status
    /// update should ask PostgreSQL for a reply.
    fn check_liveness(&mut self, reading: bool) -> Result<bool, RelayError> {
        let now = now();
        let oldest_undelivered = self.tracker.oldest_undelivered_age(now);
        self.update_ages();
        let tick = TickInput {
            reading,
            watch_waiting: self.watch.waiting_for(now),
            oldest_undelivered,
            in_flight: self.tracker.in_flight(),
        };
        Ok(self.liveness.tick(now, tick)?)
    }

    /// Store since when the oldest undelivered event and the oldest unacknowledged
    /// transaction wait; the gauges compute their ages when read, so they stay true
    /// while the loop is stalled or between attempts (`metrics::age`).
    fn update_ages(&mut self) {
        let now_ms = unix_ms_now();
        let waiting_since = self
            .tracker
            .oldest_undelivered_age(now())
            .map(|age| now_ms.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)));
        let acknowledged = self.last_reported.0;
        let received = self.tracker.received().0;
        self.undelivered_age.update(
            &self.metrics.oldest_undelivered,
            waiting_since,
            acknowledged,
            received,
        );
        let committed_at = self
            .commit_times
            .oldest_commit_ms()
            .map(|ms| u64::try_from(ms).unwrap_or(0));
        self.lag_age.update(
            &self.metrics.oldest_unacknowledged_commit,
            committed_at,
            acknowledged,
            received,
        );
    }
}

/// At most this many frames are handled in one turn of the loop (the first one and those
/// already in the receive buffer after it).
const FRAMES_PER_TURN: usize = 256;

/// A timer for a due time that changes now and then: the `Sleep` is made once and moved
/// only when the due time changes.
struct DueTimer {
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
    armed: Option<tokio::time::Instant>,
}

impl DueTimer {
    fn new() -> Self {
        DueTimer {
            // Never polled before `arm` gives it a due time (its branch is disabled).
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }

    /// Fire at `due` (nothing when `None`: the caller's branch is then disabled).
    fn arm(&mut self, due: Option<tokio::time::Instant>) {
        if let Some(due) = due {
            if self.armed != Some(due) {
                self.sleep.as_mut().reset(due);
                self.armed = Some(due);
            }
        }
    }

    async fn elapsed(&mut self) {
        self.sleep.as_mut().await;
    }
}

/// The loop's clock: tokio's, so that the timers and every duration the loop measures
/// (liveness, prompt updates, the watch's gaps, send times) read the same clock, which
/// the unit tests pause and move. Outside tests it is the monotonic clock itself.
pub(super) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Now, in PostgreSQL's timestamp form.
pub(super) fn now_pg() -> PgTimestamp {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    PgTimestamp(micros - 946_684_800_000_000)
}
