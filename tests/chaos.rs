//! Chaos: the at-least-once and ordering promise under a storm of seeded faults, against
//! a real PostgreSQL, a real Kafka-protocol broker (tansu) and the relay binary.
//!
//! ```text
//! 4 writer threads ──(direct)──▶ PostgreSQL ◀──FaultProxy── relay ──FaultProxy──▶ tansu
//!   writer<N>: own topic outbox.event.writer<N>, own sequence numbers
//!
//! fault injector (seeded times and kinds): relay kill -9 + start, PostgreSQL fast and
//!   immediate restart, broker paused (SIGSTOP) for seconds, cut of the relay's
//!   PostgreSQL link, cut of its broker link
//! verifier: every committed id present, no rolled-back id present, first occurrences
//!   in commit order within each partition; duplicates counted
//! ```
//!
//! Commit order is known without guessing: each writer commits its transactions one
//! after the other and routes to its own topic, so within a topic commit order is that
//! writer's sequence order. A transaction whose COMMIT outcome is unknown (the
//! connection died in the middle) is looked up by id once its old backend is gone, and
//! classified from what the database holds.
//!
//! `CHAOS_SEED=<u64>` replays a run's fault kinds, times, durations and transaction
//! shapes (not the exact interleaving); `CHAOS_LARGE=1` runs the larger size.
//! `RELAY_TEST_LOG` sets the relay's log filter (default `warn` here).

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};
use support::kafka::{consume, Record, TansuBroker};
use support::outbox::{cluster_with_outbox, kafka_config, PUBLICATION, SLOT, WAIT};
use support::proxy::FaultProxy;
use support::wait::{poll_until, tail_lines};
use support::{PgCluster, PgOptions, RelayProcess};

const WRITERS: u32 = 4;
/// Share of transactions rolled back on purpose, in percent.
const ROLLBACK_PERCENT: u64 = 10;
/// How long a writer keeps trying to reach PostgreSQL before it gives up (the longest
/// planned outage is a few seconds).
const WRITER_CONNECT_DEADLINE: Duration = Duration::from_secs(300);
/// How long a link cut waits for the relay to have a connection to cut.
const LINK_WAIT: Duration = Duration::from_secs(10);
/// Nothing new for this long and the verifier has what it expects: done reading.
const CONSUME_IDLE: Duration = Duration::from_secs(5);

/// One run's size.
#[derive(Debug, Clone, Copy)]
struct Size {
    label: &'static str,
    /// Committed events to reach (the run may overshoot by a transaction per writer).
    events: usize,
    faults: usize,
    /// Window over which faults are spread and writes are paced.
    window: Duration,
    /// Deadline for the relay to acknowledge everything after the last fault.
    catch_up: Duration,
    /// Deadline for the verifier to read everything back.
    consume: Duration,
}

const BOUNDED: Size = Size {
    label: "bounded",
    events: 50_000,
    faults: 24,
    window: Duration::from_secs(240),
    catch_up: Duration::from_secs(180),
    consume: Duration::from_secs(240),
};

const LARGE: Size = Size {
    label: "large",
    events: 200_000,
    faults: 100,
    window: Duration::from_secs(600),
    catch_up: Duration::from_secs(600),
    consume: Duration::from_secs(600),
};

/// xorshift64*, seeded through splitmix64 (so seeds 0, 1, 2… give unrelated streams).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.between(lo, hi))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    RelayKill9,
    PgRestartFast,
    PgRestartImmediate,
    BrokerPause,
    PgLinkCut,
    BrokerLinkCut,
}

const ALL_FAULTS: [Fault; 6] = [
    Fault::RelayKill9,
    Fault::PgRestartFast,
    Fault::PgRestartImmediate,
    Fault::BrokerPause,
    Fault::PgLinkCut,
    Fault::BrokerLinkCut,
];

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::RelayKill9 => "relay kill -9",
            Fault::PgRestartFast => "postgres restart (fast)",
            Fault::PgRestartImmediate => "postgres restart (immediate)",
            Fault::BrokerPause => "broker paused",
            Fault::PgLinkCut => "postgres link cut",
            Fault::BrokerLinkCut => "broker link cut",
        }
    }
}

