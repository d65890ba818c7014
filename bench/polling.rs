//! Contender (e): the polling relay of the outbox lesson, the thing outbox-relay replaces.
//!
//! ```text
//! worker × N, each with its own PostgreSQL session and Kafka producer:
//!   BEGIN
//!   SELECT id, aggregatetype, payload FROM <table>
//!     WHERE published_at IS NULL ORDER BY created_at LIMIT 100 FOR UPDATE SKIP LOCKED
//!   send each row (topic outbox.event.<aggregatetype>, key and header `id` = id,
//!     value = payload), then wait until every one has its delivery report
//!   UPDATE <table> SET published_at = now(), attempts = attempts + 1 WHERE id = ANY(...)
//!   COMMIT
//! until the SELECT finds nothing
//! ```
//!
//! The producer has the relay's own defaults (`PRODUCER_DEFAULTS`: idempotent,
//! `acks=all`, `linger.ms=10`, lz4, murmur2), so the comparison is between reading the
//! WAL and polling the table, not between producer settings. The table has a partial
//! index on `created_at WHERE published_at IS NULL`, as the lesson recommends.
//!
//! It runs as a child process of the benchmark (the benchmark's own executable, started
//! with [`WORKER_ARG`]), so its CPU time and peak RSS are its own: at the end it prints
//! one JSON line with them on stdout.
//!
//! Two modes: *drain* (throughput, contender e) stops when a poll finds nothing; *poll
//! every* (latency, contender f: [`spawn_polling`]) runs until killed, polling again at
//! once after a full batch and sleeping the poll interval after a short one, as polling
//! relays are written (a `@Scheduled(fixedDelay = …)` job, a ticker loop).

use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use outbox_relay::sink::kafka_config::PRODUCER_DEFAULTS;
use outbox_relay_harness::procstat::{self, CpuTime};
use outbox_relay_harness::wait::poll_until;
use postgres::{Client, NoTls};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::util::Timeout;

use crate::contenders::{Bench, Measured};
use crate::setup::{self, DATABASE};

/// The first argument that turns the benchmark executable into the polling relay.
pub const WORKER_ARG: &str = "__polling_relay";
/// Rows per poll: the lesson's `LIMIT 100`.
pub const BATCH: i64 = 100;

/// What the polling relay process reports when it is done.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WorkerReport {
    pub published: u64,
    pub polls: u64,
    pub cpu_ticks: u64,
    pub peak_rss_kib: u64,
}

/// Where the polling relay reads and sends.
pub struct PollingTarget<'a> {
    pub url: &'a str,
    pub table: &'a str,
    pub bootstrap: &'a str,
    pub workers: usize,
}

/// Starts the polling relay as a child process (this executable with [`WORKER_ARG`]) and
/// waits for it; returns its report. Errors carry the child's stderr.
pub fn run_child(target: &PollingTarget<'_>, timeout: Duration) -> Result<WorkerReport, String> {
    let exe = std::env::current_exe().map_err(|err| format!("current_exe: {err}"))?;
    let child = Command::new(exe)
        .arg(WORKER_ARG)
        .arg(target.url)
        .arg(target.table)
        .arg(target.bootstrap)
        .arg(target.workers.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("starting the polling relay: {err}"))?;
    let pid = child.id();
    // wait_with_output blocks; a watchdog thread kills a polling relay past the timeout.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + timeout;
            while !done.load(Ordering::Relaxed) {
                if std::time::Instant::now() >= deadline {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let output = child
        .wait_with_output()
        .map_err(|err| format!("waiting for the polling relay: {err}"));
    done.store(true, Ordering::Relaxed);
    let _ = watchdog.join();
    let output = output?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "the polling relay failed ({}): {stderr}",
            output.status
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim())
        .map_err(|err| format!("the polling relay's report {stdout:?}: {err}; stderr: {stderr}"))
}

/// Starts the polling relay in *poll every* mode (`interval` between polls that found
/// less than a batch); it runs until the caller kills it.
pub fn spawn_polling(
    target: &PollingTarget<'_>,
    interval: Duration,
) -> Result<std::process::Child, String> {
    let exe = std::env::current_exe().map_err(|err| format!("current_exe: {err}"))?;
    Command::new(exe)
        .arg(WORKER_ARG)
        .arg(target.url)
        .arg(target.table)
        .arg(target.bootstrap)
        .arg(target.workers.to_string())
        .arg(interval.as_millis().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|err| format!("starting the polling relay: {err}"))
}

/// The child process: `<exe> __polling_relay URL TABLE BOOTSTRAP WORKERS [INTERVAL_MS]`;
/// without an interval it drains the table and reports, with one it polls until killed.
pub fn worker_main(args: &[String]) -> Result<(), String> {
    let (url, table, bootstrap, workers, interval) = match args {
        [url, table, bootstrap, workers] => (url, table, bootstrap, workers, None),
        [url, table, bootstrap, workers, interval] => {
            let ms: u64 = interval
                .parse()
                .map_err(|err| format!("INTERVAL_MS {interval:?}: {err}"))?;
            (
                url,
                table,
                bootstrap,
                workers,
                Some(Duration::from_millis(ms)),
            )
        }
        _ => {
            return Err(format!(
                "usage: {WORKER_ARG} URL TABLE BOOTSTRAP WORKERS [INTERVAL_MS] (got {args:?})"
            ))
        }
    };
    let workers: usize = workers
        .parse()
        .map_err(|err| format!("WORKERS {workers:?}: {err}"))?;
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (url, table, bootstrap) = (url.clone(), table.clone(), bootstrap.clone());
            std::thread::spawn(move || poll(&url, &table, &bootstrap, interval))
        })
        .collect();
    let mut report = WorkerReport {
        published: 0,
        polls: 0,
        cpu_ticks: 0,
        peak_rss_kib: 0,
    };
    for handle in handles {
        let (published, polls) = handle
            .join()
            .map_err(|_| "a polling worker panicked".to_owned())??;
        report.published += published;
        report.polls += polls;
    }
    let me = std::process::id();
    report.cpu_ticks = procstat::process_cpu(me).0;
    report.peak_rss_kib = procstat::peak_rss_kib(me).unwrap_or(0);
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|err| err.to_string())?
    );
    Ok(())
}

