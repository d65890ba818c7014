//! The pipeline's status updates and ends: the flush position reported promptly when it
//! moves ([`crate::relay::feedback`]) and on the timers, the outbox watch asked to vouch
//! for what is acknowledged, the acknowledged position recorded in the state table, and
//! the two ways an attempt ends with deliveries in flight: [`Pipeline::settle`] after
//! PostgreSQL went away, [`Pipeline::drain`] at shutdown (with the final status update).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::metrics::Metrics;
use crate::pg::conn::PgError;
use crate::pg::replication::StandbyStatusUpdate;
use crate::relay::feedback::{feedback, Feedback};
use crate::relay::record::RecordStep;
use crate::relay::source::ReplicationStream;
use crate::relay::watch::WatchReport;
use crate::relay::{Definite, RelayError};

use super::{now, now_pg, Pipeline, CLOSE_WAIT};

/// How long a stream that PostgreSQL ended with an error waits for the watch to say
/// whether the outbox changed ([`Pipeline::stream_failed`]): its check is two short
/// queries on a connection that is already open.
const EXPLAIN_WAIT: Duration = Duration::from_secs(5);

impl<S: ReplicationStream> Pipeline<S> {
    /// After a delivery report: when it moved the acknowledged position, send a status
    /// update now, or once [`PROMPT_ACK_GAP`](crate::relay::feedback::PROMPT_ACK_GAP) has
    /// passed since the last one.
    pub(super) async fn report_progress_promptly(&mut self) -> Result<(), RelayError> {
        self.ask_watch();
        let flush = self.tracker.flush_lsn();
        match feedback(flush, self.last_reported, self.last_status_at, now()) {
            Feedback::Idle => {}
            Feedback::SendNow => self.send_status(false).await?,
            Feedback::SendAt(due) => {
                if self.status_due.is_none() {
                    self.status_due = Some(tokio::time::Instant::from_std(due));
                }
            }
        }
        Ok(())
    }

    /// Asks the watch to vouch for what waits to be acknowledged; when it is too soon for
    /// another check, a status update is owed at the time it may ask again.
    pub(super) fn ask_watch(&mut self) {
        if !self.tracker.wants_vouching() {
            return;
        }
        if let Some(next) = self.watch.request(now()) {
            let next = tokio::time::Instant::from_std(next);
            self.status_due = Some(self.status_due.map_or(next, |due| due.min(next)));
        }
    }

    /// A check of the outbox watch came back: raise the vouched bound, or stop.
    pub(super) fn on_watch_report(&mut self, report: WatchReport) -> Result<(), RelayError> {
        match report {
            WatchReport::Vouched(lsn) => {
                self.tracker.vouch(lsn);
                Ok(())
            }
            WatchReport::Changed { change, table } => Err(Definite::OutboxUnpublished {
                repair: change.repair(&self.publication, &self.tables, table.as_ref()),
                change: change.to_string(),
                since: self.tracker.vouched(),
            }
            .into()),
            WatchReport::Failed(error) => Err(RelayError::Pg(error)),
            WatchReport::Invalid(message) => {
                Err(Definite::OutboxChangedWhileStarting(message).into())
            }
        }
    }

    /// PostgreSQL ended the stream with an error of its own (not a lost connection or a
    /// shutdown): a changed outbox explains such an error best, and says from where rows
    /// may be missing, and the stream can end before the watch's check has reported the
    /// change. So the watch is asked now (for at most [`EXPLAIN_WAIT`]); a change it
    /// finds replaces the server's error, which stays otherwise.
    pub(super) async fn stream_failed(&mut self, error: PgError) -> RelayError {
        if !matches!(error, PgError::Db(_)) || error.is_transient() {
            return RelayError::Pg(error);
        }
        let deadline = tokio::time::Instant::now() + EXPLAIN_WAIT;
        // A check under way may have read the catalog before the change: its report does
        // not count, the one asked after it does.
        let mut asked_after_the_error = self.watch.request_now();
        loop {
            match tokio::time::timeout_at(deadline, self.watch.next_report()).await {
                Ok(Some(WatchReport::Vouched(lsn))) => {
                    self.tracker.vouch(lsn);
                    if asked_after_the_error {
                        break;
                    }
                    asked_after_the_error = self.watch.request_now();
                }
                Ok(Some(report @ WatchReport::Changed { .. })) => {
                    if let Err(changed) = self.on_watch_report(report) {
                        return changed;
                    }
                    break;
                }
                // The watch failed too, or did not answer: the server's error stands.
                Ok(Some(WatchReport::Failed(_) | WatchReport::Invalid(_)) | None) | Err(_) => break,
            }
        }
        RelayError::Pg(error)
    }

