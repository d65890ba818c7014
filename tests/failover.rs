//! Failover to a physical standby, with the relay given both hosts
//! (`postgres://primary,standby/app?target_session_attrs=read-write`):
//!
//! * PostgreSQL 17 with a failover slot synchronised to the standby: the relay follows
//!   the promotion by itself and every committed row is delivered.
//! * PostgreSQL 15 (no slot synchronisation): the promoted standby has no slot. The
//!   relay's record of its slot (a table, replicated like any other) says it streamed
//!   from one, so the relay stops with the lost-slot error instead of creating a new
//!   slot past the events it never saw.

use outbox_relay_harness as support;

use std::collections::HashSet;

use support::outbox::{event_ids, insert_events, plain, OUTBOX_SQL, SLOT, WAIT};
use support::{PgCluster, PgOptions, RelayProcess};

/// The standby's physical slot on the primary.
const STANDBY_SLOT: &str = "standby1";

fn primary(bindir: Option<std::path::PathBuf>, extra: &[(&str, &str)]) -> PgCluster {
    let pg = PgCluster::start_with(PgOptions {
        bindir,
        extra_conf: extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..PgOptions::default()
    });
    pg.batch_execute("CREATE DATABASE app");
    pg.client_db("app").batch_execute(OUTBOX_SQL).unwrap();
    pg
}

/// A relay on the stdout sink that knows both servers and wants the writable one.
fn config(primary: &PgCluster, standby: &PgCluster) -> String {
    format!(
        "[postgres]\nurl = \"postgres://postgres@127.0.0.1:{},127.0.0.1:{}/app?target_session_attrs=read-write&connect_timeout=2\"\n\
         slot = \"{SLOT}\"\nstatus_interval_ms = 200\n[sink]\ntype = \"stdout\"\n",
        primary.port(),
        standby.port()
    )
}

fn insert(pg: &PgCluster, kind: &str, n: usize) -> Vec<String> {
    insert_events(pg, kind, n)
}

fn ids(lines: &[String]) -> HashSet<String> {
    event_ids(lines).into_iter().collect()
}

/// Waits until the standby has replayed everything the primary wrote so far.
fn wait_caught_up(primary: &PgCluster, standby: &PgCluster) {
    let target = primary.current_wal_lsn();
    support::wait_until("the standby replays the primary's WAL", WAIT, || {
        let replayed = support::query_lsn(
            &mut standby.client(),
            "SELECT pg_last_wal_replay_lsn()::text",
        );
        support::lsn_to_u64(&replayed) >= target
    });
}

fn promote(standby: &PgCluster) {
    let promoted: bool = standby
        .client()
        .query_one("SELECT pg_promote()", &[])
        .unwrap()
        .get(0);
    assert!(promoted, "the standby was promoted");
}

#[test]
fn postgres_17_failover_slot_follows_the_promotion_and_nothing_is_lost() {
    let bindir = PgCluster::bindir_of_major(17);
    let mut primary = primary(Some(bindir), &[]);
    let standby = primary.start_standby(
        STANDBY_SLOT,
        "app",
        &[
            ("hot_standby_feedback", "on"),
            ("sync_replication_slots", "off"),
        ],
    );
    // The primary holds logical changes back until the standby has their WAL, so the
    // synchronised slot never points past what a promoted standby holds.
    let mut admin = primary.client();
    admin
        .batch_execute(&format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'"
        ))
        .unwrap();
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    drop(admin);
    let relay = RelayProcess::start(&config(&primary, &standby));
    relay.wait_streaming(&primary.superuser_url(), SLOT, WAIT);
    let failover: bool = primary
        .client()
        .query_one(
            "SELECT failover FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .unwrap()
        .get(0);
    assert!(failover, "the relay created its slot as a failover slot");
    let mut want = insert(&primary, "before", 20);
    support::wait_until("the first rows arrive", WAIT, || {
        want.iter().all(|id| ids(&relay.lines()).contains(id))
    });
    wait_caught_up(&primary, &standby);
    // Synchronise the slot to the standby (the sync worker does this periodically;
    // asked here so the test waits on nothing). Only a persistent synced slot survives a
    // promotion.
    support::wait_until("the slot is synchronised to the standby", WAIT, || {
        let mut client = standby.client_db("app");
        let _ = client.batch_execute("SELECT pg_sync_replication_slots()");
        client
            .query_opt(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND synced AND NOT temporary",
                &[&SLOT],
            )
            .ok()
            .flatten()
            .is_some()
    });

    primary.stop_immediate();
    promote(&standby);
    want.extend(insert(&standby, "after", 20));
    support::wait_until(
        "every committed row arrives after the failover",
        WAIT,
        || {
            let seen = ids(&relay.lines());
            want.iter().all(|id| seen.contains(id))
        },
    );
    assert_eq!(
        relay.exit_status(),
        None,
        "the relay runs on, on the new primary"
    );
    assert!(
        plain(&relay.stderr()).contains("timeline changed"),
        "{}",
        relay.stderr()
    );
    let end = standby.current_wal_lsn();
    support::wait_until("the new primary's slot is acknowledged", WAIT, || {
        standby.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end
    });
}

#[test]
fn failover_without_the_slot_stops_with_the_lost_slot_error() {
    let mut primary = primary(None, &[]);
    let standby = primary.start_standby(STANDBY_SLOT, "app", &[]);
    let relay = RelayProcess::start(&config(&primary, &standby));
    relay.wait_streaming(&primary.superuser_url(), SLOT, WAIT);
    let delivered = insert(&primary, "before", 5);
    support::wait_until("the first rows arrive", WAIT, || {
        delivered.iter().all(|id| ids(&relay.lines()).contains(id))
    });
    // The relay's record (that it streamed, and where it acknowledged) reaches the
    // standby like any other row.
    support::wait_until("the record is on the standby", WAIT, || {
        standby
            .client_db("app")
            .query_opt(
                "SELECT 1 FROM outbox_relay_state WHERE slot_name = $1 AND acknowledged_lsn IS NOT NULL",
                &[&SLOT],
            )
            .ok()
            .flatten()
            .is_some()
    });
    let unseen = insert(&primary, "unseen", 3);
    wait_caught_up(&primary, &standby);
    primary.stop_immediate();
    promote(&standby);

    let status = relay.wait_exit(WAIT);
    assert!(!status.success(), "the relay stops");
    let stderr = plain(&relay.stderr());
    assert!(
        stderr.contains("does not exist, but this relay streamed from it")
            && stderr.contains("slot create --accept-gap"),
        "{stderr}"
    );
    let slots: i64 = standby
        .client()
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(slots, 0, "no slot was created past the gap");
    // The rows the relay never saw are still in the table, for the backfill.
    let count: i64 = standby
        .client_db("app")
        .query_one(
            "SELECT count(*) FROM outbox WHERE id = ANY($1::text[]::uuid[])",
            &[&unseen],
        )
        .unwrap()
        .get(0);
    assert_eq!(count, 3);
}
