//! The pipeline loop: replication stream in, events to the sink, delivery reports to the
//! ack tracker, status updates out.
//!
//! One `biased` select, priorities in order:
//! 1. shutdown: stop reading, drain in-flight deliveries (bounded), final status update;
//! 2. delivery reports: they free in-flight room and move the flush LSN;
//! 3. the status timer: keeps the walsender alive even while reading is paused;
//! 4. new input from PostgreSQL, only while fewer than `max_in_flight` events are
//!    undelivered (backpressure by not reading).
//!
//! Every state transition lives in the pure parts (`txn`, `router`, `ack`); this loop
//! only moves values between them.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use crate::config::{SinkKind, Validated};
use crate::pg::conn::{CopyEvent, PgConnection, SessionKind};
use crate::pg::pgoutput::{self, PgTimestamp, StreamState};
use crate::pg::replication::{ReplicationFrame, StandbyStatusUpdate};
use crate::pg::slot::{self, SourceSpec};
use crate::pg::Lsn;
use crate::relay::ack::AckTracker;
use crate::relay::router::Router;
use crate::relay::txn::{Step, TxnAssembler};
use crate::relay::RelayError;
use crate::sink::stdout::StdoutSink;
use crate::sink::{DeliveryReport, Sink};

/// Status updates never less often than this fraction of `wal_sender_timeout`.
const STATUS_FRACTION_OF_TIMEOUT: u32 = 3;
/// Floor of the status interval, so a tiny `wal_sender_timeout` cannot make us spin.
const MIN_STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// How long closing the connection politely may take at shutdown.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The status update interval: the configured bound, kept under a third of the
/// server's `wal_sender_timeout` (0 = disabled on the server).
pub fn status_interval(configured: Duration, wal_sender_timeout: Option<Duration>) -> Duration {
    let interval = match wal_sender_timeout {
        Some(timeout) if !timeout.is_zero() => configured.min(timeout / STATUS_FRACTION_OF_TIMEOUT),
        _ => configured,
    };
    interval.max(MIN_STATUS_INTERVAL)
}

/// Counters for progress logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Progress {
    events: u64,
    transactions: u64,
    flush_lsn: Lsn,
}

struct Pipeline {
    conn: PgConnection,
    sink: Box<dyn Sink>,
    reports: mpsc::UnboundedReceiver<DeliveryReport>,
    tracker: AckTracker,
    assembler: TxnAssembler,
    max_in_flight: u64,
    progress: Progress,
    logged: Progress,
}

