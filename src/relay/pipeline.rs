//! The pipeline loop: replication stream in, events to the sink, delivery notices to the
//! ack tracker, status updates out.
//!
//! One `biased` select, priorities in order:
//! 1. shutdown: stop reading, drain in-flight deliveries (bounded), final status update;
//! 2. sink notices: they free in-flight room and move the flush LSN;
//! 3. the status timer: keeps the walsender alive even while reading is paused;
//! 4. new input from PostgreSQL, only while fewer than `max_in_flight` events are
//!    undelivered and nothing waits for producer queue room (backpressure by not
//!    reading).
//!
//! Every state transition lives in the pure parts (`txn`, `router`, `ack`,
//! `deadletter`); this loop only moves values between them. Retryable failures end the
//! attempt; [`run`] starts a new one from the slot's acknowledged position, so anything
//! in flight is sent again (at-least-once) and nothing is skipped.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};

use crate::config::{SinkKind, Validated};
use crate::metrics::Metrics;
use crate::pg::conn::{CopyEvent, PgConnection, PgError, SessionKind};
use crate::pg::pgoutput::{self, PgTimestamp, StreamState};
use crate::pg::replication::{ReplicationFrame, StandbyStatusUpdate};
use crate::pg::slot::{self, SetupError, SourceSpec};
use crate::pg::Lsn;
use crate::relay::ack::AckTracker;
use crate::relay::backoff::Backoff;
use crate::relay::deadletter::DeadLetter;
use crate::relay::router::{OutboxEvent, Router};
use crate::relay::txn::{RoutedRowError, Step, TxnAssembler};
use crate::relay::RelayError;
use crate::sink::kafka::KafkaSink;
use crate::sink::stdout::StdoutSink;
use crate::sink::{SendError, Sink, SinkError, SinkNotice, TxnSeq};

/// Status updates never less often than this fraction of `wal_sender_timeout`.
const STATUS_FRACTION_OF_TIMEOUT: u32 = 3;
/// Floor of the status interval, so a tiny `wal_sender_timeout` cannot make us spin.
const MIN_STATUS_INTERVAL: Duration = Duration::from_millis(100);
/// How long closing the connection politely may take at shutdown.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Silence allowed when the server has no `wal_sender_timeout` to go by.
const DEFAULT_RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// An attempt that ran this long resets the backoff: the fault was not persistent.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);

/// The status update interval: the configured bound, kept under a third of the
/// server's `wal_sender_timeout` (0 = disabled on the server).
pub fn status_interval(configured: Duration, wal_sender_timeout: Option<Duration>) -> Duration {
    let interval = match wal_sender_timeout {
        Some(timeout) if !timeout.is_zero() => configured.min(timeout / STATUS_FRACTION_OF_TIMEOUT),
        _ => configured,
    };
    interval.max(MIN_STATUS_INTERVAL)
}

/// How long PostgreSQL may stay silent, although asked to reply, before the link is
/// taken for dead: the configured value, else the server's `wal_sender_timeout` (the
/// server gives up on us after as long), never less than three status intervals.
pub fn receive_timeout(
    configured: Option<Duration>,
    wal_sender_timeout: Option<Duration>,
    interval: Duration,
) -> Duration {
    let derived = match wal_sender_timeout {
        Some(timeout) if !timeout.is_zero() => timeout,
        _ => DEFAULT_RECEIVE_TIMEOUT,
    };
    configured.unwrap_or(derived).max(interval * 3)
}

