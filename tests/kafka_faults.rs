//! The acknowledgement promise under faults, against a real PostgreSQL and a real Apache
//! Kafka broker: no ack past undelivered data, at-least-once across `kill -9` of the
//! relay and of the broker, a graceful broker restart, a broker down for longer than
//! `stall_release_ms`, schema changes mid-stream, and bounded memory for huge
//! transactions.

use outbox_relay_harness as support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use support::kafka::{consume, read_all, KafkaBroker, Record};
use support::outbox::{
    cluster_with_outbox, kafka_config, peak_rss_kib, start_streaming, SLOT, WAIT,
};
use support::{PgCluster, PgOptions, RelayProcess};

/// Insert `n` events of aggregate type `kind` in one transaction; returns their ids in
/// insertion order.
fn insert_events(pg: &PgCluster, kind: &str, n: usize, first: usize) -> Vec<String> {
    let mut client = pg.client_db("app");
    let rows = client
        .query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             SELECT ('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid, $1, 'a-' || (g % 7), 'T',
                    jsonb_build_object('n', g)
             FROM generate_series($2::bigint, $3::bigint) g ORDER BY g RETURNING id::text",
            &[&kind, &(first as i64), &((first + n - 1) as i64)],
        )
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// Every expected id is present; within each partition the first occurrences follow
/// `order` (commit order). Returns the number of duplicates.
fn verify_at_least_once_in_order(records: &[Record], order: &[String]) -> usize {
    let position: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut seen = HashSet::new();
    let mut last_in_partition: HashMap<(String, i32), usize> = HashMap::new();
    let mut duplicates = 0;
    for record in records {
        let id = record
            .header("id")
            .expect("every record carries its event id");
        let pos = *position
            .get(id.as_str())
            .unwrap_or_else(|| panic!("unexpected id {id}"));
        if !seen.insert(id.clone()) {
            duplicates += 1;
            continue;
        }
        let last = last_in_partition
            .entry((record.topic.clone(), record.partition))
            .or_insert(0);
        assert!(
            pos >= *last,
            "first occurrence of {id} (#{pos}) after #{last} in {}/{}",
            record.topic,
            record.partition
        );
        *last = pos;
    }
    let missing: Vec<_> = order
        .iter()
        .filter(|id| !seen.contains(*id))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "lost events, e.g. {missing:?} ({} of {} present)",
        seen.len(),
        order.len()
    );
    duplicates
}

#[test]
fn broker_paused_means_no_ack_until_delivery() {
    let broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    // Warm up: the topic exists and the producer is connected.
    insert_events(&pg, "ack", 1, 0);
    consume(&broker.bootstrap(), &["outbox.event.ack"], 1, WAIT);
    broker.pause();
    let before = pg.current_wal_lsn();
    let mut ids = Vec::new();
    for i in 0..100 {
        ids.extend(insert_events(&pg, "ack", 1, 1 + i));
    }
    let after_commits = pg.current_wal_lsn();
    let watch_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < watch_until {
        let confirmed = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0);
        assert!(
            confirmed <= before,
            "confirmed_flush_lsn {confirmed:X} passed {before:X} while the broker was paused"
        );
        assert_eq!(
            relay.exit_status(),
            None,
            "the relay waits, it does not die"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    broker.resume();
    let records = consume(&broker.bootstrap(), &["outbox.event.ack"], 101, WAIT);
    let mut order = vec!["00000000-0000-0000-0000-000000000000".to_string()];
    order.extend(ids);
    verify_at_least_once_in_order(&records, &order);
    support::wait_until("confirmed_flush_lsn passes the 100 commits", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= after_commits
    });
}

