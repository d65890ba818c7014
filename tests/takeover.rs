//! Two relays on one slot when the streaming one's host vanishes: its link is
//! black-holed (the fault proxy forwards nothing and keeps the sockets open), so
//! PostgreSQL keeps its walsender, and the slot, until `wal_sender_timeout`. The waiting
//! relay sees the walsender's `reply_time` stand still, ends it and takes over; the old
//! one, once its link is back, finds the slot taken and waits. And a waiting relay
//! writes nothing while it waits.

use outbox_relay_harness as support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outbox_relay::relay::log::TAKING_OVER;
use support::outbox::{
    cluster_with_outbox, event_ids, slot_active_pid, stdout_config, with_metrics, SLOT, WAIT,
};
use support::proxy::FaultProxy;
use support::{PgCluster, PgOptions, RelayProcess};

/// What a relay logs once each time it starts waiting for the busy slot.
const WAITING: &str = outbox_relay::relay::log::WAITING_FOR_SLOT;

/// Inserts events with the ids `first..first + n` (as UUIDs whose last group is the
/// number), one transaction each; returns the ids in commit order.
fn insert(pg: &PgCluster, first: u32, n: u32) -> Vec<String> {
    let mut client = pg.client_db("app");
    (first..first + n)
        .map(|number| {
            let id = format!("00000000-0000-0000-0000-{number:012}");
            client
                .execute(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                     VALUES ($1::text::uuid, 'takeover', 'a', 'T', '{}')",
                    &[&id],
                )
                .unwrap_or_else(|e| panic!("inserting event {number}: {e}"));
            id
        })
        .collect()
}

/// The number at the end of an id made by [`insert`].
fn number(id: &str) -> u32 {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not an id of this test: {id}"))
}

/// Waits until `relay` printed every id in `want` (duplicates allowed).
fn wait_printed(relay: &RelayProcess, want: &[String], what: &str) {
    support::wait_until(what, WAIT, || {
        let seen = event_ids(&relay.lines());
        want.iter().all(|id| seen.contains(id))
    });
}

/// A stdout relay config reaching PostgreSQL through `proxy`, with `extra` lines added
/// to `[postgres]`.
fn config_through(pg: &PgCluster, proxy: &FaultProxy, extra: &str) -> String {
    let direct = format!("127.0.0.1:{}/app", pg.port());
    let through_proxy = format!("127.0.0.1:{}/app?connect_timeout=2", proxy.port());
    stdout_config(pg).replace(&direct, &through_proxy).replace(
        "status_interval_ms = 200\n",
        &format!("status_interval_ms = 200\n{extra}"),
    )
}

/// One takeover round (events numbered from `round * 10`): two events reach the active
/// relay `relays[active]`, `cut_off` silences it, two more are written, the standby
/// takes the slot within `within`, two more are written, and the standby prints the
/// four. Returns the events before and after the cut and how long after it the
/// standby's walsender held the slot.
fn takeover_round(
    pg: &PgCluster,
    relays: &[RelayProcess; 2],
    active: usize,
    round: u32,
    within: Duration,
    cut_off: impl FnOnce(),
) -> (Vec<String>, Vec<String>, Duration) {
    let base = round * 10;
    let before = insert(pg, base, 2);
    wait_printed(
        &relays[active],
        &before,
        "the active relay printed the events",
    );
    let walsender = slot_active_pid(pg).expect("the active relay streams");
    cut_off();
    let cut = Instant::now();
    let mut after = insert(pg, base + 2, 2);
    let took = support::wait_for(
        &format!("round {round}: the standby to take the slot"),
        within,
        || {
            slot_active_pid(pg)
                .filter(|pid| *pid != walsender)
                .map(|_| cut.elapsed())
        },
    );
    after.extend(insert(pg, base + 4, 2));
    wait_printed(
        &relays[1 - active],
        &after,
        "the new active relay printed the events",
    );
    (before, after, took)
}