/// `count` faults at sorted random offsets within the window; kinds come in shuffled
/// rounds of all six, so every kind occurs once `count >= 6`.
fn schedule(rng: &mut Rng, count: usize, window: Duration) -> Vec<(Duration, Fault)> {
    let window_ms = u64::try_from(window.as_millis()).expect("window fits in u64 ms");
    let mut times: Vec<Duration> = (0..count)
        .map(|_| Duration::from_millis(rng.between(window_ms * 3 / 100, window_ms * 97 / 100)))
        .collect();
    times.sort();
    let mut kinds = Vec::with_capacity(count);
    while kinds.len() < count {
        let mut round = ALL_FAULTS;
        for i in (1..round.len()).rev() {
            let j = usize::try_from(rng.below(i as u64 + 1)).expect("small index");
            round.swap(i, j);
        }
        kinds.extend(round);
    }
    times.into_iter().zip(kinds).collect()
}

/// Event id of writer `writer`'s event number `seq` (the same text PostgreSQL prints).
fn event_id(writer: u32, seq: u64) -> String {
    format!("{writer:08x}-0000-4000-8000-{seq:012x}")
}

/// `(writer, seq)` back from an event id written by [`event_id`].
fn parse_event_id(id: &str) -> Option<(u32, u64)> {
    let bytes = id.as_bytes();
    if bytes.len() != 36 || &id[8..24] != "-0000-4000-8000-" {
        return None;
    }
    let writer = u32::from_str_radix(&id[0..8], 16).ok()?;
    let seq = u64::from_str_radix(&id[24..36], 16).ok()?;
    Some((writer, seq))
}

fn topic_of(writer: u32) -> String {
    format!("outbox.event.writer{writer}")
}