/// The relay is `kill -9`ed twice while 20,000 events are written. Each kill happens
/// mid-stream (transactions committed but not yet acknowledged), nothing is lost, first
/// occurrences keep commit order per partition, and the duplicates are bounded by what
/// was unacknowledged at the kills (a restart replays from the slot's position, which
/// prompt status updates keep close to what was delivered).
#[test]
fn kill_9_twice_mid_stream_loses_nothing_and_keeps_partition_order() {
    let broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let config = kafka_config(&pg, &broker.bootstrap(), "", None, &[]);
    // Create the slot, then write while the relay is killed and restarted.
    let mut relay = start_streaming(&config);
    let kinds = ["alpha", "beta", "gamma", "delta"];
    let mut order = Vec::new();
    // (end of the transaction's ids in `order`, pg_current_wal_lsn() after its commit)
    let mut commits: Vec<(usize, u64)> = Vec::new();
    let mut unacknowledged_at_kills = Vec::new();
    for txn in 0..200usize {
        let kind = kinds[txn % kinds.len()];
        order.extend(insert_events(&pg, kind, 100, txn * 100));
        commits.push((order.len(), pg.current_wal_lsn()));
        if txn == 60 || txn == 130 {
            relay.kill9();
            relay.wait_exit(WAIT);
            let confirmed = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0);
            // Events of transactions that may end past the acknowledged position: the
            // most a restart can send again.
            let acknowledged_events = commits
                .iter()
                .filter(|(_, lsn_after)| *lsn_after <= confirmed)
                .map(|(end, _)| *end)
                .max()
                .unwrap_or(0);
            unacknowledged_at_kills.push(order.len() - acknowledged_events);
            relay = RelayProcess::start(&config);
        }
    }
    let end = pg.current_wal_lsn();
    support::wait_until("everything acknowledged", Duration::from_secs(180), || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end
    });
    let topics: Vec<String> = kinds.iter().map(|k| format!("outbox.event.{k}")).collect();
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = read_all(&broker.bootstrap(), &topic_refs);
    let duplicates = verify_at_least_once_in_order(&records, &order);
    support::outbox::report(&format!(
        "kill -9 twice: {} events, {} records, {duplicates} duplicates; unacknowledged \
         events at the kills: {unacknowledged_at_kills:?}",
        order.len(),
        records.len()
    ));
    assert!(
        unacknowledged_at_kills.iter().all(|&n| n > 0),
        "each kill hit a stream with unacknowledged events: {unacknowledged_at_kills:?}"
    );
    let bound: usize = unacknowledged_at_kills.iter().sum();
    assert!(
        duplicates <= bound,
        "{duplicates} duplicates, more than the {bound} events unacknowledged at the kills"
    );
    drop(relay);
}

#[test]
fn alter_table_mid_stream_loses_and_misroutes_nothing() {
    let broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    let mut order = insert_events(&pg, "schema", 50, 0);
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox ADD COLUMN tenant text DEFAULT 'acme'")
        .unwrap();
    order.extend(insert_events(&pg, "schema", 50, 50));
    // Reorder the columns the router uses: drop and re-add `type`, so positions shift.
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox DROP COLUMN type; ALTER TABLE outbox ADD COLUMN type text DEFAULT 'T'")
        .unwrap();
    let mut client = pg.client_db("app");
    let rows = client
        .query(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, payload, tenant)
             SELECT ('00000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid, 'schema', 'x', jsonb_build_object('n', g), 't'
             FROM generate_series(100, 149) g ORDER BY g RETURNING id::text",
            &[],
        )
        .unwrap();
    order.extend(rows.iter().map(|r| r.get::<_, String>(0)));
    let records = consume(&broker.bootstrap(), &["outbox.event.schema"], 150, WAIT);
    assert_eq!(records.len(), 150);
    assert_eq!(verify_at_least_once_in_order(&records, &order), 0);
    for record in &records {
        let n: u64 = serde_json::from_slice::<serde_json::Value>(record.value.as_deref().unwrap())
            .unwrap()["n"]
            .as_u64()
            .unwrap();
        assert!(
            record.header("id").unwrap().ends_with(&format!("{n:012}")),
            "payload belongs to its id"
        );
    }
    drop(relay);
}

#[test]
fn a_million_row_transaction_is_relayed_with_bounded_memory() {
    let broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    const ROWS: usize = 1_000_000;
    insert_events(&pg, "bulk", 1, 0);
    consume(&broker.bootstrap(), &["outbox.event.bulk"], 1, WAIT);
    let started = Instant::now();
    pg.client_db("app")
        .batch_execute(&format!(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
             SELECT 'bulk', 'a-' || (g % 100), 'T', jsonb_build_object('n', g, 'pad', repeat('p', 64))
             FROM generate_series(1, {ROWS}) g"
        ))
        .unwrap();
    let after_commit = pg.current_wal_lsn();
    support::wait_until(
        "the million-row transaction is acknowledged",
        Duration::from_secs(600),
        || pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= after_commit,
    );
    let elapsed = started.elapsed();
    let peak_kib = peak_rss_kib(relay.pid()).expect("relay still running");
    support::outbox::report(&format!(
        "1,000,000-row transaction: relayed and acknowledged in {:.1} s; relay peak RSS {} MiB",
        elapsed.as_secs_f64(),
        peak_kib / 1024
    ));
    // Bounded by max_in_flight (backpressure), not by the transaction: a relay that
    // buffered the transaction would hold well over a gigabyte here.
    assert!(
        peak_kib < 1024 * 1024,
        "peak RSS {peak_kib} KiB is not bounded"
    );
    let records = consume(
        &broker.bootstrap(),
        &["outbox.event.bulk"],
        ROWS + 1,
        Duration::from_secs(300),
    );
    // Every row by its payload number, once at least: ids, not a count.
    let mut seen = vec![false; ROWS + 1];
    for record in records.iter().filter(|r| r.topic == "outbox.event.bulk") {
        let value: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().expect("a value")).expect("JSON");
        let n = value["n"].as_u64().expect("n");
        if let Some(slot) = usize::try_from(n).ok().and_then(|n| seen.get_mut(n)) {
            *slot = true;
        }
    }
    // Row 0 is the warm-up event; rows 1..=ROWS are the transaction's.
    let missing: Vec<usize> = (1..=ROWS).filter(|&n| !seen[n]).take(5).collect();
    assert!(
        missing.is_empty(),
        "rows of the million-row transaction missing in Kafka, e.g. n = {missing:?} ({} records read)",
        records.len()
    );
}

