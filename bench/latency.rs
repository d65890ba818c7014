//! Contender (f): latency, from the writer's commit to the record read by a consumer.
//!
//! ```text
//! writer (this process)                         consumer (this process, a thread)
//!   every 10 ms: INSERT the events due by now     assigned to every partition of the
//!   (rate × elapsed − written) as one             three topics at their high watermark
//!   transaction of seqs [s, s+n); note the         (only records written from now on);
//!   instant COMMIT returned, per batch             per record: parse `seq` from the JSON
//!   (Shape::Batches), or each of them in a        value, note the instant it was polled
//!   transaction of its own, noting each COMMIT
//!   (Shape::OnePerTransaction)
//!        │                                                      ▲
//!        └──▶ PostgreSQL ──▶ contender (relay, Debezium, polling) ──▶ Kafka
//!
//! latency of seq = polled(seq) − committed(batch of seq)
//! ```
//!
//! Both clocks are this process's `Instant`, so no clock skew. The floor is a plain
//! producer (`Source::Producer`): the writer queues the records straight into Kafka with
//! the relay's producer settings and the "commit" instant is when the batch was queued,
//! so the floor is the producer's batching (`linger.ms`), the broker and the consumer.
//! A run writes for `seconds`, then waits (at most [`DRAIN`]) for the records still
//! under way; what did not arrive by then is counted, not guessed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_relay::sink::kafka_config::PRODUCER_DEFAULTS;
use postgres::{Client, NoTls};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};

use outbox_relay_harness::stats::percentile;

use crate::setup::{topic, AGGREGATE_TYPES, PARTITIONS};

/// The writer's tick: one transaction (one batch of records) per tick.
const TICK: Duration = Duration::from_millis(10);
/// The one-event-per-transaction writer's tick: the commits due, one after the other,
/// every millisecond (5 at 5,000 transactions/s), not bunched every 10 ms.
const SINGLE_TICK: Duration = Duration::from_millis(1);
/// How long a run waits after its last write for the records still under way.
pub const DRAIN: Duration = Duration::from_secs(30);

/// How the writer groups the events due at a tick into transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One transaction per tick holding every event due (`rate / 100` events).
    Batches,
    /// One transaction per event: `rate` commits per second.
    OnePerTransaction,
}

/// Where the writer puts the events.
pub enum Source<'a> {
    /// INSERTs into this outbox table (`public.outbox` or a polling relay's copy).
    Table { url: &'a str, table: &'a str },
    /// Records queued straight into Kafka: the floor.
    Producer,
}

/// One contender at one rate.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatencyRun {
    /// `producer`, `relay`, `debezium`, `polling-100ms`, `polling-1s`.
    pub contender: String,
    pub name: String,
    /// The writer: one transaction per event, not per 10 ms tick.
    pub one_per_transaction: bool,
    /// Events per second the writer was asked for ...
    pub rate: u32,
    /// ... and what it wrote, over `seconds`.
    pub written_per_second: f64,
    pub seconds: f64,
    pub written: u64,
    /// Records read by the consumer within the run and its drain.
    pub received: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// Writes `rate` events/s for `seconds` through `source` and measures commit → consumer
/// for the records that arrive on the benchmark's topics. `seq_base` makes this run's
/// events tell themselves apart from any earlier run's.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    contender: &str,
    name: &str,
    bootstrap: &str,
    source: &Source<'_>,
    shape: Shape,
    rate: u32,
    seconds: u64,
    pad: u32,
    seq_base: u64,
) -> Result<LatencyRun, String> {
    let consumer = Arrivals::start(bootstrap, seq_base)?;
    let mut writer = Writer::new(source, bootstrap, pad)?;
    let commits = writer.write(shape, rate, Duration::from_secs(seconds), seq_base)?;
    let written: u64 = commits.iter().map(|batch| batch.count).sum();
    let wrote_for = commits
        .last()
        .zip(commits.first())
        .map_or(0.0, |(last, first)| {
            (last.committed - first.committed).as_secs_f64() + TICK.as_secs_f64()
        });
    let arrivals = consumer.finish(written, DRAIN);

    let mut latencies: Vec<f64> = Vec::with_capacity(arrivals.len());
    for batch in &commits {
        for seq in batch.first..batch.first + batch.count {
            if let Some(polled) = arrivals.get(&seq) {
                // A record can come before its COMMIT returned to the writer (the
                // walsender sends once the commit record is flushed): count that as 0.
                let latency = polled.saturating_duration_since(batch.committed);
                latencies.push(latency.as_secs_f64() * 1e3);
            }
        }
    }
    if let Some(dir) = std::env::var_os("BENCH_LATENCY_TRACE") {
        trace(
            std::path::Path::new(&dir),
            &format!("{contender}-{rate}-{shape:?}.csv"),
            &commits,
            &arrivals,
        );
    }
    latencies.sort_by(f64::total_cmp);
    Ok(LatencyRun {
        contender: contender.to_owned(),
        name: name.to_owned(),
        one_per_transaction: shape == Shape::OnePerTransaction,
        rate,
        written_per_second: if wrote_for > 0.0 {
            written as f64 / wrote_for
        } else {
            0.0
        },
        seconds: wrote_for,
        written,
        received: latencies.len() as u64,
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied(),
    })
}

