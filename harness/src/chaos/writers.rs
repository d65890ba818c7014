//! Writer threads: each commits transactions of its own events, one after the other, and
//! records each COMMIT outcome. An outcome lost with the connection is classified from
//! the database once the backend that ran it is gone, never guessed.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

use super::event_id;
use super::rng::Rng;

/// Share of transactions rolled back on purpose, in percent.
const ROLLBACK_PERCENT: u64 = 10;
/// How long a writer keeps trying to reach PostgreSQL before it gives up (the longest
/// planned outage is a few seconds).
const WRITER_CONNECT_DEADLINE: Duration = Duration::from_secs(300);

/// Inserts events `$2..=$3` of writer `$1`, in sequence order.
pub const INSERT_EVENTS: &str = "
    INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
    SELECT (lpad(to_hex($1::int), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
           'writer' || $1::int, 'w' || $1::int || '-' || g, 'ChaosEvent',
           jsonb_build_object('writer', $1::int, 'seq', g)
    FROM generate_series($2::bigint, $3::bigint) g ORDER BY g";

/// State shared by the writers and the injector.
pub struct WriterShared {
    pub port: u16,
    pub target: usize,
    pub window: Duration,
    pub started: Instant,
    pub committed: AtomicUsize,
    pub stop: AtomicBool,
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
pub struct StopWriters(pub Arc<WriterShared>);

impl Drop for StopWriters {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::SeqCst);
    }
}

/// What one writer did.
#[derive(Debug, Default)]
pub struct WriterLog {
    /// Sequence numbers handed out: `0..next_seq`.
    pub next_seq: u64,
    /// Committed transactions, as inclusive seq ranges, in commit order.
    pub committed: Vec<(u64, u64)>,
    /// For each of `committed`, `pg_current_wal_lsn()` read right after the commit
    /// (at or past its end): which PostgreSQL crash rewinds could replay it. `None` when
    /// it could not be read (a COMMIT whose answer was lost).
    pub committed_lsn: Vec<Option<u64>>,
    /// Rolled back, failed before COMMIT, or COMMIT lost and found not committed.
    pub not_committed: Vec<(u64, u64)>,
    pub rollbacks: usize,
    pub failed_before_commit: usize,
    pub unknown_committed: usize,
    pub unknown_not_committed: usize,
    pub connects: usize,
}

impl WriterLog {
    pub fn committed_events(&self) -> u64 {
        self.committed.iter().map(|(a, b)| b - a + 1).sum()
    }

    /// How many events PostgreSQL crash restarts may send again: a crash rewinds the
    /// slot to its last checkpointed position `from`, so every transaction committed
    /// after it and before the crash (`to`, the WAL position then) comes again, once per
    /// crash window it falls in. Transactions without a known position count in every
    /// window.
    pub fn crash_replayable_events(&self, windows: &[(u64, u64)]) -> u64 {
        self.committed
            .iter()
            .zip(&self.committed_lsn)
            .map(|((a, b), lsn)| {
                let size = b - a + 1;
                let hits = windows
                    .iter()
                    .filter(|(from, to)| lsn.map_or(true, |l| *from < l && l <= *to))
                    .count() as u64;
                size * hits
            })
            .sum()
    }
}

/// A writer's connection and the identity of its backend (to know when it is gone).
pub struct Session {
    pub client: Client,
    backend_pid: i32,
    backend_start: String,
}

pub enum Outcome {
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
pub fn connect(port: u16, stop: Option<&AtomicBool>) -> Option<Session> {
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

pub fn run_transaction(
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
pub fn resolve_unknown_commit(
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

pub fn run_writer(writer: u32, shared: &WriterShared, mut rng: Rng) -> WriterLog {
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
                let lsn = current
                    .client
                    .query_one("SELECT pg_current_wal_lsn()::text", &[])
                    .ok()
                    .map(|row| super::super::pg::lsn_to_u64(&row.get::<_, String>(0)));
                log.committed_lsn.push(lsn);
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
                    log.committed_lsn.push(None);
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