/// Every printed id, nothing lost, and each relay's output in commit order: the first
/// time a relay prints an id, it is later than every id it printed before (a relay
/// taking over may print again what the other one printed, never skip back past what
/// it printed itself).
fn assert_all_delivered_in_order(relays: &[&RelayProcess], inserted: &[String]) {
    let mut printed: HashSet<String> = HashSet::new();
    for (index, relay) in relays.iter().enumerate() {
        let mut mine = HashSet::new();
        let mut last: Option<u32> = None;
        for id in event_ids(&relay.lines()) {
            printed.insert(id.clone());
            let n = number(&id);
            if !mine.insert(n) {
                continue;
            }
            if let Some(last) = last {
                assert!(
                    n > last,
                    "relay {index} printed event {n} for the first time after event {last}: out of order"
                );
            }
            last = Some(n);
        }
    }
    let lost: Vec<u32> = inserted
        .iter()
        .filter(|id| !printed.contains(*id))
        .map(|id| number(id))
        .collect();
    assert!(
        lost.is_empty(),
        "events never printed by any relay: {lost:?}"
    );
}

/// The state table's row of the slot: where it is stored and which transactions wrote
/// and locked it. Any write (an UPDATE, even to the same values) moves `ctid`; a lock
/// (`SELECT … FOR UPDATE`, `INSERT … ON CONFLICT`) sets `xmax`.
fn state_row(pg: &PgCluster) -> (String, String, String) {
    let row = pg
        .client_db("app")
        .query_one(
            "SELECT ctid::text, xmin::text, xmax::text FROM outbox_relay_state WHERE slot_name = $1",
            &[&SLOT],
        )
        .expect("the relay recorded its slot");
    (row.get(0), row.get(1), row.get(2))
}