/// Run the relay until `shutdown` resolves (graceful: `Ok`) or a definite error.
/// Retryable errors restart the pipeline with capped, jittered backoff.
pub async fn run(
    settings: Validated,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let metrics = Metrics::new();
    let _metrics_server = match &settings.config.metrics {
        Some(config) => {
            let listener = tokio::net::TcpListener::bind(&config.listen)
                .await
                .map_err(|e| {
                    RelayError::Metrics(format!("cannot listen on {}: {e}", config.listen))
                })?;
            tracing::info!(listen = %config.listen, "serving Prometheus metrics on /metrics");
            Some(AbortOnDrop(tokio::spawn(crate::metrics::serve(
                listener,
                Arc::clone(&metrics),
            ))))
        }
        None => None,
    };
    let mut backoff = Backoff::from_clock();
    let mut timeline = None;
    loop {
        let started = Instant::now();
        let error = match run_attempt(&settings, stop.clone(), &mut timeline, &metrics).await {
            Ok(()) => return Ok(()),
            Err(error) if error.is_retryable() => error,
            Err(error) => return Err(error),
        };
        Metrics::add(&metrics.restarts, 1);
        if started.elapsed() > BACKOFF_RESET_AFTER {
            backoff.reset();
        }
        let delay = backoff.next_delay();
        let retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        if error.slot_in_use() {
            // A standby relay: another instance streams from the slot; take over when
            // it goes away.
            tracing::info!(error = %error, retry_in_ms, "replication slot is in use by another process; waiting");
        } else {
            tracing::warn!(
                error = %error,
                retry_in_ms,
                "relay interrupted; retrying (streaming resumes from the slot's acknowledged position)"
            );
        }
        let mut stop = stop.clone();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(&mut stop) => return Ok(()),
        }
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Resolves once shutdown was requested.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|requested| *requested).await.is_err() {
        // The shutdown sender is gone without a request: never resolve.
        std::future::pending::<()>().await;
    }
}

/// The sinks this build knows. An enum rather than a trait object because creating a
/// topic is async and only Kafka has topics.
enum AnySink {
    Stdout(StdoutSink<std::io::Stdout>),
    Kafka(Box<KafkaSink>),
}

impl AnySink {
    fn sink(&mut self) -> &mut dyn Sink {
        match self {
            AnySink::Stdout(sink) => sink,
            AnySink::Kafka(sink) => sink.as_mut(),
        }
    }

    async fn ensure_topic(&mut self, topic: &str) -> Result<(), SinkError> {
        match self {
            AnySink::Stdout(_) => Ok(()),
            AnySink::Kafka(sink) => sink.ensure_topic(topic).await,
        }
    }
}

/// Counters for progress logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Progress {
    events: u64,
    dead_lettered: u64,
    transactions: u64,
    flush_lsn: Lsn,
}

struct Pipeline {
    conn: PgConnection,
    sink: AnySink,
    notices: mpsc::UnboundedReceiver<SinkNotice>,
    tracker: AckTracker,
    assembler: TxnAssembler,
    max_in_flight: u64,
    dead_letter_topic: Option<String>,
    /// The outbox table, for dead-letter headers.
    source_table: String,
    /// Events the producer queue had no room for, in order; input pauses meanwhile.
    stalled: VecDeque<(OutboxEvent, TxnSeq)>,
    progress: Progress,
    logged: Progress,
    /// When the last message arrived from PostgreSQL (while reading).
    last_received: Instant,
    /// When a delivery was last confirmed, or nothing was in flight.
    last_progress: Instant,
    receive_timeout: Duration,
    stall_release: Duration,
    metrics: Arc<Metrics>,
}