/// Aggregate types the [`Writer`] spreads its events over (one topic each).
const WRITER_KINDS: [&str; 3] = ["red", "green", "blue"];
/// Events per transaction the [`Writer`] commits.
const WRITER_TXN_EVENTS: usize = 10;

/// One committed transaction of the [`Writer`]: its event ids in insertion order, and
/// `pg_current_wal_lsn()` read right after its commit returned, which is at or past
/// the commit's `end_lsn`: once the slot is confirmed at or past it, every one of
/// these events must be in Kafka.
#[derive(Debug, Clone)]
struct Committed {
    ids: Vec<String>,
    lsn_after: u64,
}

/// A thread committing transactions of [`WRITER_TXN_EVENTS`] events, one after another,
/// until stopped: a stream that runs across the faults.
struct Writer {
    committed: Arc<Mutex<Vec<Committed>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    fn start(pg: &PgCluster) -> Self {
        let committed = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut client = pg.client_db("app");
        let thread = std::thread::spawn({
            let committed = Arc::clone(&committed);
            let stop = Arc::clone(&stop);
            move || {
                let mut txn = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let kind = WRITER_KINDS[txn % WRITER_KINDS.len()];
                    let first = txn * WRITER_TXN_EVENTS;
                    let rows = client
                        .query(
                            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                             SELECT ('10000000-0000-0000-0000-' || lpad(g::text, 12, '0'))::uuid,
                                    $1, 'a-' || (g % 7), 'T', jsonb_build_object('n', g)
                             FROM generate_series($2::bigint, $3::bigint) g ORDER BY g
                             RETURNING id::text",
                            &[
                                &kind,
                                &(first as i64),
                                &((first + WRITER_TXN_EVENTS - 1) as i64),
                            ],
                        )
                        .expect("writer insert");
                    let lsn_after = support::lsn_to_u64(&support::query_lsn(
                        &mut client,
                        "SELECT pg_current_wal_lsn()::text",
                    ));
                    committed.lock().unwrap().push(Committed {
                        ids: rows.iter().map(|r| r.get(0)).collect(),
                        lsn_after,
                    });
                    txn += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        Writer {
            committed,
            stop,
            thread: Some(thread),
        }
    }

    fn committed_count(&self) -> usize {
        self.committed.lock().unwrap().len()
    }

    /// Waits until `n` more transactions have committed than now.
    fn wait_for_more(&self, n: usize) {
        let target = self.committed_count() + n;
        support::wait_until(&format!("{n} more writer transactions"), WAIT, || {
            self.committed_count() >= target
        });
    }

    /// Stops the thread and returns every committed transaction, in commit order.
    fn stop(mut self) -> Vec<Committed> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("writer thread");
        }
        self.committed.lock().unwrap().clone()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn writer_topics() -> Vec<String> {
    WRITER_KINDS
        .iter()
        .map(|k| format!("outbox.event.{k}"))
        .collect()
}

/// Every event of every transaction that `confirmed` (a slot's confirmed_flush_lsn) has
/// passed is in `records`: acknowledged means durable in Kafka. Returns how many
/// transactions that covered.
fn assert_acknowledged_are_in_kafka(
    committed: &[Committed],
    confirmed: u64,
    records: &[Record],
) -> usize {
    let present: HashSet<String> = records.iter().filter_map(|r| r.header("id")).collect();
    let acknowledged: Vec<&Committed> = committed
        .iter()
        .filter(|txn| txn.lsn_after <= confirmed)
        .collect();
    for txn in &acknowledged {
        let missing: Vec<&String> = txn.ids.iter().filter(|id| !present.contains(*id)).collect();
        assert!(
            missing.is_empty(),
            "the slot was acknowledged at {} past a transaction ending by {} whose events \
             {missing:?} are not in Kafka",
            support::u64_to_lsn(confirmed),
            support::u64_to_lsn(txn.lsn_after)
        );
    }
    acknowledged.len()
}

/// How the broker goes away in [`broker_outage_loses_nothing_acknowledged`].
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// `kill -9` of the broker mid-stream; the relay is killed too while it is down.
    Kill9,
    /// `kill -9` and down for several `stall_release_ms` periods, so the relay lets
    /// the replication connection go (and retries) during the outage; then the relay
    /// is killed too.
    LongerThanStallRelease,
}

/// Writers run across a broker `kill -9`. While the broker is down the relay is
/// `kill -9`ed as well, so whatever it held only in memory (librdkafka's queue) is gone:
/// from then on only what it acknowledged and what Kafka stored count. The broker
/// restarts on its log directory, and before the relay runs again every transaction
/// the slot was acknowledged past must be in Kafka. A relay that acknowledged on send
/// rather than on the `acks=all` delivery report fails here. Then a new relay delivers
/// the rest: every committed event, per-partition commit order.
fn broker_outage_loses_nothing_acknowledged(outage: Outage) {
    let mut broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let mut config = kafka_config(&pg, &broker.bootstrap(), "", None, &[]);
    if let Outage::LongerThanStallRelease = outage {
        config = config.replace(
            "status_interval_ms = 200\n",
            "status_interval_ms = 200\n[relay]\nstall_release_ms = 2000\n",
        );
    }
    let relay = start_streaming(&config);
    let writer = Writer::start(&pg);
    // Mid-stream: the writer has been going for a while and the relay delivers.
    writer.wait_for_more(50);
    consume(&broker.bootstrap(), &["outbox.event.red"], 50, WAIT);

    let committed_at_kill = writer.committed_count();
    let confirmed_at_kill = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0);
    broker.kill9();
    // The stream goes on while the broker is down.
    writer.wait_for_more(30);
    if let Outage::LongerThanStallRelease = outage {
        // The relay, stalled with events in flight, lets its replication connection go
        // (the slot becomes inactive) instead of holding it.
        support::wait_until("the relay releases the slot while stalled", WAIT, || {
            !slot_is_active(&pg)
        });
        // ... and comes back, stalls again: a few of these cycles.
        support::wait_until("the relay reconnects during the outage", WAIT, || {
            slot_is_active(&pg)
        });
        support::wait_until("and releases the slot again", WAIT, || !slot_is_active(&pg));
        assert_eq!(relay.exit_status(), None, "the relay waits out the outage");
    }
    relay.kill9();
    relay.wait_exit(WAIT);
    let confirmed_with_relay_dead = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0);
    writer.wait_for_more(10);
    let committed = writer.stop();

