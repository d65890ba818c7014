//! Decoding on a hot standby (PostgreSQL 16+, `[postgres] primary_url`), against a real
//! primary and a physical standby made with `pg_backup_start`/copy: the relay's slot and
//! WAL sender are on the standby (the primary runs no logical WAL sender), the slot is
//! created without waiting for the primary's next write, the relay's record is written
//! on the primary, nothing is lost across a `kill -9` of the relay and a restart of
//! the standby, and a tenant's table created meanwhile joins through the primary without
//! a restart. Event ids are compared, not counts.
//!
//! Runs on PostgreSQL 16 unless `PG_BINDIR` names 16 or later (CI's version lanes).

use outbox_relay_harness as support;

use std::collections::HashSet;

use support::outbox::{event_ids, insert_events, plain, OUTBOX_SQL, SLOT, WAIT};
use support::{PgCluster, PgOptions, RelayProcess};

const STANDBY_SLOT: &str = "standby1";

/// A primary of PostgreSQL 16 or later with database `app` and its outbox.
fn primary() -> PgCluster {
    let pg = PgCluster::start();
    let pg = if pg.server_version_num() >= 160_000 {
        pg
    } else {
        drop(pg);
        PgCluster::start_with(PgOptions {
            bindir: Some(PgCluster::bindir_of_major(16)),
            ..PgOptions::default()
        })
    };
    pg.batch_execute("CREATE DATABASE app");
    pg.client_db("app").batch_execute(OUTBOX_SQL).unwrap();
    pg
}

fn config(standby: &PgCluster, primary: &PgCluster) -> String {
    format!(
        "[postgres]\nurl = \"{}\"\nprimary_url = \"{}\"\nslot = \"{SLOT}\"\nstatus_interval_ms = 200\n\
         [sink]\ntype = \"stdout\"\n",
        standby.url("postgres", None, "app"),
        primary.url("postgres", None, "app")
    )
}

/// Every id `relay` printed, added to `seen` (what earlier relays printed).
fn ids(seen: &mut HashSet<String>, relay: &RelayProcess) -> HashSet<String> {
    seen.extend(event_ids(&relay.lines()));
    seen.clone()
}

fn count(pg: &PgCluster, sql: &str) -> i64 {
    pg.client_db("app").query_one(sql, &[]).expect(sql).get(0)
}

/// [`count`] on a standby the test drives into recovery conflicts: the standby may
/// cancel the test's own query for one ("canceling statement due to conflict with
/// recovery", SQLSTATE 40001, seen in CI on PostgreSQL 16), and then `None`: ask again.
fn count_on_standby(pg: &PgCluster, sql: &str) -> Option<i64> {
    match pg.client_db("app").query_one(sql, &[]) {
        Ok(row) => Some(row.get(0)),
        Err(error)
            if error.code() == Some(&postgres::error::SqlState::T_R_SERIALIZATION_FAILURE) =>
        {
            None
        }
        Err(error) => panic!("{sql}: {error}"),
    }
}