/// Counts delivery reports; a failed delivery stops the worker (with the relay's
/// settings librdkafka retries transient errors forever, so a failure is definite).
#[derive(Default)]
struct Deliveries {
    /// (delivered, failed)
    counts: Mutex<(u64, u64)>,
    changed: Condvar,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if result.is_err() {
            counts.1 += 1;
        } else {
            counts.0 += 1;
        }
        self.changed.notify_all();
    }
}

/// One worker: polls until the SELECT finds no unpublished row it can lock (`interval`
/// `None`), or forever, sleeping `interval` after every poll that found less than a
/// batch. Returns the rows it published and how many polls it made.
fn poll(
    url: &str,
    table: &str,
    bootstrap: &str,
    interval: Option<Duration>,
) -> Result<(u64, u64), String> {
    let mut client =
        Client::connect(url, NoTls).map_err(|err| format!("connecting to {url}: {err}"))?;
    let mut config = ClientConfig::new();
    for (key, value) in PRODUCER_DEFAULTS {
        config.set(*key, *value);
    }
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "polling-relay");
    let producer: ThreadedProducer<Deliveries> = config
        .create_with_context(Deliveries::default())
        .map_err(|err| format!("creating the producer: {err}"))?;
    // The table name is the benchmark's own (bench_poll_<n>), not user input.
    let select = client
        .prepare(&format!(
            "SELECT id::text, aggregatetype, payload::text FROM {table} \
             WHERE published_at IS NULL ORDER BY created_at LIMIT {BATCH} \
             FOR UPDATE SKIP LOCKED"
        ))
        .map_err(|err| format!("preparing the poll: {err}"))?;
    let update = client
        .prepare(&format!(
            "UPDATE {table} SET published_at = now(), attempts = attempts + 1 \
             WHERE id = ANY($1::text[]::uuid[])"
        ))
        .map_err(|err| format!("preparing the update: {err}"))?;
    let (mut published, mut polls, mut sent) = (0u64, 0u64, 0u64);
    loop {
        let mut txn = client
            .transaction()
            .map_err(|err| format!("BEGIN: {err}"))?;
        let rows = txn
            .query(&select, &[])
            .map_err(|err| format!("polling: {err}"))?;
        polls += 1;
        if rows.is_empty() {
            txn.commit().map_err(|err| format!("COMMIT: {err}"))?;
            match interval {
                None => break,
                Some(interval) => {
                    std::thread::sleep(interval);
                    continue;
                }
            }
        }
        let short_batch = rows.len() < BATCH as usize;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.get(0);
            let aggregate_type: String = row.get(1);
            let payload: Option<String> = row.get(2);
            let topic = format!("outbox.event.{aggregate_type}");
            send(&producer, &topic, &id, payload.as_deref())?;
            ids.push(id);
        }
        sent += ids.len() as u64;
        wait_for_deliveries(&producer, sent)?;
        txn.execute(&update, &[&ids])
            .map_err(|err| format!("marking published: {err}"))?;
        txn.commit().map_err(|err| format!("COMMIT: {err}"))?;
        published += ids.len() as u64;
        if let (Some(interval), true) = (interval, short_batch) {
            std::thread::sleep(interval);
        }
    }
    Ok((published, polls))
}