/// Inserts events `$2..=$3` of writer `$1`, in sequence order.
const INSERT_EVENTS: &str = "
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
    SELECT (lpad(to_hex($1::int), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
           'writer' || $1::int, 'w' || $1::int || '-' || g, 'ChaosEvent',
           jsonb_build_object('writer', $1::int, 'seq', g)
    FROM generate_series($2::bigint, $3::bigint) g ORDER BY g";

/// State shared by the writers and the injector.
struct WriterShared {
    port: u16,
    target: usize,
    window: Duration,
    started: Instant,
    committed: AtomicUsize,
    stop: AtomicBool,
}

impl WriterShared {
    /// Waits while the writers are ahead of a steady pace over the window, so writes
    /// overlap every fault. Behind schedule (after an outage) they go full speed.
    fn pace(&self) {
        loop {
            let elapsed = self.started.elapsed();
            if self.stop.load(Ordering::SeqCst) || elapsed >= self.window {
                return;
            }
            let allowed = self.target as f64 * elapsed.as_secs_f64() / self.window.as_secs_f64();
            if (self.committed.load(Ordering::SeqCst) as f64) < allowed {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn done(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.committed.load(Ordering::SeqCst) >= self.target
    }
}

/// Stops the writers when the test ends, whichever way it ends.
struct StopWriters(Arc<WriterShared>);

impl Drop for StopWriters {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::SeqCst);
    }
}

/// What one writer did.
#[derive(Debug, Default)]
struct WriterLog {
    /// Sequence numbers handed out: `0..next_seq`.
    next_seq: u64,
    /// Committed transactions, as inclusive seq ranges, in commit order.
    committed: Vec<(u64, u64)>,
    /// Rolled back, failed before COMMIT, or COMMIT lost and found not committed.
    not_committed: Vec<(u64, u64)>,
    rollbacks: usize,
    failed_before_commit: usize,
    unknown_committed: usize,
    unknown_not_committed: usize,
    connects: usize,
}

impl WriterLog {
    fn committed_events(&self) -> u64 {
        self.committed.iter().map(|(a, b)| b - a + 1).sum()
    }
}

/// A writer's connection and the identity of its backend (to know when it is gone).
struct Session {
    client: Client,
    backend_pid: i32,
    backend_start: String,
}

enum Outcome {
    Committed,
    RolledBack,
    /// The transaction never reached COMMIT: it cannot have committed.
    FailedBeforeCommit,
    /// COMMIT was sent and no answer came back: look it up.
    CommitUnknown,
}

/// 60 % small (1–20 rows), 30 % medium (21–150), 10 % large (151–500).
fn transaction_size(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=59 => rng.between(1, 20),
        60..=89 => rng.between(21, 150),
        _ => rng.between(151, 500),
    }
}

fn pg_config(port: u16) -> postgres::Config {
    let mut config = postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("app")
        .connect_timeout(Duration::from_secs(3));
    config
}

/// Connects (retrying through outages); `None` once `stop` is set.
fn connect(port: u16, stop: Option<&AtomicBool>) -> Option<Session> {
    let config = pg_config(port);
    let deadline = Instant::now() + WRITER_CONNECT_DEADLINE;
    loop {
        if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
            return None;
        }
        assert!(
            Instant::now() < deadline,
            "a writer could not reach PostgreSQL on port {port} for {WRITER_CONNECT_DEADLINE:?}"
        );
        if let Ok(mut client) = config.connect(NoTls) {
            let identity = client.query_one(
                "SELECT pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()",
                &[],
            );
            if let Ok(row) = identity {
                return Some(Session {
                    client,
                    backend_pid: row.get(0),
                    backend_start: row.get(1),
                });
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_transaction(
    client: &mut Client,
    writer: u32,
    first: u64,
    last: u64,
    rollback: bool,
) -> Outcome {
    let Ok(mut tx) = client.transaction() else {
        return Outcome::FailedBeforeCommit;
    };
    let params: (i32, i64, i64) = (
        i32::try_from(writer).expect("writer fits"),
        i64::try_from(first).expect("seq fits"),
        i64::try_from(last).expect("seq fits"),
    );
    if tx
        .execute(INSERT_EVENTS, &[&params.0, &params.1, &params.2])
        .is_err()
    {
        return Outcome::FailedBeforeCommit;
    }
    if rollback {
        let _ = tx.rollback();
        return Outcome::RolledBack;
    }
    match tx.commit() {
        Ok(()) => Outcome::Committed,
        Err(_) => Outcome::CommitUnknown,
    }
}

/// Whether the transaction of `writer` holding `first..=last` committed, decided from
/// the database once the backend that ran it is gone (so it cannot still commit).
/// Returns the answer and a fresh session.
fn resolve_unknown_commit(
    port: u16,
    old: &Session,
    writer: u32,
    first: u64,
    last: u64,
) -> (bool, Session) {
    let deadline = Instant::now() + WRITER_CONNECT_DEADLINE;
    loop {
        assert!(
            Instant::now() < deadline,
            "writer {writer}: could not classify the transaction {first}..={last} within \
             {WRITER_CONNECT_DEADLINE:?}"
        );
        let mut session = connect(port, None).expect("no stop flag");
        let old_alive = session.client.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND backend_start::text = $2",
            &[&old.backend_pid, &old.backend_start],
        );
        match old_alive {
            Ok(row) if row.get::<_, i64>(0) == 0 => {}
            _ => {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        }
        let found = session.client.query_one(
            "SELECT count(*) FROM outbox WHERE id BETWEEN $1::text::uuid AND $2::text::uuid",
            &[&event_id(writer, first), &event_id(writer, last)],
        );
        let Ok(row) = found else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let found = u64::try_from(row.get::<_, i64>(0)).expect("count is not negative");
        let size = last - first + 1;
        assert!(
            found == 0 || found == size,
            "writer {writer}: transaction {first}..={last} is partly in the table ({found} of \
             {size} rows): PostgreSQL atomicity or the harness is broken"
        );
        return (found == size, session);
    }
}

fn run_writer(writer: u32, shared: &WriterShared, mut rng: Rng) -> WriterLog {
    let mut log = WriterLog::default();
    let mut session: Option<Session> = None;
    while !shared.done() {
        shared.pace();
        if shared.done() {
            break;
        }
        if session.as_ref().map_or(true, |s| s.client.is_closed()) {
            let Some(fresh) = connect(shared.port, Some(&shared.stop)) else {
                break;
            };
            log.connects += 1;
            session = Some(fresh);
        }
        let current = session.as_mut().expect("connected above");
        let size = transaction_size(&mut rng);
        let rollback = rng.below(100) < ROLLBACK_PERCENT;
        let (first, last) = (log.next_seq, log.next_seq + size - 1);
        log.next_seq += size;
        match run_transaction(&mut current.client, writer, first, last, rollback) {
            Outcome::Committed => {
                log.committed.push((first, last));
                shared.committed.fetch_add(size as usize, Ordering::SeqCst);
            }
            Outcome::RolledBack => {
                log.rollbacks += 1;
                log.not_committed.push((first, last));
            }
            Outcome::FailedBeforeCommit => {
                log.failed_before_commit += 1;
                log.not_committed.push((first, last));
                session = None;
            }
            Outcome::CommitUnknown => {
                let old = session.take().expect("connected above");
                let (committed, fresh) =
                    resolve_unknown_commit(shared.port, &old, writer, first, last);
                log.connects += 1;
                session = Some(fresh);
                if committed {
                    log.unknown_committed += 1;
                    log.committed.push((first, last));
                    shared.committed.fetch_add(size as usize, Ordering::SeqCst);
                } else {
                    log.unknown_not_committed += 1;
                    log.not_committed.push((first, last));
                }
            }
        }
    }
    log
}

/// The relay as a supervised child: restarted after `kill -9`, and after an exit of
/// its own, which is recorded as a failure with its stderr.
struct Supervisor {
    config: String,
    log_filter: String,
    process: Option<RelayProcess>,
    starts: usize,
    /// Exits the harness did not cause: what the relay said before.
    unexpected_exits: Vec<String>,
    /// Stderr of earlier incarnations.
    earlier_stderr: String,
    started: Instant,
}

impl Supervisor {
    fn start(config: String, started: Instant) -> Self {
        let log_filter = std::env::var("RELAY_TEST_LOG").unwrap_or_else(|_| "warn".to_owned());
        let mut supervisor = Supervisor {
            config,
            log_filter,
            process: None,
            starts: 0,
            unexpected_exits: Vec::new(),
            earlier_stderr: String::new(),
            started,
        };
        supervisor.spawn();
        supervisor
    }

    fn spawn(&mut self) {
        let env = [("RUST_LOG", self.log_filter.as_str())];
        self.process = Some(RelayProcess::start_with_env(&self.config, &env));
        self.starts += 1;
    }

    fn retire(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill9();
            let status = process.wait_exit(WAIT);
            self.earlier_stderr.push_str(&process.stderr());
            self.earlier_stderr.push_str(&format!(
                "--- relay #{} ended ({status}) at {:.1}s ---\n",
                self.starts,
                self.started.elapsed().as_secs_f64()
            ));
        }
    }

    fn kill9_and_restart(&mut self, down: Duration) {
        self.retire();
        std::thread::sleep(down);
        self.spawn();
    }

    /// Restarts the relay if it exited by itself, recording the evidence.
    fn check(&mut self) {
        let Some(process) = &self.process else { return };
        let Some(status) = process.exit_status() else {
            return;
        };
        let evidence = format!(
            "relay #{} exited by itself ({status}) at {:.1}s; stderr tail:\n{}",
            self.starts,
            self.started.elapsed().as_secs_f64(),
            process.stderr_tail()
        );
        eprintln!("chaos: {evidence}");
        self.unexpected_exits.push(evidence);
        self.retire();
        self.spawn();
    }

    /// Sleeps `duration` while watching the relay.
    fn watch_for(&mut self, duration: Duration) {
        let end = Instant::now() + duration;
        loop {
            self.check();
            let now = Instant::now();
            if now >= end {
                return;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(100)));
        }
    }

    fn stderr_tail(&self, lines: usize) -> String {
        let mut text = self.earlier_stderr.clone();
        if let Some(process) = &self.process {
            text.push_str(&process.stderr());
        }
        tail_lines(&text, lines)
    }
}

/// The components under fault.
struct Rig {
    pg: PgCluster,
    pg_proxy: FaultProxy,
    broker: TansuBroker,
    broker_proxy: FaultProxy,
    relay: Supervisor,
    /// Harness-side trouble worth reporting (e.g. a fast shutdown that hung).
    incidents: Vec<String>,
}

impl Rig {
    /// Injects `fault`; returns a short description of what was done.
    fn inject(&mut self, fault: Fault, rng: &mut Rng) -> String {
        match fault {
            Fault::RelayKill9 => {
                let down = rng.millis(0, 1_000);
                self.relay.kill9_and_restart(down);
                format!("down {down:?}")
            }
            Fault::PgRestartFast => {
                let down = rng.millis(200, 3_000);
                let stopping = Instant::now();
                let pg = &mut self.pg;
                let stopped = catch_unwind(AssertUnwindSafe(|| pg.stop_fast()));
                let stop_took = stopping.elapsed();
                let mut note = String::new();
                if stopped.is_err() {
                    let incident = format!(
                        "postgres fast shutdown (SIGINT) did not finish in {stop_took:?} \
                         (walsender waiting for the relay to confirm?); stopped it \
                         immediately instead"
                    );
                    eprintln!("chaos: {incident}");
                    self.incidents.push(incident);
                    self.pg.stop_immediate();
                    note = " (fast stop hung: immediate)".to_owned();
                }
                self.relay.watch_for(down);
                self.pg.start_again();
                format!("stop took {stop_took:.1?}{note}, down {down:?}")
            }
            Fault::PgRestartImmediate => {
                let down = rng.millis(200, 3_000);
                self.pg.stop_immediate();
                self.relay.watch_for(down);
                self.pg.start_again();
                format!("down {down:?}")
            }
            Fault::BrokerPause => {
                let paused = rng.millis(1_000, 6_000);
                self.broker.pause();
                self.relay.watch_for(paused);
                self.broker.resume();
                format!("for {paused:?}")
            }
            Fault::PgLinkCut => cut_when_connected(&mut self.relay, &self.pg_proxy),
            Fault::BrokerLinkCut => cut_when_connected(&mut self.relay, &self.broker_proxy),
        }
    }
}

/// Cuts `proxy`'s connections once the relay has at least one (it may be between
/// attempts after an earlier fault), waiting at most [`LINK_WAIT`].
fn cut_when_connected(relay: &mut Supervisor, proxy: &FaultProxy) -> String {
    let waiting = Instant::now();
    while proxy.connection_count() == 0 && waiting.elapsed() < LINK_WAIT {
        relay.watch_for(Duration::from_millis(100));
    }
    let open = proxy.connection_count();
    proxy.cut();
    format!(
        "{open} connection(s), after waiting {:.1?}",
        waiting.elapsed()
    )
}

/// What the verifier found in Kafka.
#[derive(Debug, Default)]
struct Verdict {
    records: usize,
    duplicates: usize,
    lost: usize,
    lost_examples: Vec<String>,
    not_committed_seen: usize,
    not_committed_examples: Vec<String>,
    unknown_ids: usize,
    unknown_examples: Vec<String>,
    misrouted: usize,
    order_violations: usize,
    order_examples: Vec<String>,
}

const COMMITTED: u8 = 1;
const NOT_COMMITTED: u8 = 2;
const EXAMPLES: usize = 5;

fn note(examples: &mut Vec<String>, example: impl FnOnce() -> String) {
    if examples.len() < EXAMPLES {
        examples.push(example());
    }
}

fn verify(records: &[Record], logs: &[WriterLog]) -> Verdict {
    // Per writer and seq: 0 = never written, COMMITTED or NOT_COMMITTED.
    let mut states: Vec<Vec<u8>> = logs
        .iter()
        .map(|log| vec![0u8; usize::try_from(log.next_seq).expect("fits")])
        .collect();
    for (log, states) in logs.iter().zip(&mut states) {
        for &(first, last) in &log.committed {
            states[first as usize..=last as usize].fill(COMMITTED);
        }
        for &(first, last) in &log.not_committed {
            states[first as usize..=last as usize].fill(NOT_COMMITTED);
        }
    }
    let mut seen: Vec<Vec<bool>> = states.iter().map(|s| vec![false; s.len()]).collect();
    let mut last_in_partition: std::collections::HashMap<(&str, i32), u64> =
        std::collections::HashMap::new();
    let mut verdict = Verdict {
        records: records.len(),
        ..Verdict::default()
    };
    for record in records {
        let id = record.header("id").unwrap_or_default();
        let parsed = parse_event_id(&id).filter(|&(writer, seq)| {
            states
                .get(writer as usize)
                .is_some_and(|s| (seq as usize) < s.len())
        });
        let Some((writer, seq)) = parsed else {
            verdict.unknown_ids += 1;
            note(&mut verdict.unknown_examples, || {
                format!(
                    "{id:?} in {}/{}@{}",
                    record.topic, record.partition, record.offset
                )
            });
            continue;
        };
        let (w, s) = (writer as usize, seq as usize);
        if record.topic != topic_of(writer) {
            verdict.misrouted += 1;
        }
        match states[w][s] {
            COMMITTED => {}
            NOT_COMMITTED => {
                verdict.not_committed_seen += 1;
                note(&mut verdict.not_committed_examples, || {
                    format!(
                        "{id} in {}/{}@{}",
                        record.topic, record.partition, record.offset
                    )
                });
                continue;
            }
            _ => {
                verdict.unknown_ids += 1;
                note(&mut verdict.unknown_examples, || {
                    format!("{id} (seq never written)")
                });
                continue;
            }
        }
        if seen[w][s] {
            verdict.duplicates += 1;
            continue;
        }
        seen[w][s] = true;
        let last = last_in_partition
            .entry((record.topic.as_str(), record.partition))
            .or_insert(0);
        if seq < *last {
            verdict.order_violations += 1;
            note(&mut verdict.order_examples, || {
                format!(
                    "{}/{}@{}: first occurrence of seq {seq} after seq {}",
                    record.topic, record.partition, record.offset, *last
                )
            });
        }
        *last = (*last).max(seq);
    }
    for (w, states) in states.iter().enumerate() {
        for (s, state) in states.iter().enumerate() {
            if *state == COMMITTED && !seen[w][s] {
                verdict.lost += 1;
                note(&mut verdict.lost_examples, || {
                    event_id(u32::try_from(w).expect("fits"), s as u64)
                });
            }
        }
    }
    verdict
}

fn chaos_seed() -> u64 {
    match std::env::var("CHAOS_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|err| panic!("CHAOS_SEED={text:?} is not a u64: {err}")),
        Err(_) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock after 1970");
            now.as_secs() ^ u64::from(now.subsec_nanos()) << 20 ^ u64::from(std::process::id())
        }
    }
}

/// `CHAOS_LARGE=1` picks [`LARGE`], else [`BOUNDED`]; `CHAOS_EVENTS`, `CHAOS_FAULTS`
/// and `CHAOS_WINDOW_SECS` override single parameters (for quick local runs).
fn run_size() -> Size {
    let mut size = if std::env::var("CHAOS_LARGE").is_ok_and(|v| v == "1") {
        LARGE
    } else {
        BOUNDED
    };
    let number = |name: &str| {
        std::env::var(name).ok().map(|text| {
            text.trim()
                .parse::<u64>()
                .unwrap_or_else(|err| panic!("{name}={text:?} is not a number: {err}"))
        })
    };
    if let Some(events) = number("CHAOS_EVENTS") {
        size.events = usize::try_from(events).expect("fits");
        size.label = "custom";
    }
    if let Some(faults) = number("CHAOS_FAULTS") {
        size.faults = usize::try_from(faults).expect("fits");
        size.label = "custom";
    }
    if let Some(secs) = number("CHAOS_WINDOW_SECS") {
        size.window = Duration::from_secs(secs);
        size.label = "custom";
    }
    size
}

#[test]
fn chaos_committed_events_survive_faults_in_commit_order() {
    let size = run_size();
    let seed = chaos_seed();
    println!(
        "chaos: seed {seed} ({} run: {} events, {} faults over {:?}; replay with CHAOS_SEED={seed})",
        size.label, size.events, size.faults, size.window
    );
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let plan = schedule(&mut rng, size.faults, size.window);

    let (broker, broker_proxy) = TansuBroker::start_behind_proxy();
    let pg = cluster_with_outbox(PgOptions::default());
    // Slot and publication before the first write: every event committed from now on
    // is in the relay's stream.
    let mut admin = pg.client_db("app");
    admin
        .batch_execute(&format!(
            "CREATE PUBLICATION {PUBLICATION} FOR TABLE public.outbox WITH (publish = 'insert')"
        ))
        .expect("creating the publication");
    admin
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&SLOT],
        )
        .expect("creating the slot");
    drop(admin);
    let pg_proxy = FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], pg.port())));
    let direct_url = pg.url("postgres", None, "app");
    let proxied_url = direct_url.replace(
        &format!("127.0.0.1:{}", pg.port()),
        &format!("127.0.0.1:{}", pg_proxy.port()),
    );
    let config = kafka_config(&pg, &broker_proxy.addr().to_string(), "", None, &[])
        .replace(&direct_url, &proxied_url);
    assert!(
        config.contains(&proxied_url),
        "the relay goes through the proxy"
    );

    let relay = Supervisor::start(config, started);
    let mut rig = Rig {
        pg,
        pg_proxy,
        broker,
        broker_proxy,
        relay,
        incidents: Vec::new(),
    };

    let shared = Arc::new(WriterShared {
        port: rig.pg.port(),
        target: size.events,
        window: size.window,
        started: Instant::now(),
        committed: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    });
    let _stop_writers = StopWriters(Arc::clone(&shared));
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let shared = Arc::clone(&shared);
            let rng = Rng::new(seed ^ (u64::from(writer) + 1).wrapping_mul(0xA076_1D64_78BD_642F));
            std::thread::Builder::new()
                .name(format!("writer{writer}"))
                .spawn(move || run_writer(writer, &shared, rng))
                .expect("spawning a writer")
        })
        .collect();

    // Faults at their planned offsets from the writers' start.
    let mut fault_log = Vec::new();
    for (index, &(at, fault)) in plan.iter().enumerate() {
        let wait = at.saturating_sub(shared.started.elapsed());
        rig.relay.watch_for(wait.max(Duration::from_millis(500)));
        let t = started.elapsed();
        let committed = shared.committed.load(Ordering::SeqCst);
        let detail = rig.inject(fault, &mut rng);
        let line = format!(
            "{:>6.1}s fault {:>3}/{}: {} ({detail}; {committed} events committed so far)",
            t.as_secs_f64(),
            index + 1,
            plan.len(),
            fault.name()
        );
        eprintln!("chaos: {line}");
        fault_log.push(line);
    }
    let faults = fault_log.len();

    // Writers finish their quota (they may be behind after the last outages).
    while !writers.iter().all(|w| w.is_finished()) {
        rig.relay.watch_for(Duration::from_millis(200));
    }
    let logs: Vec<WriterLog> = writers
        .into_iter()
        .map(|w| {
            w.join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
        .collect();
    let writes_done = started.elapsed();

    // Let the relay acknowledge everything.
    let mut failures: Vec<String> = Vec::new();
    let end_lsn = rig.pg.current_wal_lsn();
    let caught_up = poll_until(size.catch_up, || {
        rig.relay.check();
        (rig.pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end_lsn).then_some(())
    });
    if caught_up.is_none() {
        failures.push(format!(
            "the relay did not acknowledge up to {} within {:?} after the last write: slot at {}",
            support::u64_to_lsn(end_lsn),
            size.catch_up,
            support::u64_to_lsn(rig.pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0))
        ));
    }
    let caught_up_at = started.elapsed();

    let committed: u64 = logs.iter().map(WriterLog::committed_events).sum();
    let topics: Vec<String> = (0..WRITERS).map(topic_of).collect();
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = consume(
        &rig.broker.bootstrap(),
        &topic_refs,
        usize::try_from(committed).expect("fits"),
        CONSUME_IDLE,
        size.consume,
    );
    let verdict = verify(&records, &logs);
    let elapsed = started.elapsed();

    println!(
        "chaos: {committed} events, {faults} faults, {} lost, {} duplicates",
        verdict.lost, verdict.duplicates
    );
    let sum = |f: fn(&WriterLog) -> usize| logs.iter().map(f).sum::<usize>();
    eprintln!(
        "chaos: seed {seed}; {} records read; {} transactions committed, {} rolled back, {} \
         failed before COMMIT, {} with a lost COMMIT answer ({} found committed); {} writer \
         connections; {} relay starts; writes done at {:.0}s, acknowledged at {:.0}s, verified \
         at {:.0}s",
        verdict.records,
        logs.iter().map(|l| l.committed.len()).sum::<usize>(),
        sum(|l| l.rollbacks),
        sum(|l| l.failed_before_commit),
        sum(|l| l.unknown_committed + l.unknown_not_committed),
        sum(|l| l.unknown_committed),
        sum(|l| l.connects),
        rig.relay.starts,
        writes_done.as_secs_f64(),
        caught_up_at.as_secs_f64(),
        elapsed.as_secs_f64(),
    );

    if verdict.lost > 0 {
        failures.push(format!(
            "{} committed events lost, e.g. {:?}",
            verdict.lost, verdict.lost_examples
        ));
    }
    if verdict.not_committed_seen > 0 {
        failures.push(format!(
            "{} records of rolled-back or uncommitted events, e.g. {:?}",
            verdict.not_committed_seen, verdict.not_committed_examples
        ));
    }
    if verdict.unknown_ids > 0 {
        failures.push(format!(
            "{} records with ids never written, e.g. {:?}",
            verdict.unknown_ids, verdict.unknown_examples
        ));
    }
    if verdict.misrouted > 0 {
        failures.push(format!(
            "{} records in another writer's topic",
            verdict.misrouted
        ));
    }
    if verdict.order_violations > 0 {
        failures.push(format!(
            "{} first occurrences out of commit order, e.g. {:?}",
            verdict.order_violations, verdict.order_examples
        ));
    }
    failures.extend(rig.relay.unexpected_exits.iter().cloned());
    failures.extend(rig.incidents.iter().cloned());
    if !failures.is_empty() {
        panic!(
            "chaos run failed (seed {seed}; replay with CHAOS_SEED={seed}):\n- {}\n\nfaults:\n{}\n\n\
             relay stderr tail:\n{}",
            failures.join("\n- "),
            fault_log.join("\n"),
            rig.relay.stderr_tail(80)
        );
    }
}