    broker.restart();
    let topics = writer_topics();
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let stored = read_all(&broker.bootstrap(), &topic_refs);
    let acknowledged =
        assert_acknowledged_are_in_kafka(&committed, confirmed_with_relay_dead, &stored);
    let unacknowledged_at_kill = committed[..committed_at_kill]
        .iter()
        .filter(|txn| txn.lsn_after > confirmed_at_kill)
        .count();

    // A new relay delivers everything else.
    let relay = RelayProcess::start(&config);
    let end = pg.current_wal_lsn();
    support::wait_until(
        "the new relay acknowledges everything",
        Duration::from_secs(180),
        || pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end,
    );
    let records = read_all(&broker.bootstrap(), &topic_refs);
    let order: Vec<String> = committed.iter().flat_map(|txn| txn.ids.clone()).collect();
    let duplicates = verify_at_least_once_in_order(&records, &order);
    support::outbox::report(&format!(
        "broker outage ({outage:?}): {} events in {} transactions; at the broker kill {} \
         committed transactions were not yet acknowledged; {acknowledged} acknowledged \
         transactions all in Kafka after the broker restart; {} records, {duplicates} \
         duplicates",
        order.len(),
        committed.len(),
        unacknowledged_at_kill,
        records.len()
    ));
    drop(relay);
}