    /// Writes the acknowledged position into the state table when events were
    /// acknowledged since the last record, at most once per [`RECORD_GAP`](crate::relay::record::RECORD_GAP).
    pub(super) fn record_position(&mut self) {
        let now = now();
        match self.recorder.step(self.last_reported, now) {
            RecordStep::Write(lsn) if self.watch.record(lsn) => self.recorder.written(lsn, now),
            // A write is still queued: try again a gap later.
            RecordStep::Write(_) => self.record_owed_at(now + crate::relay::record::RECORD_GAP),
            RecordStep::At(at) => self.record_owed_at(at),
            RecordStep::Nothing => {}
        }
    }

    pub(super) fn record_owed_at(&mut self, at: Instant) {
        let at = tokio::time::Instant::from_std(at);
        self.record_due = Some(self.record_due.map_or(at, |due| due.min(at)));
    }

    pub(super) async fn send_status(&mut self, reply_requested: bool) -> Result<(), RelayError> {
        self.sink.flush()?;
        self.take_ready_notices()?;
        let flush = self.tracker.flush_lsn();
        self.progress.flush_lsn = flush;
        let update = StandbyStatusUpdate {
            write: self.tracker.received().max(flush),
            flush,
            apply: flush,
            client_time: now_pg(),
            reply_requested,
        };
        tracing::debug!(write = %update.write, flush = %flush, "status update");
        self.conn.send_status(&update).await?;
        self.last_status_at = now();
        self.last_reported = flush;
        self.record_position();
        // This update carries everything acknowledged so far: nothing is owed, unless
        // deliveries wait for the watch to vouch for them (some may have been reported
        // by the flush above, whose notices no other branch sees): ask for a check, or
        // owe an update at the time one may be asked.
        self.status_due = None;
        self.ask_watch();
        Metrics::set(&self.metrics.flush_lsn, flush.0);
        Metrics::set(&self.metrics.received_lsn, update.write.0);
        Metrics::set(
            &self.metrics.replication_lag_bytes,
            update.write.0.saturating_sub(flush.0),
        );
        self.commit_times.acknowledged(flush);
        self.update_ages();
        Metrics::set(&self.metrics.in_flight, self.tracker.in_flight());
        Metrics::set(
            &self.metrics.in_flight_bytes,
            self.tracker.in_flight_bytes(),
        );
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Metrics::set(&self.metrics.last_status_unix_seconds, unix);
        Ok(())
    }

    pub(super) fn log_progress(&mut self) {
        if self.progress != self.logged {
            tracing::info!(
                events = self.progress.events,
                dead_lettered = self.progress.dead_lettered,
                transactions = self.progress.transactions,
                flush_lsn = %self.progress.flush_lsn,
                in_flight = self.tracker.in_flight(),
                "progress"
            );
            self.logged = self.progress;
        }
    }

