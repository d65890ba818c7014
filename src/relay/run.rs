//! The supervisor: runs pipeline attempts until shutdown, restarting after retryable
//! errors with capped, jittered backoff. An attempt connects, prepares the source
//! (publication, slot, checks), builds the sink and hands them to the
//! [`Pipeline`](super::pipeline) loop; a new attempt starts from the slot's acknowledged
//! position, so nothing in flight is skipped.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::metrics::Metrics;
use crate::pg::conn::{PgConnection, PgError, SessionKind};
use crate::pg::diagnose::{self, SetupError};
use crate::pg::replication::StandbyStatusUpdate;
use crate::pg::slot::{self, PreparedSource, SourceSpec};
use crate::pg::Lsn;
use crate::relay::backoff::Backoff;
use crate::relay::liveness::{receive_timeout, status_interval, LivenessLimits};
use crate::relay::pipeline::{now_pg, stopped, Pipeline, Start, CLOSE_WAIT, HEALTHY_TICKS};
use crate::relay::record::Delivered;
use crate::relay::settings::Settings;
use crate::relay::takeover::{self, heartbeat, SilenceWatch};
use crate::relay::txn::{AssemblerOutbox, AssemblerPattern, TxnAssembler};
use crate::relay::watch::{OutboxWatch, WatchTarget};
use crate::relay::{Definite, RelayError, Transient};
use crate::sink::{Session, SinkOptions};

mod resume;

/// Run the relay until `shutdown` resolves (graceful: `Ok`) or a definite error.
/// Retryable errors restart the pipeline with capped, jittered backoff.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RelayError> {
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let metrics = Metrics::new();
    metrics.name_outboxes(settings.entry_names());
    let _metrics_server = match &settings.metrics {
        Some(config) => {
            let listener = tokio::net::TcpListener::bind(&config.listen)
                .await
                .map_err(|e| {
                    Definite::Metrics(format!("cannot listen on {}: {e}", config.listen))
                })?;
            tracing::info!(listen = %config.listen, "serving Prometheus metrics on /metrics, health on /healthz and /readyz");
            Some(AbortOnDrop(tokio::spawn(crate::metrics::serve(
                listener,
                Arc::clone(&metrics),
            ))))
        }
        None => None,
    };
    let mut backoff = Backoff::from_clock();
    let mut timeline = None;
    // What the last session delivered, for the next one's resume.
    let mut delivered = None;
    let mut waiting_for_slot = false;
    let mut silence = SilenceWatch::default();
    loop {
        let started = Instant::now();
        let attempt = run_attempt(
            &settings,
            stop.clone(),
            &mut timeline,
            &mut delivered,
            &metrics,
            &mut silence,
        );
        let error = match attempt.await {
            Ok(()) => return Ok(()),
            Err(error) if error.is_retryable() => error,
            Err(error) => return Err(error),
        };
        let standby = error.slot_in_use();
        // Ready in Kubernetes' sense while it waits: connected, able to take over.
        Metrics::set(&metrics.health.standby, u64::from(standby));
        if !standby {
            silence.forget();
            // A standby's attempts at the busy slot are waiting, not restarts.
            Metrics::add(&metrics.restarts, 1);
        }
        if backoff.session_ended(started.elapsed()) {
            waiting_for_slot = false;
        }
        let delay = if standby {
            backoff.slot_wait_delay()
        } else {
            backoff.next_delay()
        };
        let retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        if standby {
            // A standby relay: another instance streams from the slot; take over as soon
            // as it goes away. Said once per wait, not at every attempt.
            if !waiting_for_slot {
                tracing::info!(error = %error, "{}", super::log::WAITING_FOR_SLOT);
            }
            waiting_for_slot = true;
        } else {
            waiting_for_slot = false;
            tracing::warn!(
                error = %error,
                retry_in_ms,
                "{}",
                super::log::RETRYING
            );
        }
        let mut stop = stop.clone();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(&mut stop) => return Ok(()),
        }
    }
}

/// Runs `future` unless shutdown is requested first (`None`).
async fn unless_stopped<T>(
    stop: &mut watch::Receiver<bool>,
    future: impl Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        () = stopped(stop) => None,
        value = future => Some(value),
    }
}

/// Marks the metrics' health state as streaming while alive.
struct Streaming<'a>(&'a Metrics);

impl<'a> Streaming<'a> {
    fn start(metrics: &'a Metrics, interval: Duration, stuck_after_ms: u64) -> Self {
        let deadline = crate::metrics::unix_ms_now().saturating_add(
            u64::try_from((interval * HEALTHY_TICKS).as_millis()).unwrap_or(u64::MAX),
        );
        Metrics::set(&metrics.health.loop_deadline_unix_ms, deadline);
        Metrics::set(&metrics.health.stuck_after_ms, stuck_after_ms);
        Metrics::set(&metrics.health.streaming, 1);
        Streaming(metrics)
    }
}

