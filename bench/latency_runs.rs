//! Contender (f) run by run: each latency contender is set up once, measured at every
//! rate in turn (after a discarded warm-up), and torn down.
//!
//! ```text
//! producer        the floor: the writer queues records straight into Kafka
//! relay           the relay, default settings, on slot bench_latency_relay
//! debezium        Connect + Debezium on slot bench_latency_debezium
//! polling-100ms   the polling relay, 1 worker, 100 ms between polls that found less
//! polling-1s      than a batch, 1 s: on a table of its own (bench_latency_poll_<ms>)
//!                 holding 100,000 published rows, vacuumed and analyzed
//! ```
//!
//! The logical contenders' slots are created just before each starts, so they stream
//! only what the writer writes from then on.

use std::time::Duration;

use outbox_relay_harness::wait::poll_until;

use crate::contenders::{log_tail, Bench, KillOnDrop};
use crate::latency::{self, LatencyRun, Shape, Source};
use crate::polling::{self, PollingTarget};
use crate::setup::{self, DATABASE};

/// The contenders of (f), in the order they run.
pub const LATENCY_CONTENDERS: &[&str] = &[
    "producer",
    "relay",
    "debezium",
    "polling-100ms",
    "polling-1s",
];

/// Rate and length of each contender's warm-up, whose figures are thrown away: the
/// first records pay for connections, metadata and the producer's id.
const WARM_UP_RATE: u32 = 100;
const WARM_UP_SECONDS: u64 = 2;
/// Published rows in a latency polling relay's table before it starts.
const POLLING_HISTORY: u32 = 100_000;
/// How long a contender may take until it streams.
const START_TIMEOUT: Duration = Duration::from_secs(120);

pub struct LatencyPlan<'a> {
    pub contenders: &'a [String],
    pub rates: &'a [u32],
    /// Rates of the one-event-per-transaction writer, after `rates`.
    pub single_rates: &'a [u32],
    pub seconds: u64,
    pub pad: u32,
}