#[test]
fn the_relay_decodes_on_the_standby_and_loses_nothing_across_a_kill_and_a_standby_restart() {
    let primary = primary();
    let mut standby = primary.start_standby(STANDBY_SLOT, "app", &[("hot_standby_feedback", "on")]);
    let config = config(&standby, &primary);
    // The primary is idle: the slot's creation on the standby must not wait for its
    // next write (the relay asks it for a snapshot).
    // The preflight sees a standby to decode on, with what keeps its slot valid.
    let (status, stdout, stderr) = support::relay::run_command(&["check"], &config, WAIT);
    let said = plain(&format!("{stdout}{stderr}"));
    assert!(status.success(), "{said}");
    assert!(said.contains("the relay decodes on it"), "{said}");
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&standby.superuser_url(), SLOT, WAIT);
    assert_eq!(
        count(
            &standby,
            "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'"
        ),
        1,
        "the slot is on the standby"
    );
    assert_eq!(
        count(
            &primary,
            "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'"
        ),
        0,
        "no logical slot on the primary"
    );
    assert_eq!(
        count(
            &primary,
            "SELECT count(*) FROM pg_stat_replication WHERE application_name LIKE 'outbox-relay%'"
        ),
        0,
        "no logical WAL sender on the primary"
    );

    let mut seen = HashSet::new();
    let mut want: Vec<String> = insert_events(&primary, "first", 20);
    support::wait_until("the first rows arrive through the standby", WAIT, || {
        want.iter().all(|id| ids(&mut seen, &relay).contains(id))
    });
    // The record is written on the primary (the standby cannot write) and replayed.
    support::wait_until(
        "the relay's record on the primary has a position",
        WAIT,
        || {
            count(
                &primary,
                "SELECT count(*) FROM outbox_relay_state WHERE acknowledged_lsn IS NOT NULL",
            ) == 1
        },
    );

    // kill -9 of the relay, rows written while it is down, a new relay.
    ids(&mut seen, &relay);
    relay.kill9();
    drop(relay);
    want.extend(insert_events(&primary, "while_down", 20));
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&standby.superuser_url(), SLOT, WAIT);
    support::wait_until("every row so far arrives after the kill", WAIT, || {
        want.iter().all(|id| ids(&mut seen, &relay).contains(id))
    });

    // A restart of the standby (fast shutdown) under the streaming relay.
    standby.stop_fast();
    want.extend(insert_events(&primary, "standby_down", 20));
    standby.start_again();
    want.extend(insert_events(&primary, "after", 20));
    support::wait_until(
        "every row arrives after the standby's restart",
        WAIT,
        || want.iter().all(|id| ids(&mut seen, &relay).contains(id)),
    );
    assert_eq!(relay.exit_status(), None, "the relay runs on");
    let stderr = plain(&relay.stderr());
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn without_primary_url_a_standby_is_waited_on_and_the_message_says_how_to_decode_there() {
    let primary = primary();
    let standby = primary.start_standby(STANDBY_SLOT, "app", &[("hot_standby_feedback", "on")]);
    let config = format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\nstatus_interval_ms = 200\n[sink]\ntype = \"stdout\"\n",
        standby.url("postgres", None, "app"),
    );
    let relay = RelayProcess::start(&config);
    support::wait_until("the relay says it waits for a promotion", WAIT, || {
        plain(&relay.stderr()).contains("primary_url")
    });
    assert_eq!(relay.exit_status(), None, "it waits, it does not stop");
    assert_eq!(
        count(&standby, "SELECT count(*) FROM pg_replication_slots"),
        0,
        "and creates nothing"
    );
}

#[test]
fn a_promotion_of_the_standby_is_followed_on_the_same_slot() {
    let primary = primary();
    let standby = primary.start_standby(STANDBY_SLOT, "app", &[("hot_standby_feedback", "on")]);
    let relay = RelayProcess::start(&config(&standby, &primary));
    relay.wait_streaming(&standby.superuser_url(), SLOT, WAIT);
    let mut seen = HashSet::new();
    let mut want = insert_events(&primary, "before", 10);
    support::wait_until("the rows written before the promotion arrive", WAIT, || {
        want.iter().all(|id| ids(&mut seen, &relay).contains(id))
    });
    let promoted: bool = standby
        .client()
        .query_one("SELECT pg_promote()", &[])
        .unwrap()
        .get(0);
    assert!(promoted);
    // The old primary is gone, as after a real promotion. The WAL sender on the promoted
    // server goes on decoding (the timeline changes under it); the relay's record is
    // written on the promoted server from now on.
    drop(primary);
    let before_after = standby.current_wal_lsn();
    want.extend(insert_events(&standby, "after", 10));
    support::wait_until("rows written on the promoted server arrive", WAIT, || {
        want.iter().all(|id| ids(&mut seen, &relay).contains(id))
    });
    // The record is written on the promoted server now, past the rows written there.
    support::wait_until("the record on the promoted server moves", WAIT, || {
        standby
            .client_db("app")
            .query_one(
                "SELECT coalesce(acknowledged_lsn::text, '0/0') FROM outbox_relay_state",
                &[],
            )
            .map(|row| support::lsn_to_u64(&row.get::<_, String>(0)) > before_after)
            .unwrap_or(false)
    });
    assert_eq!(relay.exit_status(), None, "the relay runs on");
}