impl Drop for Streaming<'_> {
    fn drop(&mut self) {
        Metrics::set(&self.0.health.streaming, 0);
    }
}

/// Aborts a background task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A standby's look at the relay streaming from the slot ([`takeover`]): ends its
/// walsender when it has been silent past `[postgres] takeover_silence_ms`. The standby
/// waits on whatever the look finds or fails on.
async fn look_at_the_active(
    conn: &mut PgConnection,
    settings: &Settings,
    silence: &mut SilenceWatch,
    metrics: &Metrics,
    stop: &mut watch::Receiver<bool>,
) {
    let postgres = &settings.postgres;
    let Some(limit) = takeover::silence_limit(
        postgres.takeover_silence_ms,
        Duration::from_millis(postgres.status_interval_ms),
    ) else {
        return;
    };
    let look = takeover::look(conn, &postgres.slot, limit, silence, metrics);
    if let Some(Err(error)) = unless_stopped(stop, look).await {
        tracing::debug!(error = %error, "could not look at the walsender streaming from the slot");
    }
}

/// One attempt: connect and prepare the source, start streaming, stream until shutdown
/// (`Ok`) or an error, which is transient or definite ([`RelayError`]): a PostgreSQL
/// error from anywhere in the attempt is explained here, once, by asking the server's
/// catalogs what is wrong ([`diagnose::explain`]; a transient one stays as it is).
async fn run_attempt(
    settings: &Settings,
    stop: watch::Receiver<bool>,
    timeline: &mut Option<(String, u32)>,
    delivered: &mut Option<Delivered>,
    metrics: &Arc<Metrics>,
    silence: &mut SilenceWatch,
) -> Result<(), RelayError> {
    match attempt(settings, stop, timeline, delivered, metrics, silence).await {
        Err(RelayError::Pg(error)) => {
            let spec = settings.source();
            Err(diagnose::explain(error, &settings.connect, &spec)
                .await
                .into())
        }
        ended => ended,
    }
}

/// The attempt itself; PostgreSQL's errors come out of it unexplained.
async fn attempt(
    settings: &Settings,
    mut stop: watch::Receiver<bool>,
    timeline: &mut Option<(String, u32)>,
    delivered: &mut Option<Delivered>,
    metrics: &Arc<Metrics>,
    silence: &mut SilenceWatch,
) -> Result<(), RelayError> {
    let prepared = prepare(settings, &mut stop, timeline, metrics, silence).await;
    let Some((conn, prepared)) = prepared? else {
        return Ok(());
    };
    let started = start_streaming(
        settings,
        &mut stop,
        conn,
        &prepared,
        delivered.as_ref(),
        metrics,
    );
    let Some((mut pipeline, interval)) = started.await? else {
        return Ok(());
    };
    // Streaming from here: /readyz says so until this attempt ends.
    let _streaming = Streaming::start(metrics, interval, settings.relay.stall_release_ms / 2);
    let streamed = pipeline.stream(interval, &mut stop).await;
    pipeline.log_unfinished_resume();
    if let Err(error) = &streamed {
        // PostgreSQL went away (a restart, a cut link) while the sink is sound: what is in
        // flight is still delivered, and the next session skips it (bounded wait).
        if matches!(
            error,
            RelayError::Pg(_) | RelayError::Transient(Transient::StreamEnded)
        ) {
            let wait = Duration::from_millis(settings.relay.stall_release_ms);
            pipeline.settle(wait, &mut stop).await;
        }
        *delivered = Some(Delivered {
            system_id: prepared.system_id.clone(),
            timeline: prepared.timeline,
            through: pipeline.delivered_through(),
        });
    }
    streamed?;
    pipeline
        .drain(settings.shutdown_timeout(), heartbeat(interval))
        .await?;
    let progress = pipeline.progress();
    tracing::info!(
        events = progress.events,
        dead_lettered = progress.dead_lettered,
        flush_lsn = %progress.flush_lsn,
        "stopped"
    );
    pipeline.close(CLOSE_WAIT).await;
    Ok(())
}