/// With `BENCH_LATENCY_TRACE=<dir>`: one line per event, `seq,committed_ms,latency_ms`
/// (milliseconds since the run's first commit; latency empty when it never arrived), to
/// see when the late records came (docs/benchmarks.md, "Latency traces").
fn trace(
    dir: &std::path::Path,
    name: &str,
    commits: &[Committed],
    arrivals: &HashMap<u64, Instant>,
) {
    use std::fmt::Write as _;
    let Some(start) = commits.first().map(|batch| batch.committed) else {
        return;
    };
    let mut out = String::from("seq,committed_ms,latency_ms\n");
    for batch in commits {
        let at = batch
            .committed
            .saturating_duration_since(start)
            .as_secs_f64()
            * 1e3;
        for seq in batch.first..batch.first + batch.count {
            let latency = arrivals.get(&seq).map_or_else(String::new, |polled| {
                format!(
                    "{:.3}",
                    polled
                        .saturating_duration_since(batch.committed)
                        .as_secs_f64()
                        * 1e3
                )
            });
            let _ = writeln!(out, "{seq},{at:.3},{latency}");
        }
    }
    let path = dir.join(name);
    if let Err(err) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, out)) {
        eprintln!("bench: writing {}: {err}", path.display());
    }
}

/// A batch the writer committed: seqs `[first, first + count)`.
struct Committed {
    first: u64,
    count: u64,
    committed: Instant,
}

enum Sink {
    Table {
        client: Box<Client>,
        insert: postgres::Statement,
    },
    Producer(ThreadedProducer<DefaultProducerContext>),
}

struct Writer {
    sink: Sink,
    pad: String,
    /// The benchmark's topics, by `seq % 3` as the INSERT routes them (named once, not
    /// per record).
    topics: [String; 3],
}

impl Writer {
    fn new(source: &Source<'_>, bootstrap: &str, pad: u32) -> Result<Self, String> {
        let sink = match source {
            Source::Table { url, table } => {
                let mut client = Client::connect(url, NoTls)
                    .map_err(|err| format!("connecting the writer: {err}"))?;
                // The same rows as the preloaded WAL's (bench_load), seq by seq. The table
                // name is the benchmark's own.
                let insert = client
                    .prepare(&format!(
                        "INSERT INTO {table} (aggregatetype, aggregateid, type, payload)
                         SELECT (ARRAY['order', 'customer', 'payment'])[1 + g % 3],
                                'agg-' || (g % 10000), 'Created',
                                jsonb_build_object('seq', g, 'customer', 'customer-' || (g % 1000),
                                                   'total', (g % 1000) * 1.5, 'note', repeat('x', $3))
                         FROM generate_series($1::bigint, $2::bigint) AS g"
                    ))
                    .map_err(|err| format!("preparing the writer's INSERT: {err}"))?;
                Sink::Table {
                    client: Box::new(client),
                    insert,
                }
            }
            Source::Producer => {
                let mut config = ClientConfig::new();
                for (key, value) in PRODUCER_DEFAULTS {
                    config.set(*key, *value);
                }
                let producer: ThreadedProducer<DefaultProducerContext> = config
                    .set("bootstrap.servers", bootstrap)
                    .set("client.id", "bench-latency-producer")
                    .create()
                    .map_err(|err| format!("creating the plain producer: {err}"))?;
                // Connected, with its producer id and every partition's leader, before
                // the clock starts, as a relay that streams already is: one record
                // without a `seq` (the consumer skips it) per topic, flushed.
                for kind in AGGREGATE_TYPES {
                    let topic = topic(kind);
                    producer
                        .send(BaseRecord::<str, str>::to(&topic).payload("{\"warm_up\": true}"))
                        .map_err(|(err, _)| format!("warming up the plain producer: {err}"))?;
                }
                producer
                    .flush(Duration::from_secs(30))
                    .map_err(|err| format!("warming up the plain producer: {err}"))?;
                Sink::Producer(producer)
            }
        };
        Ok(Writer {
            sink,
            pad: "x".repeat(pad as usize),
            topics: AGGREGATE_TYPES.map(topic),
        })
    }

