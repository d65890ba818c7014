//! Contender (d): Debezium, what users would run instead of the relay. Kafka Connect
//! (standalone) with Debezium's PostgreSQL connector and its Outbox Event Router, as the
//! harness runs it (`outbox_relay_harness::debezium`: configured as Debezium documents
//! it for an outbox, Connect's own JVM options), on the same database, WAL and broker.
//!
//! ```text
//! slot bench_debezium created with the others, before the load (a connector without
//! stored offsets streams from its slot's position: the same WAL as every contender)
//! spawn Connect ──▶ the connector RUNNING and its slot active      start-up, not timed
//! window opens ──▶ records in the three topics grew by the load's events   timed
//! ```
//!
//! The time starts once Debezium streams, not at the JVM's start: the start-up (tens of
//! seconds of class loading on two cores) is reported beside it, and the CPU of the
//! window is the JVM's CPU since streaming began. Both choices are in Debezium's favour.

use std::time::{Duration, Instant};

use outbox_relay_harness::debezium::{DebeziumConnect, DebeziumOptions, PgEndpoint};
use outbox_relay_harness::procstat;
use outbox_relay_harness::wait::poll_until;

use crate::contenders::{Bench, Measured};
use crate::setup::{TopicCounter, DATABASE, PUBLICATION};

/// How long Connect may take to start and stream (class loading on a loaded machine).
const START_TIMEOUT: Duration = Duration::from_secs(300);

/// The runner's options for the benchmark: its slot, the benchmark's publication, the
/// benchmark's topics (they exist: Connect creates none).
pub fn options(slot: &str) -> DebeziumOptions {
    DebeziumOptions {
        slot: slot.to_owned(),
        publication: PUBLICATION.to_owned(),
        ..DebeziumOptions::default()
    }
}

/// Connect started on `slot` and streaming; returns it with its start-up time.
pub fn start(bench: &Bench<'_>, slot: &str) -> Result<(DebeziumConnect, Duration), String> {
    let kafka = bench.kafka.ok_or("Debezium needs the Kafka broker")?;
    let endpoint = PgEndpoint::superuser(bench.pg, DATABASE);
    let spawned = Instant::now();
    let connect = DebeziumConnect::start(&endpoint, &kafka.bootstrap(), &options(slot));
    connect.wait_streaming(&endpoint, START_TIMEOUT);
    Ok((connect, spawned.elapsed()))
}

impl Bench<'_> {
    /// (d) Debezium on `slot` (created before the load) until the benchmark's topics
    /// hold `events` more records than before it started.
    pub fn debezium(&mut self, slot: &str, events: u64) -> Result<Measured, String> {
        let kafka = self.kafka.ok_or("Debezium needs the Kafka broker")?;
        let counter = TopicCounter::new(&kafka.bootstrap())?;
        let before = counter.total()?;
        let (connect, startup) = start(self, slot)?;
        let pid = connect.pid();
        let cpu_at_streaming = procstat::process_cpu(pid);

        let window = self.open();
        let wanted = before + i64::try_from(events).map_err(|_| "too many events")?;
        let mut last = before;
        let delivered = poll_until(self.timeout, || {
            if !connect.is_running() {
                return Some(false);
            }
            last = counter.total().unwrap_or(last);
            (last >= wanted).then_some(true)
        });
        let seconds = window.started.elapsed().as_secs_f64();
        if delivered != Some(true) {
            return Err(format!(
                "{} of {events} records in Kafka after {seconds:.0} s (Connect {}); log tail:\n{}",
                last - before,
                if connect.is_running() {
                    "running"
                } else {
                    "exited"
                },
                connect.log_tail()
            ));
        }
        let process_cpu = procstat::process_cpu(pid).since(cpu_at_streaming);
        let peak_rss = procstat::peak_rss_kib(pid);
        connect.stop();
        let costs = self.close(&window);
        let mut notes = vec![format!(
            "JVM start to streaming: {:.1} s and {:.1} CPU-s, not in the time or the CPU",
            startup.as_secs_f64(),
            cpu_at_streaming.seconds()
        )];
        let extra = counter.total()? - wanted;
        if extra != 0 {
            notes.push(format!("{extra} records more than the load in the topics"));
        }
        Ok(self.measured(
            "debezium",
            "Debezium 3.6 (Kafka Connect + Outbox Event Router)",
            events,
            seconds,
            process_cpu,
            peak_rss,
            &costs,
            notes,
        ))
    }
}