/// Connects and prepares the source (publication, slot, checks; [`slot::prepare`]), and
/// checks the server is the cluster and timeline streamed from before. `None`: shutdown
/// was requested meanwhile. A standby relay, finding the slot busy, looks at the relay
/// streaming from it first ([`look_at_the_active`]).
async fn prepare(
    settings: &Settings,
    stop: &mut watch::Receiver<bool>,
    timeline: &mut Option<(String, u32)>,
    metrics: &Arc<Metrics>,
    silence: &mut SilenceWatch,
) -> Result<Option<(PgConnection, PreparedSource)>, RelayError> {
    let spec = settings.source();
    // Every wait before streaming honours a shutdown signal (a server that accepts and
    // never answers must not make SIGTERM wait for it).
    let connect = PgConnection::connect(&settings.connect, SessionKind::LogicalReplication);
    let Some(connected) = unless_stopped(stop, connect).await else {
        return Ok(None);
    };
    let mut conn = connected?;
    let Some(prepared) = unless_stopped(
        stop,
        slot::prepare(&mut conn, &spec, settings.primary.as_ref()),
    )
    .await
    else {
        return Ok(None);
    };
    let prepared = match prepared {
        Ok(prepared) => prepared,
        // Not explained yet: the attempt does that once, for every PostgreSQL error.
        Err(SetupError::Pg(error)) => return Err(RelayError::Pg(error)),
        Err(active @ SetupError::SlotActive { .. }) => {
            look_at_the_active(&mut conn, settings, silence, metrics, stop).await;
            return Err(active.into());
        }
        Err(other) => return Err(other.into()),
    };
    match timeline.as_ref() {
        Some((system_id, _)) if *system_id != prepared.system_id => {
            return Err(Definite::SystemChanged {
                from: system_id.clone(),
                to: prepared.system_id.clone(),
            }
            .into())
        }
        Some((_, from)) if *from != prepared.timeline => {
            // A promotion (failover, or a standby taking over): the slot is here, on the
            // new primary (a PostgreSQL 17 failover slot synchronised to it, or the same
            // server promoted), so streaming goes on from its position. A slot missing
            // here stopped the attempt already (the state table's record).
            tracing::warn!(
                from = *from,
                to = prepared.timeline,
                slot = %spec.slot,
                slot_lsn = %prepared.slot_lsn,
                "PostgreSQL's timeline changed (a promotion or a restore); the slot exists here, continuing from its position"
            );
        }
        _ => {}
    }
    *timeline = Some((prepared.system_id.clone(), prepared.timeline));
    Ok(Some((conn, prepared)))
}

/// Builds the sink, starts replication from the slot's position, begins the sink's
/// session and starts the outbox watch: a pipeline ready to stream, and its status
/// interval. `None`: shutdown was requested meanwhile. Errors of PostgreSQL are returned
/// as they are (the caller explains them).
async fn start_streaming(
    settings: &Settings,
    stop: &mut watch::Receiver<bool>,
    mut conn: PgConnection,
    prepared: &PreparedSource,
    delivered: Option<&Delivered>,
    metrics: &Arc<Metrics>,
) -> Result<Option<(Pipeline, Duration)>, RelayError> {
    let postgres = &settings.postgres;
    let spec = settings.source();
    let (notice_tx, notices) = mpsc::unbounded_channel();
    let mut sink = settings.sink.build(
        notice_tx,
        SinkOptions {
            max_in_flight: settings.relay.max_in_flight,
            max_in_flight_bytes: settings.relay.max_in_flight_bytes,
            keep_events: settings.dead_letter_topic.is_some(),
            metrics: Arc::clone(metrics),
            slot: Some(spec.slot.to_string()),
            partition_column: settings.partition_column(),
        },
    )?;
    if let Some(topic) = &settings.dead_letter_topic {
        // Fail fast: a dead-letter topic that cannot take records is a setup error.
        let Some(ready) = unless_stopped(stop, sink.ensure_topic(topic)).await else {
            return Ok(None);
        };
        ready?;
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
        tables = %if spec.outbox() { prepared_tables(&spec, prepared) } else { "(none: messages only)".to_owned() },
        messages = spec.messages,
        partitioned = %partitioned_tables(prepared),
        failover_slot = prepared.failover_slot,
        start_lsn = %prepared.slot_lsn,
        "{}",
        super::log::STARTING_REPLICATION
    );
    let command = slot::start_replication_command(&spec, Lsn::ZERO);
    let Some(started) = unless_stopped(stop, conn.start_copy_both(&command)).await else {
        return Ok(None);
    };
    started?;
    // The slot is this relay's now: an exactly-once sink fences older producers of its
    // transactional id (not before: a standby must not fence the active relay) and
    // reads the last checkpoint Kafka committed.
    let session = Session {
        slot: spec.slot.to_string(),
        system_id: prepared.system_id.clone(),
    };
    let interval = status_interval(
        Duration::from_millis(postgres.status_interval_ms),
        prepared.wal_sender_timeout,
    );
    let began = with_heartbeat(
        &mut conn,
        prepared.slot_lsn,
        heartbeat(interval),
        sink.begin_session(&session),
    );
    let Some(committed) = unless_stopped(stop, began).await else {
        return Ok(None);
    };
    let (committed, resume) = match committed?? {
        // Exactly-once: the checkpoint is never behind the record (crate::relay::record).
        Some(checkpoint) => (Some(checkpoint), None),
        None => resume::resume_from_record(prepared, &spec.slot, delivered),
    };

    let mut watch_connect = settings.connect.clone();
    watch_connect.application_name.push_str(" (outbox watch)");
    let watch = OutboxWatch::start(
        WatchTarget {
            publication: spec.publication.clone(),
            outboxes: prepared.outboxes.clone(),
            patterns: spec.patterns.clone(),
            state_table: spec.state_table.clone(),
            slot: spec.slot.clone(),
            primary: settings.primary.clone().filter(|_| prepared.on_standby),
        },
        watch_connect,
    );
    let start = Start {
        slot_lsn: prepared.slot_lsn,
        recorded: resume::already_recorded(prepared),
        assembler: TxnAssembler::new(assembler_outboxes(settings, prepared), 0)
            .with_patterns(assembler_patterns(settings))
            .with_messages(settings.messages.clone()),
        limits: settings.relay.limits(),
        liveness: LivenessLimits {
            status_interval: interval,
            receive_timeout: receive_timeout(
                postgres.receive_timeout_ms.map(Duration::from_millis),
                prepared.wal_sender_timeout,
                interval,
            ),
            stall_release: Duration::from_millis(settings.relay.stall_release_ms),
        },
        dead_letter_topic: settings.dead_letter_topic.clone(),
        publication: spec.publication.clone(),
        tables: prepared.outboxes.iter().map(|o| o.table.clone()).collect(),
        committed,
        resume,
    };
    let pipeline = Pipeline::new(conn, (sink, notices), watch, start, Arc::clone(metrics));
    Ok(Some((pipeline, interval)))
}

