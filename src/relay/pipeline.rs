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
//! after the one it waited for (at most [`FRAMES_PER_TURN`], the bounds checked before
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
//! The loop and the stream's steps are here; the sink side (queueing, pumping, notices,
//! dead letters) is `pipeline/deliveries.rs`, status updates and the ends of an attempt
//! (settle, drain) `pipeline/status.rs`, logical decoding messages
//! `pipeline/messages.rs`. Every state transition lives in the pure parts (`txn`,
//! `router`, `ack`, `deadletter`); this loop only moves values between them. Retryable failures end the
//! attempt; [`crate::relay::run`] starts a new one from the slot's acknowledged
//! position, so anything in flight is sent again (at-least-once) and nothing is skipped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};

use crate::metrics::{unix_ms_now, AgeWriter, Metrics};
use crate::pg::conn::{CopyEvent, DbError, PgConnection, PgError};
use crate::pg::diagnose;
use crate::pg::pgoutput::{self, PgTimestamp, StreamState};
use crate::pg::replication::ReplicationFrame;
use crate::pg::Lsn;
use crate::relay::ack::{AckTracker, InFlightLimits};
use crate::relay::lag::CommitTimes;
use crate::relay::liveness::{Liveness, TickInput};
use crate::relay::record::{Recorder, Resume};
use crate::relay::router::OutboxEvent;
use crate::relay::takeover::heartbeat;
use crate::relay::txn::{Step, TxnAssembler};
use crate::relay::watch::OutboxWatch;
use crate::relay::RelayError;
use crate::sink::checkpoint::{skip_for, Checkpoint, Skip};
use crate::sink::{RecordTag, Sink, SinkNotice};

mod deliveries;
mod messages;
mod status;

/// `/healthz` fails when the loop has not turned for this many status intervals.
pub(super) const HEALTHY_TICKS: u32 = 3;
/// How long closing the connection politely may take at shutdown.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// An attempt that ran this long resets the backoff: the fault was not persistent.
pub(super) const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);

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

pub(super) struct Pipeline {
    pub(super) conn: PgConnection,
    pub(super) sink: Box<dyn Sink>,
    pub(super) notices: mpsc::UnboundedReceiver<SinkNotice>,
    pub(super) tracker: AckTracker,
    pub(super) assembler: TxnAssembler,
    /// `[relay] max_in_flight` and `max_in_flight_bytes`.
    pub(super) limits: InFlightLimits,
    pub(super) dead_letter_topic: Option<String>,
    /// The outbox table, for dead-letter headers.
    pub(super) source_table: String,
    /// The publication streamed from, to recognise notices about it (and for the
    /// repair advice when the watch sees a change).
    pub(super) publication: String,
    /// Records not yet handed to the sink, in order: waiting for their topic to be
    /// created (off the loop) or for producer queue room. Input pauses meanwhile.
    pub(super) waiting: VecDeque<Waiting>,
    pub(super) progress: Progress,
    pub(super) logged: Progress,
    /// When PostgreSQL, the watch or the sink is taken for dead.
    pub(super) liveness: Liveness,
    /// Commit times of the transactions not yet acknowledged (lag and latency).
    pub(super) commit_times: CommitTimes,
    pub(super) metrics: Arc<Metrics>,
    /// When the last status update went out, and the flush position it carried.
    pub(super) last_status_at: Instant,
    pub(super) last_reported: Lsn,
    /// When to write the acknowledged position into the state table.
    pub(super) recorder: Recorder,
    /// A record owed, due at this instant.
    pub(super) record_due: Option<tokio::time::Instant>,
    /// Skipping what the state table's record shows delivered (`committed` was built
    /// from it): counted until the first transaction past it.
    pub(super) resume: Option<Resume>,
    /// The open transaction carried an event (or a dead letter).
    pub(super) txn_had_events: bool,
    /// A status update owed for a moved position, due at this instant.
    pub(super) status_due: Option<tokio::time::Instant>,
    /// Vouches for the positions acknowledged (the outbox is still published).
    pub(super) watch: OutboxWatch,
    /// For the repair advice when the watch sees a change.
    pub(super) table: crate::pg::sql::QualifiedName,
    /// Exactly-once: the last checkpoint Kafka committed before this session; the
    /// transactions it covers are skipped ([`skip_for`]).
    pub(super) committed: Option<Checkpoint>,
    /// Events of the open transaction still to skip (`u64::MAX`: all of them).
    pub(super) skip_left: u64,
    /// Writers of `metrics.oldest_undelivered` and `metrics.oldest_unacknowledged_commit`
    /// (carried over from earlier attempts).
    pub(super) undelivered_age: AgeWriter,
    pub(super) lag_age: AgeWriter,
}