impl Bench<'_> {
    /// Every selected latency contender at every rate.
    pub fn latency(&mut self, plan: &LatencyPlan<'_>) -> Result<Vec<LatencyRun>, String> {
        let bootstrap = self
            .kafka
            .ok_or("latency needs the Kafka broker")?
            .bootstrap();
        let url = self.pg.url("postgres", None, DATABASE);
        let mut runs = Vec::new();
        let mut seq_base = 1_000_000_000u64;
        for contender in plan.contenders {
            // What keeps the contender alive until its rates are done.
            let mut running = Running::Nothing;
            let mut table = "public.outbox".to_owned();
            let name = match contender.as_str() {
                "producer" => "plain producer (the floor)".to_owned(),
                "relay" => {
                    running = Running::Relay(self.start_latency_relay()?);
                    "relay → Kafka (defaults)".to_owned()
                }
                "debezium" => {
                    setup::create_slot(&mut self.admin, "bench_latency_debezium");
                    let (connect, startup) =
                        crate::debezium::start(self, "bench_latency_debezium")?;
                    crate::log(&format!(
                        "(f) debezium streaming after {:.1} s",
                        startup.as_secs_f64()
                    ));
                    running = Running::Debezium(connect);
                    "Debezium (Kafka Connect + Outbox Event Router)".to_owned()
                }
                "polling-100ms" | "polling-1s" => {
                    let (interval, every) = if contender == "polling-100ms" {
                        (Duration::from_millis(100), "100 ms")
                    } else {
                        (Duration::from_secs(1), "1 s")
                    };
                    table = format!("bench_latency_poll_{}", interval.as_millis());
                    // Published history, as an outbox holds until its cleanup, then
                    // VACUUM ANALYZE: with statistics the planner takes the partial
                    // index on unpublished rows, as it does where autovacuum runs (it
                    // is off in the benchmark; on an empty, never analyzed table it
                    // scanned the whole table and sorted, falling seconds behind at
                    // 1,000 events/s).
                    self.admin
                        .batch_execute(&format!(
                            "CREATE TABLE {table} (LIKE public.outbox INCLUDING ALL);
                             INSERT INTO {table} SELECT * FROM public.outbox LIMIT {POLLING_HISTORY};
                             UPDATE {table} SET published_at = now(), attempts = 1;"
                        ))
                        // VACUUM refuses to run in the implicit transaction of a batch.
                        .and_then(|()| self.admin.batch_execute(&format!("VACUUM ANALYZE {table}")))
                        .map_err(|err| {
                            let detail = err.as_db_error().map(|db| db.message().to_owned());
                            format!("creating {table}: {err}: {}", detail.unwrap_or_default())
                        })?;
                    let child = polling::spawn_polling(
                        &PollingTarget {
                            url: &url,
                            table: &table,
                            bootstrap: &bootstrap,
                            workers: 1,
                        },
                        interval,
                    )?;
                    running = Running::Polling(KillOnDrop(child));
                    format!("polling relay, 1 worker, polls every {every}")
                }
                other => return Err(format!("unknown latency contender {other:?}")),
            };
            let source = if contender == "producer" {
                Source::Producer
            } else {
                Source::Table {
                    url: &url,
                    table: &table,
                }
            };
            let warm_up = latency::measure(
                contender,
                &name,
                &bootstrap,
                &source,
                Shape::Batches,
                WARM_UP_RATE,
                WARM_UP_SECONDS,
                plan.pad,
                seq_base,
            )?;
            seq_base += 1_000_000_000;
            if warm_up.received < warm_up.written {
                return Err(format!(
                    "(f) {contender}: the warm-up's {} events did not all arrive ({} did)",
                    warm_up.written, warm_up.received
                ));
            }
            let shapes = plan.rates.iter().map(|&rate| (Shape::Batches, rate)).chain(
                plan.single_rates
                    .iter()
                    .map(|&rate| (Shape::OnePerTransaction, rate)),
            );
            for (shape, rate) in shapes {
                let run = latency::measure(
                    contender,
                    &name,
                    &bootstrap,
                    &source,
                    shape,
                    rate,
                    plan.seconds,
                    plan.pad,
                    seq_base,
                )?;
                seq_base += 1_000_000_000;
                crate::log(&format!(
                    "(f) {contender} at {rate}/s{}: wrote {} ({:.0}/s), received {}, p50 {} p99 {} max {}",
                    if shape == Shape::OnePerTransaction {
                        " one event per transaction"
                    } else {
                        ""
                    },
                    run.written,
                    run.written_per_second,
                    run.received,
                    ms(run.p50_ms),
                    ms(run.p99_ms),
                    ms(run.max_ms)
                ));
                runs.push(run);
            }
            match running {
                Running::Nothing => {}
                Running::Relay(relay) => {
                    drop(relay);
                    drop_slot_when_released(&mut self.admin, "bench_latency_relay");
                }
                Running::Debezium(connect) => {
                    connect.stop();
                    drop_slot_when_released(&mut self.admin, "bench_latency_debezium");
                }
                Running::Polling(child) => {
                    drop(child);
                    self.admin
                        .batch_execute(&format!("DROP TABLE {table}"))
                        .map_err(|err| format!("dropping {table}: {err}"))?;
                }
            }
        }
        Ok(runs)
    }

    /// The relay with default settings on a new slot, once it streams. SIGTERM on drop
    /// (through [`RelayGuard`]) so its slot is released before it is dropped.
    fn start_latency_relay(&mut self) -> Result<RelayGuard, String> {
        let slot = "bench_latency_relay";
        setup::create_slot(&mut self.admin, slot);
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-bench-latency-")
            .tempdir()
            .map_err(|err| format!("temp dir: {err}"))?;
        let mut relay = KillOnDrop(
            self.relay_command(slot, "kafka", dir.path())?
                .spawn()
                .map_err(|err| format!("starting {}: {err}", self.relay_bin.display()))?,
        );
        let active = poll_until(START_TIMEOUT, || {
            if let Ok(Some(status)) = relay.0.try_wait() {
                return Some(Err(format!("the relay exited ({status})")));
            }
            slot_active(&mut self.admin, slot).then_some(Ok(()))
        });
        match active {
            Some(Ok(())) => Ok(RelayGuard { relay, _dir: dir }),
            Some(Err(why)) => Err(format!(
                "{why}; relay log tail:\n{}",
                log_tail(&dir.path().join("relay.log"))
            )),
            None => {
                let _ = relay.stop(Duration::from_secs(10));
                Err(format!(
                    "the relay did not stream from {slot} within {START_TIMEOUT:?}; log tail:\n{}",
                    log_tail(&dir.path().join("relay.log"))
                ))
            }
        }
    }
}

/// What runs for a latency contender while its rates are measured.
enum Running {
    Nothing,
    Relay(RelayGuard),
    Debezium(outbox_relay_harness::debezium::DebeziumConnect),
    Polling(KillOnDrop),
}

/// Drops `slot` once no walsender holds it (the reader has just exited).
fn drop_slot_when_released(client: &mut postgres::Client, slot: &str) {
    poll_until(Duration::from_secs(30), || {
        (!slot_active(client, slot)).then_some(())
    });
    setup::drop_slot(client, slot);
}

/// The latency relay: stopped with SIGTERM (a drained, clean exit) on drop.
struct RelayGuard {
    relay: KillOnDrop,
    _dir: tempfile::TempDir,
}

impl Drop for RelayGuard {
    fn drop(&mut self) {
        if let Err(err) = self.relay.stop(Duration::from_secs(30)) {
            crate::log(&err);
        }
    }
}

fn slot_active(client: &mut postgres::Client, slot: &str) -> bool {
    client
        .query_opt(
            "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .ok()
        .flatten()
        .is_some_and(|row| row.get::<_, bool>(0))
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.1} ms"))
}