/// The outbox tables the source found, and the patterns, for the log.
fn prepared_tables(spec: &SourceSpec, prepared: &PreparedSource) -> String {
    let names: Vec<String> = prepared
        .outboxes
        .iter()
        .map(|o| o.table.to_string())
        .chain(spec.patterns.iter().map(|p| format!("{p} (pattern)")))
        .collect();
    names.join(", ")
}

/// The partitioned outbox tables, for the log (`-` when none is).
fn partitioned_tables(prepared: &PreparedSource) -> String {
    let partitioned: Vec<String> = prepared
        .outboxes
        .iter()
        .filter(|o| o.partitioned)
        .map(|o| o.table.to_string())
        .collect();
    if partitioned.is_empty() {
        "-".to_owned()
    } else {
        partitioned.join(", ")
    }
}

/// Every outbox table the source found (the settings' own, then the ones their
/// patterns matched) with its entry's router, for the assembler.
fn assembler_outboxes(settings: &Settings, prepared: &PreparedSource) -> Vec<AssemblerOutbox> {
    prepared
        .outboxes
        .iter()
        .filter_map(|found| {
            let entry = settings.entry_of(&found.table)?;
            Some(AssemblerOutbox {
                table: found.table.clone(),
                oid: found.oid,
                router: settings.outboxes[entry].router.clone(),
                entry,
            })
        })
        .collect()
}

/// The pattern entries, for the assembler to adopt their new tables.
fn assembler_patterns(settings: &Settings) -> Vec<AssemblerPattern> {
    settings
        .outboxes
        .iter()
        .enumerate()
        .filter_map(|(entry, outbox)| {
            Some(AssemblerPattern {
                pattern: outbox.pattern.clone()?,
                router: outbox.router.clone(),
                entry,
            })
        })
        .collect()
}

/// Awaits `work` (the sink's session start: an exactly-once producer's fencing and
/// checkpoint read can take seconds) while the heartbeat goes on from the slot's own
/// position (which moves nothing), so a standby does not take the slot from a relay
/// that is only starting (crate::relay::takeover).
async fn with_heartbeat<T>(
    conn: &mut PgConnection,
    at: Lsn,
    beat: Duration,
    work: impl Future<Output = T>,
) -> Result<T, PgError> {
    tokio::pin!(work);
    let mut ticks = tokio::time::interval(beat);
    loop {
        tokio::select! {
            done = &mut work => return Ok(done),
            _ = ticks.tick() => {
                let update = StandbyStatusUpdate {
                    write: at,
                    flush: at,
                    apply: at,
                    client_time: now_pg(),
                    reply_requested: false,
                };
                conn.send_status(&update).await?;
            }
        }
    }
}