    /// After PostgreSQL went away: flush the sink and wait for the delivery reports of
    /// what is in flight, so that the next session knows it delivered (nothing is
    /// acknowledged: the connection is gone). A report that ends the sink's session, a
    /// shutdown request, or `timeout` (the stall release: as long as a streaming session
    /// waits for a confirmation) ends the wait. Why wait that long: what the sink has
    /// sent and not yet heard back about is still written by Kafka once the producer is
    /// gone, and the next session would send it again. A chaos run (a CI seed replayed
    /// on a loaded machine) counted 2,074 second copies after a PostgreSQL link cut that
    /// came while the broker, just restarted, took longer than the 2 s this wait used to
    /// be to confirm its backlog.
    pub(in crate::relay) async fn settle(
        &mut self,
        timeout: Duration,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) {
        if self.sink.flush().is_err() || self.tracker.in_flight() == 0 {
            return;
        }
        tracing::info!(
            in_flight = self.tracker.in_flight(),
            wait_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            "PostgreSQL went away with events in flight: waiting for their delivery reports before reconnecting, so that the next session does not send them again"
        );
        let deadline = tokio::time::Instant::now() + timeout;
        // The loop that refreshes /healthz's deadline does not turn meanwhile.
        let mut alive = tokio::time::interval(Duration::from_secs(1));
        while self.tracker.in_flight() > 0 {
            let notice = tokio::select! {
                biased;
                () = super::stopped(stop) => return,
                _ = alive.tick() => {
                    let deadline = crate::metrics::unix_ms_now().saturating_add(3_000);
                    Metrics::set(&self.metrics.health.loop_deadline_unix_ms, deadline);
                    continue;
                }
                notice = tokio::time::timeout_at(deadline, self.notices.recv()) => notice,
            };
            match notice {
                Ok(Some(notice)) => {
                    if self.on_notice(notice).is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(_) => {
                    tracing::warn!(
                        in_flight = self.tracker.in_flight(),
                        "the sink did not confirm what is in flight in time: the next session sends it again, and what Kafka wrote of it arrives twice"
                    );
                    return;
                }
            }
        }
    }

    /// Graceful end: flush the sink, wait (bounded) for in-flight deliveries, and send
    /// a final status update with what is delivered.
    /// The heartbeat goes on meanwhile (every `beat`), so a standby does not take the
    /// slot from a relay that is only waiting for its last deliveries.
    pub(in crate::relay) async fn drain(
        &mut self,
        timeout: Duration,
        beat: Duration,
    ) -> Result<(), RelayError> {
        self.sink.flush()?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + beat, beat);
        while self.tracker.in_flight() > 0 {
            self.pump()?;
            let next = tokio::select! {
                next = tokio::time::timeout_at(deadline, self.notices.recv()) => next,
                _ = heartbeat.tick() => {
                    self.send_status(false).await?;
                    continue;
                }
            };
            match next {
                Ok(Some(notice)) => self.on_notice(notice)?,
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        in_flight = self.tracker.in_flight(),
                        "shutdown timeout: undelivered events are not acknowledged and will be sent again after restart"
                    );
                    break;
                }
            }
        }
        // The final update may acknowledge only what the watch vouched for: ask until it
        // vouches for everything delivered. A check already under way when the shutdown
        // came may have read its position before the last transaction committed, so its
        // report can fall short; the check asked after it cannot (it reads the position
        // after every delivered commit), so this takes at most two rounds.
        self.take_ready_notices()?;
        let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
        while self.tracker.wants_vouching() {
            self.watch.request_now();
            match tokio::time::timeout_at(deadline, self.watch.next_report()).await {
                Ok(Some(report)) => self.on_watch_report(report)?,
                Ok(None) | Err(_) => {
                    tracing::warn!("the outbox check did not answer at shutdown: the last delivered events are acknowledged after the next start");
                    break;
                }
            }
        }
        self.send_status(false).await?;
        // A record still owed (acknowledged within the last RECORD_GAP): written now and
        // awaited, so a rewind of the slot after this stop sends none of it again.
        if self.recorder.owes(self.last_reported) {
            let lsn = self.last_reported;
            if !self.watch.record_and_wait(lsn, CLOSE_WAIT).await {
                tracing::warn!(acknowledged = %lsn, "the last acknowledged position could not be recorded at shutdown: if PostgreSQL rewinds the slot, events acknowledged in the last second are sent again");
            }
        }
        Ok(())
    }
}