/// Waits until `sent` records in all have their delivery report: a zero-timeout flush
/// first (it asks librdkafka to send what waits for `linger.ms` now, as a poller's
/// `flush()` does), then sleeps on the reports, which the producer's own thread delivers
/// as they come. Not rust-rdkafka's `flush` with a timeout: it polls in 100 ms steps,
/// which would add up to 100 ms to every batch and measure that, not polling.
fn wait_for_deliveries(producer: &ThreadedProducer<Deliveries>, sent: u64) -> Result<(), String> {
    let _ = producer.flush(Timeout::After(Duration::ZERO));
    let context = producer.context();
    let mut counts = context.counts.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let (delivered, failed) = *counts;
        if failed > 0 {
            return Err(format!("{failed} deliveries failed"));
        }
        if delivered >= sent {
            return Ok(());
        }
        counts = context
            .changed
            .wait(counts)
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// Queues one record, waiting while librdkafka's queue is full.
fn send(
    producer: &ThreadedProducer<Deliveries>,
    topic: &str,
    id: &str,
    payload: Option<&str>,
) -> Result<(), String> {
    let headers = OwnedHeaders::new().insert(Header {
        key: "id",
        value: Some(id),
    });
    let mut record = BaseRecord::to(topic).key(id).headers(headers);
    if let Some(payload) = payload {
        record = record.payload(payload);
    }
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                // The producer's thread serves the reports that make room.
                record = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((err, _)) => return Err(format!("sending to {topic}: {err}")),
        }
    }
}

// ------------------------------------------------------------------ contender (e)

impl Bench<'_> {
    /// (e) The polling relay with `workers` workers, on a fresh copy of the loaded
    /// outbox (`bench_poll_<workers>`: same rows, same indexes, vacuumed), until every
    /// row is published.
    pub fn polling(&mut self, workers: usize, events: u64) -> Result<Measured, String> {
        let table = format!("bench_poll_{workers}");
        let sql = |client: &mut Client, sql: &str| {
            client
                .batch_execute(sql)
                .map_err(|err| format!("{sql}: {err}"))
        };
        sql(
            &mut self.admin,
            &format!(
                "CREATE TABLE {table} (LIKE public.outbox INCLUDING ALL);
                 INSERT INTO {table} SELECT * FROM public.outbox;"
            ),
        )?;
        sql(&mut self.admin, &format!("VACUUM ANALYZE {table}"))?;
        sql(&mut self.admin, "CHECKPOINT")?;
        let kafka = self
            .kafka
            .ok_or("the polling relay needs the Kafka broker")?;
        let bootstrap = kafka.bootstrap();
        let before = setup::records_in_topics(&bootstrap)?;
        let url = self.pg.url("postgres", None, DATABASE);
        let target = PollingTarget {
            url: &url,
            table: &table,
            bootstrap: &bootstrap,
            workers,
        };

        let window = self.open();
        let report = run_child(&target, self.timeout)?;
        let seconds = window.started.elapsed().as_secs_f64();
        let costs = self.close(&window);

        let mut notes = Vec::new();
        let unpublished: i64 = self
            .admin
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE published_at IS NULL"),
                &[],
            )
            .map_err(|err| format!("counting unpublished rows: {err}"))?
            .get(0);
        if unpublished != 0 || report.published != events {
            notes.push(format!(
                "published {} of {events}, {unpublished} left unpublished",
                report.published
            ));
        }
        let delivered = setup::records_in_topics(&bootstrap)? - before;
        if delivered != events as i64 {
            notes.push(format!(
                "{delivered} records reached Kafka, expected {events}"
            ));
        }
        notes.push(format!("{} polls", report.polls));
        let dead = self.dead_tuples(&table, events as i64);
        sql(&mut self.admin, &format!("DROP TABLE {table}"))?;
        let mut measured = self.measured(
            &format!("polling-{workers}"),
            &format!(
                "polling relay, {workers} worker{}",
                if workers == 1 { "" } else { "s" }
            ),
            events,
            seconds,
            CpuTime(report.cpu_ticks),
            Some(report.peak_rss_kib),
            &costs,
            notes,
        );
        measured.dead_tuples = dead;
        Ok(measured)
    }

    /// `n_dead_tup` of `table`, once the statistics of the exited backends have arrived
    /// (they are sent at backend exit): waits up to 5 s for `expected`.
    fn dead_tuples(&mut self, table: &str, expected: i64) -> Option<i64> {
        let mut last = None;
        poll_until(Duration::from_secs(5), || {
            last = self
                .admin
                .query_one(
                    "SELECT pg_stat_clear_snapshot() IS NULL, \
                     (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = $1)",
                    &[&table],
                )
                .ok()
                .and_then(|row| row.get::<_, Option<i64>>(1));
            last.filter(|&dead| dead >= expected)
        });
        last
    }
}
