//! In-process runs of `relay::run(settings, shutdown)` against a real PostgreSQL, with
//! the in-memory sink (`support::memory_sink`) standing where Kafka would: the paths a
//! broker rarely takes on demand — the producer queue full, a record refused at once or
//! reported failed, the dead-letter topic refusing its record, shutdown with events in
//! flight — each checked by event id and by where the slot was acknowledged.

use outbox_relay_harness as support;

use std::future::Future;
use std::time::Duration;

use outbox_relay::config::Config;
use outbox_relay::relay::settings::Settings;
use outbox_relay::relay::{Definite, RelayError};
use support::memory_sink::MemorySinkControl;
use support::outbox::{cluster_with_outbox, insert_events, SLOT, WAIT};
use support::{wait_until, PgCluster, PgOptions};
use tokio::sync::oneshot;

/// Settings of a relay on database `app`, with `extra` TOML appended and the memory
/// sink of `control` in place of the configured one.
fn settings(pg: &PgCluster, control: &MemorySinkControl, extra: &str) -> Settings {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("relay.toml");
    let text = format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\n{extra}",
        pg.url("postgres", None, "app")
    );
    std::fs::write(&path, text).expect("writing the config");
    let mut settings = Config::load(&path).unwrap_or_else(|e| panic!("config: {e}"));
    settings.sink = control.spec();
    settings
}

/// `relay::run` on its own runtime; the test thread stays outside it (the blocking
/// PostgreSQL client the tests use cannot run inside a runtime).
struct InProcessRelay {
    runtime: tokio::runtime::Runtime,
    run: Option<tokio::task::JoinHandle<Result<(), RelayError>>>,
    stop: Option<oneshot::Sender<()>>,
}

impl InProcessRelay {
    fn start(settings: Settings) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let run = runtime.spawn(outbox_relay::relay::run(settings, shutdown));
        InProcessRelay {
            runtime,
            run: Some(run),
            stop: Some(stop),
        }
    }

    fn is_finished(&self) -> bool {
        self.run.as_ref().map_or(true, |run| run.is_finished())
    }

    /// Waits for `run` to return on its own.
    fn exit(&mut self, timeout: Duration) -> Result<(), Box<RelayError>> {
        let run = self.run.take().expect("the relay is running");
        block_on_with_timeout(&self.runtime, run, timeout)
    }

    /// Asks for a graceful shutdown and waits for `run` to return.
    fn shut_down(mut self, timeout: Duration) -> Result<(), Box<RelayError>> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.exit(timeout)
    }
}

fn block_on_with_timeout(
    runtime: &tokio::runtime::Runtime,
    run: impl Future<Output = Result<Result<(), RelayError>, tokio::task::JoinError>>,
    timeout: Duration,
) -> Result<(), Box<RelayError>> {
    runtime
        .block_on(async { tokio::time::timeout(timeout, run).await })
        .unwrap_or_else(|_| panic!("relay::run did not return within {timeout:?}"))
        .expect("relay::run panicked")
        .map_err(Box::new)
}

/// Waits until the relay streams from the slot (rows committed before are not part of
/// its stream).
fn wait_streaming(pg: &PgCluster) {
    let mut client = pg.client();
    wait_until("the relay streams from its slot", WAIT, || {
        client
            .query_one(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active",
                &[&SLOT],
            )
            .map(|row| row.get::<_, i64>(0) == 1)
            .unwrap_or(false)
    });
}

/// Inserts `n` events of `kind` in one transaction; their ids in insert order.
fn insert_transaction(pg: &PgCluster, kind: &str, n: usize) -> Vec<String> {
    let mut client = pg.client_db("app");
    let mut txn = client.transaction().expect("begin");
    let ids = (0..n)
        .map(|i| {
            txn.query_one(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                 VALUES ($1, $2, 'T', jsonb_build_object('n', $3::int)) RETURNING id::text",
                &[&kind, &format!("a{i}"), &i32::try_from(i).expect("small")],
            )
            .expect("insert")
            .get(0)
        })
        .collect();
    txn.commit().expect("commit");
    ids
}

fn current_wal_lsn(pg: &PgCluster) -> u64 {
    pg.current_wal_lsn()
}

fn confirmed_flush(pg: &PgCluster) -> u64 {
    pg.slot_confirmed_flush_lsn(SLOT).expect("the slot exists")
}