/// One attempt: connect, prepare, stream until shutdown (`Ok`) or an error.
async fn run_attempt(
    settings: &Validated,
    mut stop: watch::Receiver<bool>,
    timeline: &mut Option<u32>,
    metrics: &Arc<Metrics>,
) -> Result<(), RelayError> {
    let config = &settings.config;
    let spec = SourceSpec {
        slot: config.postgres.slot.clone(),
        publication: config.postgres.publication.clone(),
        table: settings.table.clone(),
    };
    let router = Router::try_new(&config.outbox).map_err(|problems| {
        RelayError::Config(crate::config::ConfigError::Invalid {
            path: "[outbox]".into(),
            problems,
        })
    })?;
    let user = settings.connect.user.as_str();
    let explain = |error: PgError| RelayError::from(slot::explain_server_error(error, &spec, user));
    let mut conn = PgConnection::connect(&settings.connect, SessionKind::LogicalReplication)
        .await
        .map_err(explain)?;
    let prepared = match slot::prepare(&mut conn, &spec).await {
        Ok(prepared) => prepared,
        Err(SetupError::Pg(error)) => return Err(explain(error)),
        Err(other) => return Err(other.into()),
    };
    match *timeline {
        Some(from) if from != prepared.timeline => {
            return Err(RelayError::TimelineChanged {
                from,
                to: prepared.timeline,
            })
        }
        _ => *timeline = Some(prepared.timeline),
    }

    let (notice_tx, notices) = mpsc::unbounded_channel();
    let dead_letter_topic = config.dead_letter.as_ref().map(|d| d.topic.clone());
    let mut sink = match config.sink.kind {
        SinkKind::Stdout => AnySink::Stdout(StdoutSink::stdout(notice_tx)),
        SinkKind::Kafka => {
            let kafka = config.kafka.as_ref().ok_or_else(|| {
                SinkError::KafkaSetup("[sink] type = \"kafka\" needs a [kafka] section".into())
            })?;
            AnySink::Kafka(Box::new(KafkaSink::new(
                kafka,
                notice_tx,
                config.relay.max_in_flight,
                dead_letter_topic.is_some(),
            )?))
        }
    };
    if let Some(topic) = &dead_letter_topic {
        // Fail fast: a dead-letter topic that cannot take records is a setup error.
        sink.ensure_topic(topic).await?;
    }

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
        .await
        .map_err(explain)?;

    let interval = status_interval(
        Duration::from_millis(config.postgres.status_interval_ms),
        prepared.wal_sender_timeout,
    );
    let receive_timeout = receive_timeout(
        config
            .postgres
            .receive_timeout_ms
            .map(Duration::from_millis),
        prepared.wal_sender_timeout,
        interval,
    );
    let start = Progress {
        flush_lsn: prepared.slot_lsn,
        ..Progress::default()
    };
    let mut pipeline = Pipeline {
        conn,
        sink,
        notices,
        tracker: AckTracker::new(prepared.slot_lsn, 0),
        assembler: TxnAssembler::new(router, settings.table.clone(), 0),
        max_in_flight: u64::try_from(config.relay.max_in_flight).unwrap_or(u64::MAX),
        dead_letter_topic,
        source_table: settings.table.to_string(),
        stalled: VecDeque::new(),
        progress: start,
        logged: start,
        last_received: Instant::now(),
        last_progress: Instant::now(),
        receive_timeout,
        stall_release: Duration::from_millis(config.relay.stall_release_ms),
        metrics: Arc::clone(metrics),
    };
    pipeline
        .stream(interval, &mut stop)
        .await
        .map_err(|error| match error {
            RelayError::Pg(pg) => explain(pg),
            other => other,
        })?;
    pipeline.drain(settings.shutdown_timeout()).await?;
    tracing::info!(
        events = pipeline.progress.events,
        dead_lettered = pipeline.progress.dead_lettered,
        flush_lsn = %pipeline.progress.flush_lsn,
        "stopped"
    );
    pipeline.conn.close(CLOSE_WAIT).await;
    Ok(())
}