/// The slot's positions and the outbox's size.
fn slot_and_outbox(pg: &PgCluster) -> (String, String, i64) {
    let mut client = pg.client_db("app");
    let slot = client
        .query_one(
            "SELECT confirmed_flush_lsn::text, restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .expect("the slot exists");
    let rows: i64 = client
        .query_one("SELECT count(*) FROM outbox", &[])
        .expect("counting the outbox")
        .get(0);
    (slot.get(0), slot.get(1), rows)
}

/// A relay waiting for a busy slot changes nothing: not its record in the state table
/// (no UPDATE, no lock), not the slot, not the outbox. The streaming relay is frozen
/// (SIGSTOP) meanwhile, so every change would be the waiting one's; the waiting one
/// would take over only after 10 minutes of silence, and its attempts are counted at
/// its proxy (one connection each).
#[test]
fn a_waiting_standby_writes_nothing() {
    const ATTEMPTS: usize = 10;
    let pg = cluster_with_outbox(PgOptions::default());
    let active = support::outbox::start_streaming(&stdout_config(&pg));
    let events = insert(&pg, 0, 3);
    wait_printed(&active, &events, "the active relay printed the events");
    // The record follows the acknowledged position once per status interval.
    support::wait_until("the acknowledged position recorded", WAIT, || {
        pg.client_db("app")
            .query_one(
                "SELECT acknowledged_lsn IS NOT NULL FROM outbox_relay_state WHERE slot_name = $1",
                &[&SLOT],
            )
            .is_ok_and(|row| row.get::<_, bool>(0))
    });
    let walsender = slot_active_pid(&pg).expect("the active relay streams");
    active.pause();
    let row_before = state_row(&pg);
    let slot_before = slot_and_outbox(&pg);

    let proxy = FaultProxy::start(format!("127.0.0.1:{}", pg.port()).parse().unwrap());
    // Takeover far off: this test is about the waiting itself.
    let standby = RelayProcess::start(&config_through(
        &pg,
        &proxy,
        "takeover_silence_ms = 600000\n",
    ));
    standby.wait_for_stderr(WAITING, WAIT);
    support::wait_until("the standby's attempts at the busy slot", WAIT, || {
        proxy.accepted_count() >= ATTEMPTS
    });
    let row_after = state_row(&pg);
    let slot_after = slot_and_outbox(&pg);
    active.resume();
    assert_eq!(
        slot_active_pid(&pg),
        Some(walsender),
        "the frozen relay still holds the slot"
    );
    assert_eq!(
        row_after,
        row_before,
        "the state table's row (ctid, xmin, xmax) changed while the standby waited ({} connections); standby stderr:\n{}",
        proxy.accepted_count(),
        standby.stderr()
    );
    assert_eq!(
        slot_after, slot_before,
        "the slot (confirmed_flush_lsn, restart_lsn) or the outbox (rows) changed"
    );
    assert!(standby.lines().is_empty(), "the standby printed events");
}

/// Two replicas on one slot, as deploy/k8s runs them: both are Ready (`/readyz` 200,
/// so rollouts complete and the PodDisruptionBudget lets a node drain), and exactly
/// one streams (`/readyz`'s body, `/streamingz`, `outbox_relay_streaming`). When the
/// streaming one is gone, the standby streams.
#[test]
fn two_relays_on_one_slot_are_both_ready_and_one_streams() {
    let pg = cluster_with_outbox(PgOptions::default());
    let (active_config, active_port) = with_metrics(&stdout_config(&pg));
    let active = support::outbox::start_streaming(&active_config);
    let (standby_config, standby_port) = with_metrics(&stdout_config(&pg));
    let standby = RelayProcess::start(&standby_config);
    standby.wait_for_stderr(WAITING, WAIT);
    let ports = [active_port, standby_port];
    let answers = |path: &str| ports.map(|port| support::http_get(port, path));
    support::wait_until("both relays answer 200 on /readyz", WAIT, || {
        answers("/readyz")
            .iter()
            .all(|answer| matches!(answer, Some((200, _))))
    });
    let streaming_gauge = |port| {
        support::http_get(port, "/metrics").and_then(|(_, text)| {
            text.lines()
                .find_map(|line| line.strip_prefix("outbox_relay_streaming "))
                .map(|value| value.trim().to_owned())
        })
    };
    assert_eq!(
        (
            answers("/readyz"),
            answers("/streamingz").map(|answer| answer.map(|(code, _)| code)),
            ports.map(streaming_gauge),
        ),
        (
            [Some((200, "streaming\n".to_owned())), Some((200, "standby\n".to_owned()))],
            [Some(200), Some(503)],
            [Some("1".to_owned()), Some("0".to_owned())],
        ),
        "(/readyz, /streamingz, outbox_relay_streaming) of the streaming relay and the standby; standby stderr:\n{}",
        standby.stderr()
    );
    drop(active);
    support::wait_until(
        "the standby streams after the active relay is gone",
        WAIT,
        || support::http_get(standby_port, "/streamingz").is_some_and(|(code, _)| code == 200),
    );
}

/// Staleness the takeover test configures: three status intervals of 200 ms.
const TEST_SILENCE: Duration = Duration::from_millis(600);
/// How much later than [`TEST_SILENCE`] after the blackhole the standby must stream:
/// the last status update before the blackhole (up to a status interval earlier), the
/// standby's look every 100–200 ms plus its connection, the next attempt at the freed
/// slot, on a shared 2-core machine.
const TAKEOVER_MARGIN: Duration = Duration::from_millis(1500);

/// Twenty takeovers from a relay whose link is black-holed: each time the standby ends
/// the silent walsender and streams within [`TEST_SILENCE`] + [`TAKEOVER_MARGIN`] of
/// the blackhole; every event reaches a relay, each relay's output is in commit order;
/// the old relay, once its link is back, waits as the standby and prints nothing
/// written after its link went dark. Prints the times from the blackhole to the
/// standby's walsender on the slot (docs/operations.md shows them).
#[test]
fn twenty_takeovers_from_a_relay_whose_link_is_blackholed() {
    const TAKEOVERS: u32 = 20;
    let pg = cluster_with_outbox(PgOptions::default());
    let upstream = format!("127.0.0.1:{}", pg.port()).parse().unwrap();
    let proxies = [FaultProxy::start(upstream), FaultProxy::start(upstream)];
    let extra = format!(
        "receive_timeout_ms = 2000\ntakeover_silence_ms = {}\n",
        TEST_SILENCE.as_millis()
    );
    let first = support::outbox::start_streaming(&config_through(&pg, &proxies[0], &extra));
    let second = RelayProcess::start(&config_through(&pg, &proxies[1], &extra));
    second.wait_for_stderr(WAITING, WAIT);
    let relays = [first, second];
    let mut inserted = Vec::new();
    let mut times = Vec::new();
    let mut active = 0;
    for round in 0..TAKEOVERS {
        let standby = 1 - active;
        let waits_before = relays[active].stderr().matches(WAITING).count();
        let (before, after, took) = takeover_round(&pg, &relays, active, round, WAIT, || {
            proxies[active].blackhole(true)
        });
        inserted.extend(before);
        times.push(took);
        assert!(
            took <= TEST_SILENCE + TAKEOVER_MARGIN,
            "round {round}: took over {took:?} after the blackhole; standby stderr:\n{}",
            support::wait::tail_lines(&relays[standby].stderr(), 20)
        );

        proxies[active].blackhole(false);
        support::wait_until("the old active relay waits as the standby", WAIT, || {
            relays[active].stderr().matches(WAITING).count() > waits_before
        });
        let printed_by_old = event_ids(&relays[active].lines());
        let leaked: Vec<&String> = after
            .iter()
            .filter(|id| printed_by_old.contains(id))
            .collect();
        assert!(
            leaked.is_empty(),
            "round {round}: the old active relay printed events written after its link went dark: {leaked:?}"
        );
        assert!(
            relays[active].exit_status().is_none(),
            "the old relay exited"
        );
        inserted.extend(after);
        active = standby;
    }
    assert_all_delivered_in_order(&[&relays[0], &relays[1]], &inserted);
    // Each relay ended the other's walsender in turn, and never a healthy one (an idle
    // relay reports every status interval).
    for relay in &relays {
        assert_eq!(
            relay.stderr().matches(TAKING_OVER).count(),
            usize::try_from(TAKEOVERS / 2).unwrap(),
            "{}",
            relay.stderr()
        );
    }
    times.sort();
    let ms: Vec<u128> = times.iter().map(Duration::as_millis).collect();
    support::outbox::report(&format!(
        "takeover from a black-holed relay (takeover_silence_ms = {}), {TAKEOVERS} times (ms, sorted): {ms:?}; median {} ms, max {} ms",
        TEST_SILENCE.as_millis(),
        ms[ms.len() / 2],
        ms[ms.len() - 1]
    ));
}

/// The standby's bound on one takeover from a frozen relay with the default settings:
/// generous (the silence is 4 s, a takeover takes 3–5 s; the times are printed and
/// docs/reliability.md shows them), and short of the 30 s it took while the silence
/// was three 10 s status intervals.
const DEFAULT_TAKEOVER_WAIT: Duration = Duration::from_secs(15);
/// Rows of the huge transaction on a table outside the publication: enough that its
/// walsender replays it (sending nothing, reading no reply) for well past the silence.
const HUGE_ROWS: u64 = 6_000_000;

/// Samples the age of the last reply of walsender `pid` (`clock_timestamp() -
/// reply_time`) every 50 ms until `stop`; returns the largest age seen.
fn watch_reply_age(
    pg: &PgCluster,
    pid: i32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Duration> {
    let mut client = pg.client_db("app");
    std::thread::spawn(move || {
        let mut largest = Duration::ZERO;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let age: Option<i64> = match client.query_opt(
                "SELECT (1000 * extract(epoch FROM clock_timestamp() - reply_time))::bigint \
                   FROM pg_stat_replication WHERE pid = $1",
                &[&pid],
            ) {
                Ok(row) => row.and_then(|row| row.get(0)),
                // The cluster is going away (the test failed).
                Err(_) => break,
            };
            if let Some(ms) = age.and_then(|ms| u64::try_from(ms).ok()) {
                largest = largest.max(Duration::from_millis(ms));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        largest
    })
}

/// Two relays with the default settings (no `takeover_silence_ms`, no status interval:
/// a heartbeat every second, 4 s of silence). Twenty times the streaming one is frozen
/// (SIGSTOP: its process stops, its connection stays open): each time the standby ends
/// its walsender and streams, within [`DEFAULT_TAKEOVER_WAIT`]; the frozen one, once it
/// runs again, waits as the standby. Then, both healthy: idle for twice the silence
/// (the heartbeat goes on, the standby ends nothing), and one huge transaction of
/// [`HUGE_ROWS`] rows on a table the publication leaves out, with an event at its end:
/// its walsender reads no reply for longer than the silence while it replays it, and
/// the standby still ends nothing. Every event reaches a relay, each relay's output is
/// in commit order, and each relay ended the other's walsender exactly ten times.
/// Prints the takeover times.
#[test]
fn twenty_frozen_relays_are_taken_over_with_the_defaults_and_a_huge_transaction_is_not() {
    const FREEZES: u32 = 20;
    const SILENCE: Duration = Duration::from_secs(4);
    let pg = cluster_with_outbox(PgOptions::default());
    let defaults = stdout_config(&pg).replace("status_interval_ms = 200\n", "");
    let first = support::outbox::start_streaming(&defaults);
    let second = RelayProcess::start(&defaults);
    second.wait_for_stderr(WAITING, WAIT);
    let relays = [first, second];
    let mut inserted = Vec::new();
    let mut times = Vec::new();
    let mut active = 0;
    for round in 0..FREEZES {
        let standby = 1 - active;
        let waits_before = relays[active].stderr().matches(WAITING).count();
        let (before, after, took) =
            takeover_round(&pg, &relays, active, round, DEFAULT_TAKEOVER_WAIT, || {
                relays[active].pause()
            });
        inserted.extend(before);
        times.push(took);
        relays[active].resume();
        support::wait_until("the old active relay waits as the standby", WAIT, || {
            relays[active].stderr().matches(WAITING).count() > waits_before
        });
        assert!(
            relays[active].exit_status().is_none(),
            "the old relay exited"
        );
        inserted.extend(after);
        active = standby;
    }

    // Both healthy.
    let standby = 1 - active;
    let takeovers_before = relays[standby].stderr().matches(TAKING_OVER).count();
    let walsender = slot_active_pid(&pg).expect("the active relay streams");
    // Idle, twice as long as the silence: the heartbeat goes on (each status update
    // the walsender reads changes its reply_time), and the standby ends nothing.
    let mut client = pg.client_db("app");
    let mut replies = HashSet::new();
    support::wait_until("eight heartbeats from the idle active relay", WAIT, || {
        let reply: Option<String> = client
            .query_opt(
                "SELECT reply_time::text FROM pg_stat_replication WHERE pid = $1",
                &[&walsender],
            )
            .expect("sampling the walsender")
            .and_then(|row| row.get(0));
        replies.extend(reply);
        replies.len() >= 8
            || relays[standby].stderr().matches(TAKING_OVER).count() > takeovers_before
    });
    assert_eq!(
        (
            slot_active_pid(&pg),
            relays[standby].stderr().matches(TAKING_OVER).count()
        ),
        (Some(walsender), takeovers_before),
        "the standby ended the walsender of the idle healthy relay; standby stderr:\n{}",
        support::wait::tail_lines(&relays[standby].stderr(), 20)
    );

    // The huge transaction. How long its replay keeps the walsender from reading replies
    // depends on the machine and its load (7.6 s for HUGE_ROWS alone on the 2-core
    // machine, 4.1 s once among CI's parallel jobs), so a replay that did not outlast the
    // silence by a second is repeated once with twice the rows: the test must
    // show a healthy walsender silent past the silence, and the standby ending nothing.
    client
        .batch_execute("CREATE TABLE bulk (id bigint, pad text)")
        .expect("creating the table outside the publication");
    let mut rows = HUGE_ROWS;
    let mut attempt = 0;
    let stalest = loop {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = watch_reply_age(&pg, walsender, stop.clone());
        let huge_event = format!("00000000-0000-0000-0000-{:012}", FREEZES * 10 + attempt);
        let mut txn = client.transaction().expect("BEGIN");
        txn.execute(
            "INSERT INTO bulk SELECT g, repeat('x', 10) FROM generate_series(1, $1::bigint) g",
            &[&i64::try_from(rows).unwrap()],
        )
        .expect("the huge transaction's rows");
        txn.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ($1::text::uuid, 'takeover', 'a', 'T', '{}')",
            &[&huge_event],
        )
        .expect("the huge transaction's event");
        txn.commit().expect("COMMIT");
        // Or the standby took the slot (the assertion below says so).
        support::wait_until(
            "the active relay printed the huge transaction's event",
            WAIT,
            || {
                event_ids(&relays[active].lines()).contains(&huge_event)
                    || relays[standby].stderr().matches(TAKING_OVER).count() > takeovers_before
            },
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let stalest = sampler.join().expect("the sampler");
        assert_eq!(
            (
                slot_active_pid(&pg),
                relays[standby].stderr().matches(TAKING_OVER).count()
            ),
            (Some(walsender), takeovers_before),
            "the standby ended the walsender of the healthy relay replaying the huge transaction; standby stderr:\n{}",
            support::wait::tail_lines(&relays[standby].stderr(), 20)
        );
        inserted.push(huge_event);
        if stalest >= SILENCE + Duration::from_secs(1) || attempt == 1 {
            break stalest;
        }
        eprintln!(
            "the replay of {rows} rows kept the walsender from replies for only {stalest:?}; again with twice the rows"
        );
        rows *= 2;
        attempt += 1;
    };
    assert!(
        stalest >= SILENCE + Duration::from_secs(1),
        "the huge transaction's walsender read a reply at most {stalest:?} apart: the test did not show a healthy walsender silent past the {SILENCE:?} silence (make HUGE_ROWS larger)"
    );
    // After the huge transactions' events (ids increase in commit order).
    let last = insert(&pg, FREEZES * 10 + 2, 2);
    wait_printed(
        &relays[active],
        &last,
        "the active relay printed the events",
    );
    inserted.extend(last);

    assert_all_delivered_in_order(&[&relays[0], &relays[1]], &inserted);
    for relay in &relays {
        assert_eq!(
            relay.stderr().matches(TAKING_OVER).count(),
            usize::try_from(FREEZES / 2).unwrap(),
            "{}",
            relay.stderr()
        );
    }
    times.sort();
    let ms: Vec<u128> = times.iter().map(Duration::as_millis).collect();
    support::outbox::report(&format!(
        "takeover from a frozen relay with the default settings (SIGSTOP to the standby's walsender on the slot), {FREEZES} times (ms, sorted): {ms:?}; median {} ms, max {} ms; a healthy walsender replaying {rows} unpublished rows read no reply for {} ms and was not ended",
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        stalest.as_millis()
    ));
}

/// A standby whose role may not see other walsenders' details (`pg_read_all_stats`)
/// says so once and waits, even while the streaming relay is silent; with it but
/// without the right to end another role's walsender (`pg_signal_backend`), it says
/// that once and waits; given both, it takes over.
#[test]
fn a_standby_without_the_privileges_says_what_to_grant_and_waits() {
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute(
            "CREATE ROLE relay_a LOGIN REPLICATION; CREATE ROLE relay_b LOGIN REPLICATION;
             GRANT SELECT ON outbox TO relay_a, relay_b;
             CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert');
             CREATE TABLE outbox_relay_state (slot_name text PRIMARY KEY, system_identifier text,
                 created_at timestamptz, first_streamed_at timestamptz, acknowledged_lsn pg_lsn,
                 acknowledged_at timestamptz, gap_accepted_at timestamptz, gap_from_lsn pg_lsn,
                 gap_to_lsn pg_lsn);
             GRANT SELECT, INSERT, UPDATE ON outbox_relay_state TO relay_a, relay_b;",
        )
        .expect("creating the roles");
    let upstream = format!("127.0.0.1:{}", pg.port()).parse().unwrap();
    let proxies = [FaultProxy::start(upstream), FaultProxy::start(upstream)];
    let extra = format!("takeover_silence_ms = {}\n", TEST_SILENCE.as_millis());
    let as_role = |proxy, role: &str| {
        config_through(&pg, proxy, &extra)
            .replace("postgres://postgres@", &format!("postgres://{role}@"))
    };
    let active = RelayProcess::start(&as_role(&proxies[0], "relay_a"));
    active.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let walsender = slot_active_pid(&pg).expect("the active relay streams");
    let standby = RelayProcess::start(&as_role(&proxies[1], "relay_b"));
    const HIDDEN: &str = "GRANT pg_read_all_stats TO the relay's role";
    standby.wait_for_stderr(HIDDEN, WAIT);

    proxies[0].blackhole(true);
    // Well past the silence: the standby's attempts, one connection each.
    let attempts = proxies[1].accepted_count();
    support::wait_until(
        "the standby's attempts while the active is silent",
        WAIT,
        || proxies[1].accepted_count() >= attempts + 15,
    );
    assert_eq!(slot_active_pid(&pg), Some(walsender), "nothing was ended");

    pg.batch_execute("GRANT pg_read_all_stats TO relay_b");
    const NOT_ALLOWED: &str = "this role may not end its walsender: GRANT pg_signal_backend";
    standby.wait_for_stderr(NOT_ALLOWED, WAIT);
    assert_eq!(slot_active_pid(&pg), Some(walsender), "nothing was ended");

    pg.batch_execute("GRANT pg_signal_backend TO relay_b");
    support::wait_until("the standby to take the slot", WAIT, || {
        slot_active_pid(&pg).is_some_and(|pid| pid != walsender)
    });
    let events = insert(&pg, 0, 2);
    wait_printed(&standby, &events, "the new active relay printed the events");
    let stderr = standby.stderr();
    assert!(stderr.contains(TAKING_OVER), "{stderr}");
    assert_eq!(stderr.matches(HIDDEN).count(), 1, "said once: {stderr}");
    assert_eq!(
        stderr.matches(NOT_ALLOWED).count(),
        1,
        "said once: {stderr}"
    );
}