#[test]
fn a_full_producer_queue_pauses_the_stream_and_loses_nothing() {
    let pg = cluster_with_outbox(PgOptions::default());
    // Room for 8 records while 1,000 arrive in transactions of 100: `send` answers
    // "queue full" again and again; the pipeline must keep each refused record, in
    // order, until deliveries make room.
    let control = MemorySinkControl::new(8);
    let relay = InProcessRelay::start(settings(&pg, &control, ""));
    wait_streaming(&pg);
    let mut expected = Vec::new();
    for _ in 0..10 {
        expected.extend(insert_transaction(&pg, "order", 100));
    }
    let last_commit = current_wal_lsn(&pg);
    wait_until("every event delivered", WAIT, || {
        control.event_ids().len() >= expected.len()
    });
    assert_eq!(
        control.event_ids(),
        expected,
        "every event once, in commit order"
    );
    assert!(
        control.queue_full_count() > 0,
        "the test must reach the queue-full path"
    );
    wait_until("the slot acknowledged past the last commit", WAIT, || {
        confirmed_flush(&pg) >= last_commit
    });
    relay.shut_down(WAIT).expect("graceful stop");
}

#[test]
fn an_event_refused_at_once_or_reported_failed_goes_to_the_dead_letter_topic() {
    let pg = cluster_with_outbox(PgOptions::default());
    let control = MemorySinkControl::new(1_000);
    control.refuse(|event| {
        (event.topic == "outbox.event.huge").then(|| ("record too large".to_owned(), true))
    });
    control.fail(|event| {
        (event.topic == "outbox.event.broken").then(|| ("invalid record".to_owned(), false))
    });
    let relay = InProcessRelay::start(settings(&pg, &control, "[dead_letter]\ntopic = \"dead\"\n"));
    wait_streaming(&pg);
    let first = insert_events(&pg, "order", 3);
    let huge = insert_events(&pg, "huge", 1);
    let broken = insert_events(&pg, "broken", 1);
    let last = insert_events(&pg, "order", 3);
    let last_commit = current_wal_lsn(&pg);
    wait_until("the later events delivered", WAIT, || {
        control.event_ids().ends_with(&last)
    });
    assert_eq!(control.event_ids(), [first, last].concat());
    let dead: Vec<_> = control
        .durable()
        .into_iter()
        .filter(|record| record.dead_letter)
        .collect();
    let dead_ids: Vec<_> = dead.iter().filter_map(|r| r.id()).collect();
    assert_eq!(dead_ids, [huge[0].as_str(), broken[0].as_str()]);
    for (record, (reason, topic)) in dead.iter().zip([
        ("record too large", "outbox.event.huge"),
        ("invalid record", "outbox.event.broken"),
    ]) {
        assert_eq!(record.event.topic, "dead");
        assert_eq!(record.header("error"), Some(reason));
        assert_eq!(record.header("source.topic"), Some(topic));
        assert!(
            record.event.value().is_some(),
            "a dead letter keeps its value"
        );
    }
    wait_until("the slot acknowledged past the last commit", WAIT, || {
        confirmed_flush(&pg) >= last_commit
    });
    relay.shut_down(WAIT).expect("graceful stop");
}

#[test]
fn a_dead_letter_record_refused_for_its_size_goes_again_without_its_value() {
    let pg = cluster_with_outbox(PgOptions::default());
    let control = MemorySinkControl::new(1_000);
    control.refuse(|event| {
        let too_large = event.topic == "outbox.event.huge"
            || (event.topic == "dead" && event.value().is_some());
        too_large.then(|| ("record too large".to_owned(), true))
    });
    let relay = InProcessRelay::start(settings(&pg, &control, "[dead_letter]\ntopic = \"dead\"\n"));
    wait_streaming(&pg);
    let huge = insert_events(&pg, "huge", 1);
    let after = insert_events(&pg, "order", 2);
    let last_commit = current_wal_lsn(&pg);
    wait_until("the later events delivered", WAIT, || {
        control.event_ids() == after
    });
    let dead: Vec<_> = control
        .durable()
        .into_iter()
        .filter(|record| record.dead_letter)
        .collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].id(), Some(huge[0].as_str()));
    assert_eq!(dead[0].event.value(), None);
    assert_eq!(dead[0].header("value.dropped"), Some("record too large"));
    wait_until("the slot acknowledged past the last commit", WAIT, || {
        confirmed_flush(&pg) >= last_commit
    });
    relay.shut_down(WAIT).expect("graceful stop");
}

