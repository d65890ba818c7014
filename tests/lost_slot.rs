//! A lost slot is never silently replaced. Once a relay has streamed from its slot, it
//! records that (and its acknowledged position) in the database; if the slot is gone
//! later (dropped, removed by `max_slot_wal_keep_size`, missing after a failover), a new
//! slot would start at the current position and skip everything committed in between,
//! so the relay refuses and names the ways out: `slot create --accept-gap`, then
//! `backfill --since` for the rows still in the table.

use outbox_relay_harness as support;

use std::collections::HashSet;

use support::outbox::{
    cluster_with_outbox, event_ids, insert_events, plain, start_streaming, stdout_config, SLOT,
    WAIT,
};
use support::relay::run_command;
use support::{PgCluster, PgOptions, RelayProcess};

fn insert(pg: &PgCluster, kind: &str, n: usize) -> Vec<String> {
    insert_events(pg, kind, n)
}

fn ids(stdout: &str) -> HashSet<String> {
    event_ids(&stdout.lines().collect::<Vec<_>>())
        .into_iter()
        .collect()
}

fn slot_exists(pg: &PgCluster) -> bool {
    pg.client()
        .query_opt(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .unwrap()
        .is_some()
}

#[test]
fn a_dropped_slot_is_refused_then_recreated_knowingly_and_the_gap_backfilled() {
    let pg = cluster_with_outbox(PgOptions::default());
    let config = stdout_config(&pg);
    let relay = start_streaming(&config);
    let mut before = insert(&pg, "before", 2);
    // The relay records the acknowledged position of event commits (never an idle
    // position), so the record covers the last insert once it lies past the position
    // read just before that insert's transaction.
    let before_last = support::u64_to_lsn(pg.current_wal_lsn());
    before.extend(insert(&pg, "before", 1));
    relay.wait_for_lines(3, WAIT);
    let recorded = support::wait_for("the acknowledged position is recorded", WAIT, || {
        pg.client_db("app")
            .query_opt(
                "SELECT acknowledged_lsn::text, acknowledged_at::text FROM outbox_relay_state
                 WHERE slot_name = $1 AND acknowledged_lsn > $2::text::pg_lsn",
                &[&SLOT, &before_last],
            )
            .ok()
            .flatten()
            .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
    });
    relay.sigterm();
    assert!(relay.wait_exit(WAIT).success());
    let (acknowledged_lsn, acknowledged_at) = pg
        .client_db("app")
        .query_one(
            "SELECT acknowledged_lsn::text, acknowledged_at::text FROM outbox_relay_state WHERE slot_name = $1",
            &[&SLOT],
        )
        .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
        .unwrap();
    assert!(support::lsn_to_u64(&acknowledged_lsn) >= support::lsn_to_u64(&recorded.0));

    // Committed while the relay was down, then the slot is lost.
    let gap = insert(&pg, "gap", 3);
    pg.client_db("app")
        .batch_execute("SELECT pg_drop_replication_slot('outbox_relay')")
        .unwrap();

    let (status, _stdout, stderr) = support::run_relay_to_exit(&config, WAIT);
    assert!(!status.success());
    let stderr = plain(&stderr);
    for needle in [
        "\"outbox_relay\" does not exist, but this relay streamed from it",
        acknowledged_lsn.as_str(),
        acknowledged_at.as_str(),
        "slot create --accept-gap",
        "backfill",
    ] {
        assert!(stderr.contains(needle), "says {needle:?}: {stderr}");
    }
    assert!(
        !slot_exists(&pg),
        "no slot was created behind the operator's back"
    );

    // `slot create` without --accept-gap refuses the same way.
    let (status, _, stderr) = run_command(&["slot", "create"], &config, WAIT);
    assert!(!status.success(), "{stderr}");
    assert!(
        plain(&stderr).contains("slot create --accept-gap"),
        "{stderr}"
    );
    assert!(!slot_exists(&pg));

    // Knowingly: a new slot, and the relay streams again.
    let (status, _, stderr) = run_command(&["slot", "create", "--accept-gap"], &config, WAIT);
    assert!(status.success(), "{stderr}");
    let stderr = plain(&stderr);
    assert!(
        stderr.contains("were not relayed") && stderr.contains("backfill"),
        "names the gap and the backfill: {stderr}"
    );
    let (gap_from, gap_to): (Option<String>, Option<String>) = pg
        .client_db("app")
        .query_one(
            "SELECT gap_from_lsn::text, gap_to_lsn::text FROM outbox_relay_state WHERE slot_name = $1",
            &[&SLOT],
        )
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!(gap_from.as_deref(), Some(acknowledged_lsn.as_str()));
    assert!(gap_to.is_some(), "the gap is recorded");

    let relay = RelayProcess::start(&config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let after = insert(&pg, "after", 2);
    let streamed: HashSet<String> = event_ids(&relay.wait_for_lines(2, WAIT))
        .into_iter()
        .collect();
    assert_eq!(
        streamed,
        after.iter().cloned().collect(),
        "only new rows stream"
    );

    // The backfill re-sends the rows written since the last acknowledgement.
    let (status, stdout, stderr) =
        run_command(&["backfill", "--since", &acknowledged_at], &config, WAIT);
    assert!(status.success(), "{stderr}");
    let backfilled = ids(&stdout);
    for id in &gap {
        assert!(backfilled.contains(id), "gap row {id} re-sent: {stdout}");
    }
    for id in &before {
        assert!(
            !backfilled.contains(id),
            "row {id} from before the acknowledged time is not re-sent"
        );
    }
    assert!(plain(&stderr).contains("delivered"), "{stderr}");
}

/// The record is written when events were acknowledged, not on every status interval:
/// an UPDATE of the record writes WAL, which an idle relay would acknowledge and record
/// again, forever.
#[test]
fn an_idle_relay_does_not_keep_rewriting_its_record() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&stdout_config(&pg));
    // A record is written only for an acknowledged event commit: one past this position
    // is the event's.
    let before_insert = pg.current_wal_lsn();
    insert(&pg, "idle", 1);
    relay.wait_for_lines(1, WAIT);
    let mut app = pg.client_db("app");
    let record = |app: &mut postgres::Client| -> Option<(String, u64)> {
        app.query_opt(
            "SELECT xmin::text, acknowledged_lsn::text FROM outbox_relay_state WHERE slot_name = $1",
            &[&SLOT],
        )
        .ok()
        .flatten()
        .and_then(|row| {
            let lsn: Option<String> = row.get(1);
            Some((row.get(0), support::lsn_to_u64(&lsn?)))
        })
    };
    let (version, _) = support::wait_for("the event's acknowledgement recorded", WAIT, || {
        record(&mut app).filter(|(_, lsn)| *lsn > before_insert)
    });
    // Ten status updates later (200 ms each): the relay is idle and has told
    // PostgreSQL so again and again.
    let mut client = pg.client();
    let reply_time = |client: &mut postgres::Client| -> f64 {
        client
            .query_one(
                "SELECT coalesce(extract(epoch FROM max(reply_time))::float8, 0)
                   FROM pg_stat_replication",
                &[],
            )
            .map(|row| row.get(0))
            .unwrap_or(0.0)
    };
    let start = reply_time(&mut client);
    support::wait_until("ten more status updates", WAIT, || {
        reply_time(&mut client) >= start + 2.0
    });
    let (later, _) = record(&mut app).expect("the record");
    assert_eq!(
        later, version,
        "the record was rewritten while nothing was acknowledged but the relay's own writes"
    );
    drop(relay);
}

/// `slot create` on a database without the publication creates the publication first,
/// so the slot can stream: a publication created after the slot's start would make every
/// run stop with "publication does not exist" at the WAL the slot reads.
#[test]
fn slot_create_before_the_publication_exists_creates_it_first() {
    let pg = cluster_with_outbox(PgOptions::default());
    let config = stdout_config(&pg);
    let (status, _, stderr) = run_command(&["slot", "create"], &config, WAIT);
    assert!(status.success(), "{stderr}");
    assert!(slot_exists(&pg));
    let relay = RelayProcess::start(&config);
    let rows = insert(&pg, "after", 3);
    let streamed = event_ids(&relay.wait_for_lines(3, WAIT));
    assert_eq!(
        streamed,
        rows,
        "the slot streams; relay stderr:\n{}",
        relay.stderr_tail()
    );
    assert!(
        plain(&stderr).contains("created publication \"outbox_relay\" first"),
        "{stderr}"
    );
}