impl Pipeline {
    async fn stream(
        &mut self,
        interval: Duration,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), RelayError> {
        let mut timer = tokio::time::interval(interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let reading = self.stalled.is_empty() && self.tracker.in_flight() < self.max_in_flight;
            tokio::select! {
                biased;
                () = stopped(stop) => {
                    tracing::info!("shutdown requested: no more reading, draining deliveries");
                    return Ok(());
                }
                Some(notice) = self.notices.recv() => {
                    self.last_progress = Instant::now();
                    self.on_notice(notice)?;
                    self.retry_stalled()?;
                }
                _ = timer.tick() => {
                    self.retry_stalled()?;
                    let probe = self.check_liveness(reading, interval)?;
                    self.send_status(probe).await?;
                    self.log_progress();
                }
                event = self.conn.next_copy_event(), if reading => {
                    self.last_received = Instant::now();
                    match event? {
                        CopyEvent::Frame(ReplicationFrame::XLogData(xlog)) => {
                            let message = pgoutput::decode(&xlog.data, StreamState::Outside)?;
                            let step = self.assembler.apply(message, xlog.wal_start)?;
                            self.on_step(step).await?;
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

    /// Called on every status tick. Fails when PostgreSQL went silent although asked to
    /// reply, or when the sink has made no progress for `stall_release`; returns
    /// whether this status update should ask PostgreSQL for a reply.
    fn check_liveness(&mut self, reading: bool, interval: Duration) -> Result<bool, RelayError> {
        let now = Instant::now();
        if !reading {
            // Nothing is read while paused, so silence proves nothing.
            self.last_received = now;
        }
        let silent = now.duration_since(self.last_received);
        if silent > self.receive_timeout {
            return Err(RelayError::Silent {
                secs: silent.as_secs(),
            });
        }
        let in_flight = self.tracker.in_flight();
        if in_flight == 0 {
            self.last_progress = now;
        }
        let stalled = now.duration_since(self.last_progress);
        if stalled > self.stall_release {
            return Err(RelayError::SinkStalled {
                secs: stalled.as_secs(),
                in_flight,
            });
        }
        Ok(reading && silent >= interval)
    }

    async fn on_step(&mut self, step: Step) -> Result<(), RelayError> {
        match step {
            Step::Begin { seq } => self.tracker.begin(seq)?,
            Step::Event { seq, event } => {
                match event {
                    Ok(event) => self.dispatch(event, seq).await?,
                    Err(row_error) => self.dead_letter_row(row_error, seq)?,
                }
                if self.tracker.in_flight() >= self.max_in_flight {
                    // About to stop reading: make sure what is buffered can be delivered.
                    self.sink.sink().flush()?;
                }
            }
            Step::Commit { seq, end_lsn } => {
                self.tracker.commit(seq, end_lsn)?;
                self.progress.transactions += 1;
                Metrics::add(&self.metrics.transactions, 1);
                self.sink.sink().flush()?;
            }
            Step::Nothing => {}
        }
        Ok(())
    }

    /// Route one event to its topic, creating the topic first when needed.
    async fn dispatch(&mut self, event: OutboxEvent, seq: TxnSeq) -> Result<(), RelayError> {
        match self.sink.ensure_topic(&event.topic).await {
            Ok(()) => {}
            Err(SinkError::Topic { topic, reason }) => {
                let reason = format!("topic {topic:?}: {reason}");
                let letter = DeadLetter::from_event(&event, reason.clone(), &self.source_table());
                return self.dead_letter_or(seq, letter, || RelayError::Undeliverable {
                    topic: event.topic.clone(),
                    lsn: event.lsn,
                    reason,
                });
            }
            Err(other) => return Err(other.into()),
        }
        self.tracker.event_sent(seq)?;
        self.progress.events += 1;
        Metrics::add(&self.metrics.events, 1);
        self.submit(event, seq)
    }

    /// Hand a counted event to the sink; no room → it waits in `stalled`.
    fn submit(&mut self, event: OutboxEvent, seq: TxnSeq) -> Result<(), RelayError> {
        if let Some(waiting) = self.try_send(event, seq)? {
            self.stalled.push_back(waiting);
        }
        Ok(())
    }

    /// Returns the event back when the producer queue is full.
    fn try_send(
        &mut self,
        event: OutboxEvent,
        seq: TxnSeq,
    ) -> Result<Option<(OutboxEvent, TxnSeq)>, RelayError> {
        match self.sink.sink().send(event, seq) {
            Ok(()) => Ok(None),
            Err(SendError::QueueFull(event)) => Ok(Some((*event, seq))),
            Err(SendError::Refused { reason, event }) => {
                self.refused(seq, *event, reason)?;
                Ok(None)
            }
            Err(SendError::Sink(error)) => Err(error.into()),
        }
    }

    /// Retry events that found the producer queue full, in order.
    fn retry_stalled(&mut self) -> Result<(), RelayError> {
        while let Some((event, seq)) = self.stalled.pop_front() {
            if let Some(waiting) = self.try_send(event, seq)? {
                self.stalled.push_front(waiting);
                break;
            }
        }
        Ok(())
    }

    /// A counted event was refused for good: settle it through the dead-letter topic,
    /// or stop without acknowledging it.
    fn refused(
        &mut self,
        seq: TxnSeq,
        event: OutboxEvent,
        reason: String,
    ) -> Result<(), RelayError> {
        if self.dead_letter_topic.as_deref() == Some(event.topic.as_str()) {
            if event.payload.is_some() {
                // The dead-letter record itself is too large or malformed: keep the
                // headers (reason, source position, id) and drop the value.
                tracing::warn!(reason = %reason, "dead-letter record refused; sending it without its value");
                let mut bare = event;
                bare.payload = None;
                return self.submit(bare, seq);
            }
            return Err(RelayError::DeadLetterRefused(reason));
        }
        let letter = DeadLetter::from_event(&event, reason.clone(), &self.source_table());
        self.dead_letter_or(seq, letter, || RelayError::Undeliverable {
            topic: event.topic.clone(),
            lsn: event.lsn,
            reason,
        })?;
        // The original event is settled by its dead-letter record.
        self.tracker.delivered(seq)?;
        Ok(())
    }

    fn dead_letter_row(
        &mut self,
        row_error: RoutedRowError,
        seq: TxnSeq,
    ) -> Result<(), RelayError> {
        let letter = DeadLetter {
            reason: row_error.error.to_string(),
            source_table: row_error.table.clone(),
            source_lsn: row_error.lsn,
            original_topic: None,
            key: None,
            headers: Vec::new(),
            value: Some(row_error.row_json.clone()),
            timestamp_ms: 0,
        };
        self.dead_letter_or(seq, letter, || RelayError::Route(row_error))
    }

    /// Send `letter` to the dead-letter topic as an event of `seq`, or fail with
    /// `otherwise()` when none is configured.
    fn dead_letter_or(
        &mut self,
        seq: TxnSeq,
        letter: DeadLetter,
        otherwise: impl FnOnce() -> RelayError,
    ) -> Result<(), RelayError> {
        let Some(topic) = self.dead_letter_topic.clone() else {
            return Err(otherwise());
        };
        tracing::warn!(
            reason = %letter.reason,
            source_lsn = %letter.source_lsn,
            dead_letter_topic = %topic,
            "event sent to the dead-letter topic"
        );
        self.tracker.event_sent(seq)?;
        self.progress.dead_lettered += 1;
        Metrics::add(&self.metrics.dead_lettered, 1);
        self.submit(letter.into_event(&topic), seq)
    }

    fn source_table(&self) -> String {
        self.source_table.clone()
    }

    fn on_notice(&mut self, notice: SinkNotice) -> Result<(), RelayError> {
        match notice {
            SinkNotice::Delivered { txn } => self.tracker.delivered(txn)?,
            SinkNotice::Failed { txn, failure } => match failure.event {
                Some(event) => self.refused(txn, *event, failure.reason)?,
                None => {
                    return Err(RelayError::Undeliverable {
                        topic: String::new(),
                        lsn: Lsn::ZERO,
                        reason: failure.reason,
                    })
                }
            },
            SinkNotice::Fatal { reason } => {
                return Err(RelayError::Sink(SinkError::KafkaFatal(reason)))
            }
            SinkNotice::ClientError => {
                if let AnySink::Kafka(kafka) = &self.sink {
                    if let Some(reason) = kafka.fatal_error() {
                        tracing::error!(reason = %reason, "fatal Kafka producer error: rebuilding the producer");
                        return Err(RelayError::Sink(SinkError::KafkaFatal(reason)));
                    }
                }
            }
        }
        Ok(())
    }

    /// Take every notice already waiting.
    fn take_ready_notices(&mut self) -> Result<(), RelayError> {
        while let Ok(notice) = self.notices.try_recv() {
            self.on_notice(notice)?;
        }
        Ok(())
    }

    async fn send_status(&mut self, reply_requested: bool) -> Result<(), RelayError> {
        self.sink.sink().flush()?;
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
        Metrics::set(&self.metrics.flush_lsn, flush.0);
        Metrics::set(&self.metrics.received_lsn, update.write.0);
        Metrics::set(&self.metrics.in_flight, self.tracker.in_flight());
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Metrics::set(&self.metrics.last_status_unix_seconds, unix);
        Ok(())
    }

    fn log_progress(&mut self) {
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

    /// Graceful end: flush the sink, wait (bounded) for in-flight deliveries, and send
    /// a final status update with what is delivered.
    async fn drain(&mut self, timeout: Duration) -> Result<(), RelayError> {
        self.sink.sink().flush()?;
        let deadline = tokio::time::Instant::now() + timeout;
        while self.tracker.in_flight() > 0 {
            self.retry_stalled()?;
            match tokio::time::timeout_at(deadline, self.notices.recv()).await {
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
    fn receive_timeout_follows_the_server_and_covers_three_intervals() {
        let second = Duration::from_secs(1);
        assert_eq!(
            receive_timeout(None, Some(60 * second), 10 * second),
            60 * second
        );
        assert_eq!(
            receive_timeout(None, Some(Duration::ZERO), 10 * second),
            DEFAULT_RECEIVE_TIMEOUT
        );
        assert_eq!(
            receive_timeout(Some(5 * second), Some(60 * second), second),
            5 * second
        );
        assert_eq!(receive_timeout(Some(second), None, second), 3 * second);
    }

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