/// Run the relay until `shutdown` resolves (graceful: exit `Ok`) or a fatal error.
pub async fn run(
    settings: Validated,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RelayError> {
    let config = &settings.config;
    let spec = SourceSpec {
        slot: config.postgres.slot.clone(),
        publication: config.postgres.publication.clone(),
        table: settings.table.clone(),
    };
    let mut conn =
        PgConnection::connect(&settings.connect, SessionKind::LogicalReplication).await?;
    let prepared = slot::prepare(&mut conn, &spec).await?;
    tracing::info!(
        server = %settings.connect.redacted(),
        server_version = %prepared.server_version,
        system_id = %prepared.system_id,
        timeline = prepared.timeline,
        slot = %spec.slot,
        slot_created = prepared.slot_created,
        publication = %spec.publication,
        publication_created = prepared.publication_created,
        table = %spec.table,
        start_lsn = %prepared.slot_lsn,
        "starting replication"
    );
    conn.start_copy_both(&slot::start_replication_command(&spec, Lsn::ZERO))
        .await?;

    let interval = status_interval(
        Duration::from_millis(config.postgres.status_interval_ms),
        prepared.wal_sender_timeout,
    );
    let (report_tx, reports) = mpsc::unbounded_channel();
    let sink: Box<dyn Sink> = match config.sink.kind {
        SinkKind::Stdout => Box::new(StdoutSink::stdout(report_tx)),
    };
    let start = Progress {
        flush_lsn: prepared.slot_lsn,
        ..Progress::default()
    };
    let mut pipeline = Pipeline {
        conn,
        sink,
        reports,
        tracker: AckTracker::new(prepared.slot_lsn, 0),
        assembler: TxnAssembler::new(Router::new(&config.outbox), settings.table.clone(), 0),
        max_in_flight: u64::try_from(config.relay.max_in_flight).unwrap_or(u64::MAX),
        progress: start,
        logged: start,
    };
    let outcome = pipeline.stream(interval, shutdown).await;
    match outcome {
        Ok(()) => {
            pipeline.drain(settings.shutdown_timeout()).await?;
            tracing::info!(
                events = pipeline.progress.events,
                flush_lsn = %pipeline.progress.flush_lsn,
                "stopped"
            );
            pipeline.conn.close(CLOSE_WAIT).await;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

impl Pipeline {
    async fn stream(
        &mut self,
        interval: Duration,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), RelayError> {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            let reading = self.tracker.in_flight() < self.max_in_flight;
            tokio::select! {
                biased;
                () = &mut shutdown => {
                    tracing::info!("shutdown requested: no more reading, draining deliveries");
                    return Ok(());
                }
                Some(report) = self.reports.recv() => self.on_report(report)?,
                _ = timer.tick() => {
                    self.send_status(false).await?;
                    self.log_progress();
                }
                event = self.conn.next_copy_event(), if reading => {
                    match event? {
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
                        CopyEvent::Done => return Err(RelayError::StreamEnded),
                    }
                }
            }
        }
    }

    fn on_step(&mut self, step: Step) -> Result<(), RelayError> {
        match step {
            Step::Begin { seq } => self.tracker.begin(seq)?,
            Step::Event { seq, event } => {
                let event = event?;
                self.tracker.event_sent(seq)?;
                self.sink.send(&event, seq)?;
                self.progress.events += 1;
                if self.tracker.in_flight() >= self.max_in_flight {
                    // About to stop reading: make sure what is buffered can be delivered.
                    self.sink.flush()?;
                }
            }
            Step::Commit { seq, end_lsn } => {
                self.tracker.commit(seq, end_lsn)?;
                self.progress.transactions += 1;
                self.sink.flush()?;
            }
            Step::Nothing => {}
        }
        Ok(())
    }

    fn on_report(&mut self, report: DeliveryReport) -> Result<(), RelayError> {
        report.result?;
        self.tracker.delivered(report.txn)?;
        Ok(())
    }

    /// Take every report already waiting.
    fn take_ready_reports(&mut self) -> Result<(), RelayError> {
        while let Ok(report) = self.reports.try_recv() {
            self.on_report(report)?;
        }
        Ok(())
    }

    async fn send_status(&mut self, reply_requested: bool) -> Result<(), RelayError> {
        self.sink.flush()?;
        self.take_ready_reports()?;
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
        Ok(())
    }

    fn log_progress(&mut self) {
        if self.progress != self.logged {
            tracing::info!(
                events = self.progress.events,
                transactions = self.progress.transactions,
                flush_lsn = %self.progress.flush_lsn,
                in_flight = self.tracker.in_flight(),
                "progress"
            );
            self.logged = self.progress;
        }
    }

    /// Graceful end: flush the sink, wait (bounded) for in-flight deliveries, and send
    /// a final status update with what is delivered.
    async fn drain(&mut self, timeout: Duration) -> Result<(), RelayError> {
        self.sink.flush()?;
        let deadline = tokio::time::Instant::now() + timeout;
        while self.tracker.in_flight() > 0 {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(report)) => self.on_report(report)?,
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
        self.send_status(false).await
    }
}

/// Now, in PostgreSQL's timestamp form.
fn now_pg() -> PgTimestamp {
    let micros = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    PgTimestamp(micros - 946_684_800_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_interval_stays_under_a_third_of_the_timeout() {
        let ten = Duration::from_secs(10);
        assert_eq!(status_interval(ten, Some(Duration::from_secs(60))), ten);
        assert_eq!(
            status_interval(ten, Some(Duration::from_secs(6))),
            Duration::from_secs(2)
        );
        assert_eq!(status_interval(ten, Some(Duration::ZERO)), ten);
        assert_eq!(status_interval(ten, None), ten);
        assert_eq!(
            status_interval(ten, Some(Duration::from_millis(30))),
            MIN_STATUS_INTERVAL
        );
    }
}