/// Whether a walsender streams from the relay's slot.
fn slot_is_active(pg: &PgCluster) -> bool {
    pg.client()
        .query_one(
            "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .map(|row| row.get::<_, bool>(0))
        .unwrap_or(false)
}

#[test]
fn broker_kill_9_mid_stream_loses_nothing_acknowledged() {
    broker_outage_loses_nothing_acknowledged(Outage::Kill9);
}

#[test]
fn broker_down_longer_than_stall_release_loses_nothing_acknowledged() {
    broker_outage_loses_nothing_acknowledged(Outage::LongerThanStallRelease);
}

/// A controlled broker shutdown (SIGTERM) and restart while writers run: the relay rides
/// it out without restarting, and every event arrives once per attempt in commit order.
#[test]
fn graceful_broker_restart_mid_stream_loses_nothing_and_keeps_order() {
    let mut broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let config = kafka_config(&pg, &broker.bootstrap(), "", None, &[]);
    let relay = start_streaming(&config);
    let writer = Writer::start(&pg);
    writer.wait_for_more(50);
    consume(&broker.bootstrap(), &["outbox.event.red"], 50, WAIT);
    let confirmed_before = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0);
    broker.stop();
    writer.wait_for_more(30);
    let confirmed_while_down = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0);
    broker.restart();
    writer.wait_for_more(30);
    let committed = writer.stop();
    let end = pg.current_wal_lsn();
    support::wait_until("everything acknowledged after the restart", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end
    });
    assert_eq!(relay.exit_status(), None, "the relay rode the restart out");
    let topics = writer_topics();
    let topic_refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let records = read_all(&broker.bootstrap(), &topic_refs);
    let order: Vec<String> = committed.iter().flat_map(|txn| txn.ids.clone()).collect();
    let duplicates = verify_at_least_once_in_order(&records, &order);
    support::outbox::report(&format!(
        "graceful broker restart: {} events, {} records, {duplicates} duplicates; slot at \
         {} before the stop, {} while down",
        order.len(),
        records.len(),
        support::u64_to_lsn(confirmed_before),
        support::u64_to_lsn(confirmed_while_down)
    ));
}

/// `pg_stat_replication`'s `reply_time` (the relay's last status update, as text) and
/// how far the walsender has sent, for the relay's one walsender.
fn walsender_state(client: &mut postgres::Client) -> Option<(String, u64)> {
    let row = client
        .query_opt(
            "SELECT reply_time::text, (sent_lsn - '0/0'::pg_lsn)::text FROM pg_stat_replication",
            &[],
        )
        .ok()??;
    let reply: Option<String> = row.get(0);
    let sent: Option<String> = row.get(1);
    Some((reply?, sent?.parse().ok()?))
}

/// Topic creation runs off the pipeline's loop: with the broker paused while the relay
/// creates a new topic, status updates keep going (`reply_time` keeps advancing) and
/// the event arrives once the broker answers again. Before, the loop awaited the admin
/// request (up to 10 s) and sent nothing meanwhile.
#[test]
fn status_updates_keep_flowing_while_a_topic_is_created_on_a_paused_broker() {
    /// Watched for less than the admin request's 10 s timeout.
    const WATCH: Duration = Duration::from_secs(8);
    /// Status updates go out every 200 ms here; a gap this long means the loop stalled.
    const LONGEST_GAP: Duration = Duration::from_secs(3);
    let broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&kafka_config(&pg, &broker.bootstrap(), "", None, &[]));
    insert_events(&pg, "warm", 1, 0);
    consume(&broker.bootstrap(), &["outbox.event.warm"], 1, WAIT);
    let mut client = pg.client();
    broker.pause();
    let ids = insert_events(&pg, "fresh", 1, 1);
    let written = pg.current_wal_lsn();
    support::wait_until("the walsender sent the new event", WAIT, || {
        walsender_state(&mut client).is_some_and(|(_, sent)| sent >= written)
    });
    let mut last = walsender_state(&mut client).map(|(reply, _)| reply);
    let mut last_change = Instant::now();
    let mut longest = Duration::ZERO;
    let until = Instant::now() + WATCH;
    while Instant::now() < until {
        let reply = walsender_state(&mut client).map(|(reply, _)| reply);
        if reply.is_some() && reply != last {
            longest = longest.max(last_change.elapsed());
            last_change = Instant::now();
            last = reply;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    longest = longest.max(last_change.elapsed());
    assert!(
        longest < LONGEST_GAP,
        "no status update for {longest:?} while the topic was being created; relay stderr:\n{}",
        relay.stderr_tail()
    );
    broker.resume();
    let records = consume(&broker.bootstrap(), &["outbox.event.fresh"], 1, WAIT);
    assert_eq!(records[0].header("id"), Some(ids[0].clone()));
    let end = pg.current_wal_lsn();
    support::wait_until("the new topic's event is acknowledged", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end
    });
    assert_eq!(relay.exit_status(), None, "the relay keeps running");
}