#[test]
fn a_dead_letter_topic_that_refuses_its_record_stops_the_relay_unacknowledged() {
    let pg = cluster_with_outbox(PgOptions::default());
    let control = MemorySinkControl::new(1_000);
    control.refuse(|event| match event.topic.as_str() {
        "outbox.event.bad" => Some(("invalid record".to_owned(), false)),
        "dead" => Some(("not authorized to write".to_owned(), false)),
        _ => None,
    });
    let mut relay =
        InProcessRelay::start(settings(&pg, &control, "[dead_letter]\ntopic = \"dead\"\n"));
    wait_streaming(&pg);
    let first = insert_events(&pg, "order", 2);
    wait_until("the first events delivered", WAIT, || {
        control.event_ids() == first
    });
    let before_bad = current_wal_lsn(&pg);
    insert_events(&pg, "bad", 1);
    insert_events(&pg, "order", 2);
    wait_until("the relay stops", WAIT, || relay.is_finished());
    match relay.exit(WAIT).map_err(|e| *e) {
        Err(RelayError::Definite(Definite::DeadLetterRefused(reason))) => {
            assert!(reason.contains("not authorized"), "{reason}")
        }
        other => panic!("expected the dead-letter refusal to stop the relay, got {other:?}"),
    }
    assert_eq!(
        control.event_ids(),
        first,
        "nothing after the refused event"
    );
    assert!(control.durable().iter().all(|r| !r.dead_letter));
    let flush = confirmed_flush(&pg);
    assert!(
        flush <= before_bad,
        "the slot was acknowledged past the refused event: {flush} > {before_bad}"
    );
}

#[test]
fn an_event_reported_failed_without_a_dead_letter_topic_stops_the_relay_unacknowledged() {
    let pg = cluster_with_outbox(PgOptions::default());
    let control = MemorySinkControl::new(1_000);
    control.fail(|event| {
        (event.topic == "outbox.event.bad").then(|| ("invalid record".to_owned(), false))
    });
    let mut relay = InProcessRelay::start(settings(&pg, &control, ""));
    wait_streaming(&pg);
    let first = insert_events(&pg, "order", 2);
    wait_until("the first events delivered", WAIT, || {
        control.event_ids() == first
    });
    let before_bad = current_wal_lsn(&pg);
    let bad = insert_events(&pg, "bad", 1);
    wait_until("the relay stops", WAIT, || relay.is_finished());
    match relay.exit(WAIT).map_err(|e| *e) {
        Err(RelayError::Definite(Definite::Undeliverable { topic, reason, .. })) => {
            assert_eq!(topic, "outbox.event.bad");
            assert!(reason.contains("invalid record"), "{reason}");
        }
        other => panic!("expected the failed event to stop the relay, got {other:?}"),
    }
    assert!(!control.event_ids().contains(&bad[0]));
    assert!(confirmed_flush(&pg) <= before_bad);
}

#[test]
fn shutdown_with_events_in_flight_acknowledges_exactly_what_was_delivered() {
    let pg = cluster_with_outbox(PgOptions::default());
    let control = MemorySinkControl::new(1_000);
    control.set_paused(true);
    let relay = InProcessRelay::start(settings(
        &pg,
        &control,
        "[relay]\nshutdown_timeout_ms = 3000\n",
    ));
    wait_streaming(&pg);
    let before = current_wal_lsn(&pg);
    let delivered = insert_transaction(&pg, "order", 20);
    let after_first = current_wal_lsn(&pg);
    let held = insert_transaction(&pg, "order", 20);
    wait_until("both transactions in the sink's queue", WAIT, || {
        control.queued() == 40
    });
    // Shutdown starts with 40 events in flight; the first transaction's are confirmed
    // during the drain, the second's never.
    let stopping = std::thread::spawn(move || relay.shut_down(WAIT));
    control.release(20);
    stopping
        .join()
        .expect("shutdown thread")
        .expect("graceful stop");
    assert_eq!(control.event_ids(), delivered);
    let flush = confirmed_flush(&pg);
    assert!(
        flush > before && flush <= after_first,
        "the final status update must acknowledge the first transaction and nothing of the second: flush {flush}, first transaction in ({before}, {after_first}]"
    );

    // The undelivered transaction comes again after a restart (at-least-once).
    control.set_paused(false);
    let relay = InProcessRelay::start(settings(&pg, &control, ""));
    let after_second = current_wal_lsn(&pg);
    wait_until(
        "the held transaction delivered after the restart",
        WAIT,
        || control.event_ids().ends_with(&held),
    );
    assert_eq!(control.event_ids(), [delivered, held].concat());
    wait_until(
        "the slot acknowledged past the second transaction",
        WAIT,
        || confirmed_flush(&pg) >= after_second,
    );
    relay.shut_down(WAIT).expect("graceful stop");
}