#[test]
fn a_slot_invalidated_by_a_recovery_conflict_stops_the_relay_as_a_lost_slot() {
    let primary = primary();
    // No feedback: the primary's vacuum may remove catalog rows the standby's slot
    // needs, and replaying that invalidates the slot (what check warns about).
    let standby = primary.start_standby(
        STANDBY_SLOT,
        "app",
        &[
            ("hot_standby_feedback", "off"),
            ("max_standby_streaming_delay", "0"),
        ],
    );
    let relay = RelayProcess::start(&config(&standby, &primary));
    relay.wait_streaming(&standby.superuser_url(), SLOT, WAIT);
    let mut seen = HashSet::new();
    let want = insert_events(&primary, "before", 5);
    support::wait_until("the rows arrive", WAIT, || {
        want.iter().all(|id| ids(&mut seen, &relay).contains(id))
    });
    // The relay stops; its slot keeps its catalog horizon. Catalog rows made dead and
    // vacuumed away on the primary past that horizon: replaying that on the standby
    // invalidates the slot.
    relay.kill9();
    drop(relay);
    // PostgreSQL took about 80 s here to invalidate the slot (the standby's log shows
    // "invalidating obsolete replication slot ... conflicted with xid horizon" that long
    // after the first vacuum; which prune it waited for was not pinned down): a longer
    // deadline than the usual one.
    support::wait_until(
        "the standby's slot is invalidated by a recovery conflict",
        WAIT * 4,
        || {
            let mut client = primary.client_db("app");
            client
                .batch_execute("CREATE TABLE churn (x int); DROP TABLE churn;")
                .unwrap();
            client
                .batch_execute("VACUUM pg_class, pg_attribute, pg_type, pg_depend")
                .unwrap();
            count_on_standby(
                &standby,
                "SELECT count(*) FROM pg_replication_slots s \
              WHERE coalesce((to_jsonb(s) ->> 'conflicting')::boolean, false) \
                 OR (to_jsonb(s) ->> 'invalidation_reason') IS NOT NULL",
            ) == Some(1)
        },
    );
    // A relay started now refuses the slot: a lost slot, never a silent new one.
    let relay = RelayProcess::start(&config(&standby, &primary));
    let status = relay.wait_exit(WAIT);
    assert!(
        !status.success(),
        "the relay stops, it does not make a new slot"
    );
    let stderr = plain(&relay.stderr());
    assert!(stderr.contains("recovery conflict"), "{stderr}");
    assert!(stderr.contains("backfill"), "names the way back: {stderr}");
}

/// Inserts `n` events into `table` of database `app` on `pg`; their ids.
fn insert_into(pg: &PgCluster, table: &str, n: usize) -> Vec<String> {
    let mut client = pg.client_db("app");
    (0..n)
        .map(|_| {
            client
                .query_one(
                    &format!(
                        "INSERT INTO {table} (aggregatetype, aggregateid, type, payload)
                         VALUES ('tenant', 'a', 'T', '{{}}') RETURNING id::text"
                    ),
                    &[],
                )
                .unwrap_or_else(|e| panic!("inserting into {table}: {e}"))
                .get(0)
        })
        .collect()
}

#[test]
fn a_tenant_table_created_while_the_relay_decodes_on_the_standby_joins_without_a_restart() {
    let primary = primary();
    primary
        .client_db("app")
        .batch_execute(
            "CREATE SCHEMA tenant_1; CREATE TABLE tenant_1.outbox (LIKE public.outbox INCLUDING ALL);",
        )
        .unwrap();
    let standby = primary.start_standby(STANDBY_SLOT, "app", &[("hot_standby_feedback", "on")]);
    let config = format!(
        "[postgres]\nurl = \"{}\"\nprimary_url = \"{}\"\nslot = \"{SLOT}\"\nstatus_interval_ms = 200\n\
         [[outbox]]\ntable = \"tenant_*.outbox\"\n\
         [sink]\ntype = \"stdout\"\n",
        standby.url("postgres", None, "app"),
        primary.url("postgres", None, "app")
    );
    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&standby.superuser_url(), SLOT, WAIT);
    let mut seen = HashSet::new();
    let mut want = insert_into(&primary, "tenant_1.outbox", 5);
    support::wait_until("tenant_1's rows arrive through the standby", WAIT, || {
        want.iter().all(|id| ids(&mut seen, &relay).contains(id))
    });

    // A tenant provisioned on the primary while the relay streams on the standby: the
    // standby cannot alter the publication, so the watch adds the table on the primary
    // and waits for the standby to replay that, without ending the session.
    primary
        .client_db("app")
        .batch_execute(
            "CREATE SCHEMA tenant_2; CREATE TABLE tenant_2.outbox (LIKE public.outbox INCLUDING ALL);",
        )
        .unwrap();
    support::wait_until(
        "the relay adds tenant_2.outbox to the publication on the primary",
        WAIT,
        || {
            count(
                &primary,
                "SELECT count(*) FROM pg_publication_tables WHERE schemaname = 'tenant_2' AND tablename = 'outbox'",
            ) == 1
        },
    );
    want.extend(insert_into(&primary, "tenant_2.outbox", 5));
    want.extend(insert_into(&primary, "tenant_1.outbox", 5));
    support::wait_until("both tenants' later rows arrive", WAIT, || {
        want.iter().all(|id| ids(&mut seen, &relay).contains(id))
    });
    let stderr = plain(&relay.stderr());
    assert!(stderr.contains("joined the publication"), "{stderr}");
    assert!(
        !stderr.contains("retrying"),
        "the session went on, no restart: {stderr}"
    );
    assert_eq!(relay.exit_status(), None, "the relay runs on");
}