    /// Writes at `rate` for `duration`: at every tick, what is due by now, as one batch
    /// or one transaction per event (`shape`).
    fn write(
        &mut self,
        shape: Shape,
        rate: u32,
        duration: Duration,
        seq_base: u64,
    ) -> Result<Vec<Committed>, String> {
        let started = Instant::now();
        let mut written = 0u64;
        let mut commits = Vec::new();
        let mut tick = 0u32;
        loop {
            let now = Instant::now();
            let elapsed = now.duration_since(started).min(duration);
            let due = (f64::from(rate) * elapsed.as_secs_f64()) as u64;
            if due > written {
                let first = seq_base + written + 1;
                let count = due - written;
                match shape {
                    Shape::Batches => {
                        self.batch(first, count)?;
                        commits.push(Committed {
                            first,
                            count,
                            committed: Instant::now(),
                        });
                    }
                    Shape::OnePerTransaction => {
                        for seq in first..first + count {
                            self.batch(seq, 1)?;
                            commits.push(Committed {
                                first: seq,
                                count: 1,
                                committed: Instant::now(),
                            });
                        }
                    }
                }
                written = due;
            }
            if elapsed >= duration {
                break;
            }
            tick += 1;
            let next = started
                + match shape {
                    Shape::Batches => TICK,
                    Shape::OnePerTransaction => SINGLE_TICK,
                } * tick;
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        if let Sink::Producer(producer) = &self.sink {
            producer
                .flush(Duration::from_secs(30))
                .map_err(|err| format!("flushing the plain producer: {err}"))?;
        }
        Ok(commits)
    }

    fn batch(&mut self, first: u64, count: u64) -> Result<(), String> {
        let last = first + count - 1;
        match &mut self.sink {
            Sink::Table { client, insert } => {
                let pad = i32::try_from(self.pad.len()).unwrap_or(i32::MAX);
                let (first, last) = (first as i64, last as i64);
                client
                    .execute(insert, &[&first, &last, &pad])
                    .map_err(|err| format!("writing events {first}..={last}: {err}"))?;
            }
            Sink::Producer(producer) => {
                for seq in first..=last {
                    let topic = &self.topics[(seq % 3) as usize];
                    let key = format!("event-{seq}");
                    let value = format!(
                        "{{\"seq\": {seq}, \"note\": \"{}\", \"total\": {}, \"customer\": \"customer-{}\"}}",
                        self.pad,
                        (seq % 1000) as f64 * 1.5,
                        seq % 1000
                    );
                    let mut record = BaseRecord::to(topic).key(&key).payload(&value);
                    loop {
                        match producer.send(record) {
                            Ok(()) => break,
                            Err((
                                KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull),
                                back,
                            )) => {
                                // The producer's thread serves the reports that make room.
                                record = back;
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            Err((err, _)) => return Err(format!("queueing event {seq}: {err}")),
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The consumer thread: first arrival instant of every seq above the run's base.
struct Arrivals {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Result<HashMap<u64, Instant>, String>>,
}

impl Arrivals {
    /// Assigns every partition at its high watermark before returning, so the writer's
    /// first record is read however soon it comes.
    fn start(bootstrap: &str, seq_base: u64) -> Result<Self, String> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "bench-latency")
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|err| format!("creating the latency consumer: {err}"))?;
        let mut assignment = TopicPartitionList::new();
        for kind in AGGREGATE_TYPES {
            for partition in 0..PARTITIONS {
                let (_, high) = consumer
                    .fetch_watermarks(&topic(kind), partition, Duration::from_secs(10))
                    .map_err(|err| format!("watermarks of {}/{partition}: {err}", topic(kind)))?;
                assignment
                    .add_partition_offset(&topic(kind), partition, Offset::Offset(high))
                    .map_err(|err| format!("assigning {}/{partition}: {err}", topic(kind)))?;
            }
        }
        consumer
            .assign(&assignment)
            .map_err(|err| format!("assigning the latency consumer: {err}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, received) = (Arc::clone(&stop), Arc::clone(&received));
            std::thread::spawn(move || {
                let mut arrivals = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let Some(message) = consumer.poll(Duration::from_millis(50)) else {
                        continue;
                    };
                    let polled = Instant::now();
                    let message = message.map_err(|err| format!("the latency consumer: {err}"))?;
                    let Some(seq) = message.payload().and_then(seq_of) else {
                        continue;
                    };
                    if seq > seq_base && arrivals.insert(seq, polled).is_none() {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(arrivals)
            })
        };
        Ok(Arrivals {
            stop,
            received,
            thread,
        })
    }

    /// Waits until `expected` records arrived or `drain` passed, stops the consumer and
    /// returns the arrivals (an error of the consumer ends the run with no arrivals).
    fn finish(self, expected: u64, drain: Duration) -> HashMap<u64, Instant> {
        let deadline = Instant::now() + drain;
        while self.received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(Ok(arrivals)) => arrivals,
            Ok(Err(err)) => {
                eprintln!("bench: {err}");
                HashMap::new()
            }
            Err(_) => HashMap::new(),
        }
    }
}

/// `seq` of a JSON record value (the payload's top-level field).
fn seq_of(value: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Seq {
        seq: u64,
    }
    serde_json::from_slice::<Seq>(value).ok().map(|v| v.seq)
}