/// The "COMMIT outcome unknown" path, which a chaos run only hits by luck: a deferred
/// trigger makes COMMIT take seconds on the server, and the writer's link is cut in the
/// middle (the transaction commits, the answer is lost), or before COMMIT (it cannot
/// commit). Classification must wait for the old backend to finish, never guess.
#[test]
fn unknown_commit_outcomes_are_classified_from_the_database() {
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
                 $$ BEGIN PERFORM pg_sleep(0.7); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON outbox
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
        )
        .expect("creating the slow-commit trigger");
    let proxy = FaultProxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], pg.port())));

    // Committed, answer lost: cut while COMMIT runs the deferred trigger (3 × 0.7 s).
    let mut session = connect(proxy.port(), None).expect("no stop flag");
    let committing = std::thread::spawn(move || {
        let outcome = run_transaction(&mut session.client, 7, 0, 2, false);
        (outcome, session)
    });
    support::wait_until("COMMIT is running the deferred trigger", WAIT, || {
        let row = pg
            .client_db("app")
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                &[],
            )
            .expect("querying pg_stat_activity");
        row.get::<_, i64>(0) > 0
    });
    proxy.cut();
    let (outcome, old) = committing.join().expect("the committing thread");
    assert!(
        matches!(outcome, Outcome::CommitUnknown),
        "the cut loses the answer to COMMIT"
    );
    // The old backend is still sleeping in the trigger: resolving waits for it.
    let (committed, _) = resolve_unknown_commit(pg.port(), &old, 7, 0, 2);
    assert!(
        committed,
        "the transaction committed although its answer was lost"
    );

    // Not committed: the link is cut before COMMIT reaches the server.
    let mut session = connect(proxy.port(), None).expect("no stop flag");
    let mut tx = session.client.transaction().expect("BEGIN");
    tx.execute(INSERT_EVENTS, &[&7i32, &3i64, &5i64])
        .expect("inserting");
    proxy.cut();
    assert!(tx.commit().is_err(), "COMMIT on a cut link fails");
    let (committed, _) = resolve_unknown_commit(pg.port(), &session, 7, 3, 5);
    assert!(
        !committed,
        "a transaction whose COMMIT never arrived did not commit"
    );
}