impl Pipeline {
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
                    if self.last_status_at.elapsed() >= beat / 2 {
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
                event = self.conn.next_copy_event(), if reading => {
                    self.liveness.received(Instant::now());
                    self.on_copy_event(event?).await?;
                    // The frames already received, in the same turn while there is room:
                    // one turn per read from the socket, not per frame. Bounded, so that
                    // delivery reports (which free the room) are taken between batches.
                    for _ in 1..FRAMES_PER_TURN {
                        if !self.reading() {
                            break;
                        }
                        match self.conn.buffered_copy_event()? {
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

    async fn on_copy_event(&mut self, event: CopyEvent) -> Result<(), RelayError> {
        match event {
            CopyEvent::Frame(ReplicationFrame::XLogData(xlog)) => {
                let message = pgoutput::decode(&xlog.data, StreamState::Outside)?;
                let step = self.assembler.apply(message, xlog.wal_start)?;
                self.on_step(step)?;
            }
            CopyEvent::Frame(ReplicationFrame::Keepalive(keepalive)) => {
                self.tracker.keepalive(keepalive.wal_end);
                if keepalive.reply_requested {
                    self.send_status(false).await?;
                }
            }
            CopyEvent::Notice(notice) => self.on_server_notice(notice)?,
            CopyEvent::Done => return Err(RelayError::StreamEnded),
        }
        Ok(())
    }

    /// Called on every status tick ([`Liveness::tick`]); returns whether this status
    /// update should ask PostgreSQL for a reply.
    fn check_liveness(&mut self, reading: bool) -> Result<bool, RelayError> {
        let now = Instant::now();
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
            .oldest_undelivered_age(Instant::now())
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

    /// A notice in the middle of the stream is logged; one saying that PostgreSQL skips
    /// changes because the publication is missing (PostgreSQL 18) stops the relay
    /// before anything after it is acknowledged, as the ERROR of earlier versions does.
    fn on_server_notice(&mut self, notice: DbError) -> Result<(), RelayError> {
        if diagnose::skips_publication(&notice, &self.publication) {
            return Err(RelayError::Pg(PgError::Db(notice)));
        }
        tracing::warn!(notice = %notice, "PostgreSQL sent a notice on the replication stream");
        Ok(())
    }

    fn on_step(&mut self, step: Step) -> Result<(), RelayError> {
        match step {
            Step::Begin {
                seq,
                commit_ts_ms,
                final_lsn,
            } => {
                self.tracker.begin(seq)?;
                self.commit_times.begin(seq, commit_ts_ms);
                let skip = skip_for(self.committed.as_ref(), final_lsn);
                self.count_resume(&skip);
                self.skip_left = skip.events();
                let skipped = match skip {
                    Skip::First(n) => {
                        tracing::info!(
                            commit_lsn = %final_lsn,
                            committed_events = n,
                            "{}",
                            super::log::RESUMING_SPLIT
                        );
                        n
                    }
                    Skip::All | Skip::Nothing => 0,
                };
                self.sink.transaction_begin(final_lsn, skipped);
            }
            Step::Event { .. } if self.skip_committed() => {
                // Skipped on the strength of the record or of this process's memory
                // (crate::relay::record): once acknowledged, its position is recorded
                // like any delivered transaction's, so that a process started after a
                // later fault does not send it again. (What the record itself covers
                // is not written twice: the recorder starts from it.)
                if self.resume.is_some() {
                    self.txn_had_events = true;
                }
            }
            Step::Event { seq, event } => {
                self.txn_had_events = true;
                match event {
                    Ok(event) => self.dispatch(event, seq)?,
                    Err(row_error) => self.dead_letter_row(row_error, seq)?,
                }
                if !self.tracker.has_room(self.limits) || !self.waiting.is_empty() {
                    // About to stop reading: make sure what is buffered can be delivered.
                    self.sink.flush()?;
                }
            }
            Step::Commit { seq, end_lsn } => {
                self.tracker.commit(seq, end_lsn)?;
                self.commit_times.commit(seq, end_lsn);
                if self.txn_had_events {
                    self.recorder.event_commit(end_lsn);
                    self.txn_had_events = false;
                }
                self.progress.transactions += 1;
                Metrics::add(&self.metrics.transactions, 1);
                self.skip_left = 0;
                self.sink.transaction_end(end_lsn)?;
            }
            Step::Message { .. }
            | Step::Standalone { .. }
            | Step::Refused { .. }
            | Step::Ignored => self.on_message_step(step)?,
            Step::Nothing => {}
        }
        Ok(())
    }

    /// Whether the next event of the open transaction is one Kafka committed before
    /// this session (exactly-once checkpoint): then it is dropped here, and counted.
    pub(super) fn skip_committed(&mut self) -> bool {
        if self.skip_left == 0 {
            return false;
        }
        if self.skip_left != u64::MAX {
            self.skip_left -= 1;
        }
        match &mut self.resume {
            Some(resume) => {
                resume.events += 1;
                Metrics::add(&self.metrics.skipped_recorded, 1);
            }
            None => Metrics::add(&self.metrics.skipped_committed, 1),
        }
        true
    }

    /// While resuming from the state table's record: count a skipped transaction, or
    /// log the range skipped at the first transaction past it.
    fn count_resume(&mut self, skip: &Skip) {
        let Some(resume) = &mut self.resume else {
            return;
        };
        if matches!(skip, Skip::All) {
            resume.transactions += 1;
            return;
        }
        log_resume(resume, false);
        self.resume = None;
    }

    /// The session ends (cut, stopped) before any transaction past the recorded range:
    /// log what it skipped so far, which the first transaction past it would have.
    pub(super) fn log_unfinished_resume(&mut self) {
        if let Some(resume) = self.resume.take() {
            if resume.transactions > 0 || resume.events > 0 {
                log_resume(&resume, true);
            }
        }
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

/// The range a session skipped because the state table's record showed it delivered;
/// `ended_inside`: the session ended before passing the recorded position.
fn log_resume(resume: &Resume, ended_inside: bool) {
    tracing::info!(
        from = %resume.from,
        through = %resume.through,
        transactions = resume.transactions,
        events = resume.events,
        ended_inside_the_range = ended_inside,
        "skipped the transactions between the slot's position and what the relay had delivered (its record, or what this process remembers): delivered before the slot rewound"
    );
}

/// Now, in PostgreSQL's timestamp form.
pub(super) fn now_pg() -> PgTimestamp {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    PgTimestamp(micros - 946_684_800_000_000)
}
