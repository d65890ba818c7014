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
/// reports every 5 s, so it would take over only after 15 s of silence, and its
/// attempts are counted at its proxy (one connection each).
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
    let standby = RelayProcess::start(
        &config_through(&pg, &proxy, "")
            .replace("status_interval_ms = 200\n", "status_interval_ms = 5000\n"),
    );
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
        let base = round * 10;
        let before = insert(&pg, base, 2);
        wait_printed(
            &relays[active],
            &before,
            "the active relay printed the events",
        );
        inserted.extend(before);
        let walsender = slot_active_pid(&pg).expect("the active relay streams");

        proxies[active].blackhole(true);
        let dark = Instant::now();
        let mut after = insert(&pg, base + 2, 2);
        let took = support::wait_for("the standby to take the slot", WAIT, || {
            slot_active_pid(&pg)
                .filter(|pid| *pid != walsender)
                .map(|_| dark.elapsed())
        });
        times.push(took);
        after.extend(insert(&pg, base + 4, 2));
        wait_printed(
            &relays[standby],
            &after,
            "the new active relay printed the events",
        );
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

/// With the default settings (status interval 10 s, so 30 s of silence): one takeover,
/// no sooner than 30 s after the last status update the silent relay sent (at most
/// one interval before its link went dark) and no later than 30 s after the blackhole
/// plus [`TAKEOVER_MARGIN`]. PostgreSQL's own `wal_sender_timeout` (60 s) would free
/// the slot only later.
#[test]
fn a_silent_relay_is_taken_over_after_three_default_status_intervals() {
    const SILENCE: Duration = Duration::from_secs(30);
    const STATUS_INTERVAL: Duration = Duration::from_secs(10);
    let pg = cluster_with_outbox(PgOptions::default());
    let upstream = format!("127.0.0.1:{}", pg.port()).parse().unwrap();
    let proxies = [FaultProxy::start(upstream), FaultProxy::start(upstream)];
    let defaults = |proxy| config_through(&pg, proxy, "").replace("status_interval_ms = 200\n", "");
    let active = support::outbox::start_streaming(&defaults(&proxies[0]));
    let standby = RelayProcess::start(&defaults(&proxies[1]));
    standby.wait_for_stderr(WAITING, WAIT);
    let before = insert(&pg, 0, 2);
    wait_printed(&active, &before, "the active relay printed the events");
    let walsender = slot_active_pid(&pg).expect("the active relay streams");

    proxies[0].blackhole(true);
    let dark = Instant::now();
    let after = insert(&pg, 2, 2);
    let took = support::wait_for("the standby to take the slot", WAIT, || {
        slot_active_pid(&pg)
            .filter(|pid| *pid != walsender)
            .map(|_| dark.elapsed())
    });
    wait_printed(&standby, &after, "the new active relay printed the events");
    assert!(
        took >= SILENCE - STATUS_INTERVAL && took <= SILENCE + TAKEOVER_MARGIN,
        "took over {took:?} after the blackhole; standby stderr:\n{}",
        support::wait::tail_lines(&standby.stderr(), 20)
    );
    assert!(
        standby.stderr().contains(TAKING_OVER),
        "{}",
        standby.stderr()
    );
    support::outbox::report(&format!(
        "takeover from a black-holed relay with the default settings (30 s of silence): {} ms after the blackhole",
        took.as_millis()
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
