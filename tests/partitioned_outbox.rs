//! A partitioned outbox (by time, so old rows go by dropping partitions): the relay
//! publishes it through its root, streams rows of every partition as outbox events, and
//! refuses a publication that would name the partitions instead (rows the relay would
//! not recognise, and acknowledge).

use outbox_relay_harness as support;

use serde_json::Value;
use support::outbox::{cluster_with_app_db, plain, stdout_config, SLOT, WAIT};
use support::{PgCluster, RelayProcess};

/// A range-partitioned outbox in Debezium's shape with two monthly partitions.
const PARTITIONED_OUTBOX: &str = "
CREATE TABLE public.outbox (
    id            uuid         NOT NULL DEFAULT gen_random_uuid(),
    aggregatetype varchar(255) NOT NULL,
    aggregateid   varchar(255) NOT NULL,
    type          varchar(255) NOT NULL,
    payload       jsonb,
    created_at    timestamptz  NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE public.outbox_2026_11 PARTITION OF public.outbox
    FOR VALUES FROM ('2026-11-01') TO ('2026-12-01');
CREATE TABLE public.outbox_2026_12 PARTITION OF public.outbox
    FOR VALUES FROM ('2026-12-01') TO ('2027-01-01');
";

fn partitioned_cluster() -> PgCluster {
    let pg = cluster_with_app_db();
    pg.client_db("app")
        .batch_execute(PARTITIONED_OUTBOX)
        .expect("creating the partitioned outbox");
    pg
}

/// Inserts one event dated `created_at` in its own transaction; returns its id.
fn insert_at(pg: &PgCluster, n: u32, created_at: &str) -> String {
    let id = format!("20000000-0000-0000-0000-{n:012}");
    pg.client_db("app")
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
             VALUES ($1::text::uuid, 'order', 'o', 'T', jsonb_build_object('n', $2::int), $3::text::timestamptz)",
            &[&id, &(n as i32), &created_at],
        )
        .unwrap_or_else(|e| panic!("inserting event {n} at {created_at}: {e}"));
    id
}

fn ids(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|line| {
            let event: Value = serde_json::from_str(line).expect("a JSON line");
            assert_eq!(event["topic"], "outbox.event.order", "{line}");
            event["headers"]["id"]
                .as_str()
                .expect("an id header")
                .to_owned()
        })
        .collect()
}

#[test]
fn rows_of_every_partition_arrive_once_in_commit_order_across_attach_and_detach() {
    let pg = partitioned_cluster();
    let relay = RelayProcess::start(&stdout_config(&pg));
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let publication_via_root: bool = pg
        .client_db("app")
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'outbox_relay'",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(
        publication_via_root,
        "the relay's publication publishes through the root"
    );

    let mut want = Vec::new();
    for n in 0..10 {
        let month = if n % 2 == 0 {
            "2026-11-15"
        } else {
            "2026-12-15"
        };
        want.push(insert_at(&pg, n, month));
    }
    // A new month is attached while the relay streams, and the oldest one detached and
    // dropped: rows keep flowing from whichever partition they land in.
    pg.client_db("app")
        .batch_execute(
            "CREATE TABLE public.outbox_2027_01 (LIKE public.outbox INCLUDING DEFAULTS);
             ALTER TABLE public.outbox ATTACH PARTITION public.outbox_2027_01
                 FOR VALUES FROM ('2027-01-01') TO ('2027-02-01');",
        )
        .unwrap();
    for n in 10..20 {
        let month = if n % 2 == 0 {
            "2027-01-15"
        } else {
            "2026-12-20"
        };
        want.push(insert_at(&pg, n, month));
    }
    pg.client_db("app")
        .batch_execute(
            "ALTER TABLE public.outbox DETACH PARTITION public.outbox_2026_11;
             DROP TABLE public.outbox_2026_11;",
        )
        .unwrap();
    for n in 20..30 {
        let month = if n % 2 == 0 {
            "2027-01-20"
        } else {
            "2026-12-25"
        };
        want.push(insert_at(&pg, n, month));
    }
    let lines = relay.wait_for_lines(want.len(), WAIT);
    assert_eq!(ids(&lines), want, "every row once, in commit order");

    // And the acknowledgement follows: nothing is replayed after a restart.
    let end = pg.current_wal_lsn();
    support::wait_until("acknowledged past the last row", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= end
    });
    assert_eq!(relay.exit_status(), None);
}

#[test]
fn a_publication_naming_the_partitions_is_refused_with_the_alter_to_run() {
    let pg = partitioned_cluster();
    pg.client_db("app")
        .batch_execute(
            "CREATE PUBLICATION outbox_relay FOR TABLE public.outbox WITH (publish = 'insert')",
        )
        .unwrap();
    let (status, _stdout, stderr) = support::run_relay_to_exit(&stdout_config(&pg), WAIT);
    assert!(!status.success());
    let stderr = plain(&stderr);
    assert!(
        stderr
            .contains("ALTER PUBLICATION \"outbox_relay\" SET (publish_via_partition_root = true)"),
        "gives the fix: {stderr}"
    );
    assert!(stderr.contains("partitions' names"), "says why: {stderr}");
}

/// The publication is switched to name the partitions while the relay runs: the next
/// insert arrives under a partition's name, and the relay stops instead of acknowledging
/// a transaction whose outbox rows it did not recognise. PostgreSQL decodes a row with
/// the publication as it was when the row was written, so the row comes the same way
/// after the fix too: the relay stops on it every time, never acknowledging it, until
/// an operator re-sends it from the table and moves the slot past it.
#[test]
fn rows_arriving_under_a_partition_name_stop_the_relay_unacknowledged() {
    let pg = partitioned_cluster();
    let relay = RelayProcess::start(&stdout_config(&pg));
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let first = insert_at(&pg, 1, "2026-12-02");
    relay.wait_for_lines(1, WAIT);
    pg.client_db("app")
        .batch_execute("ALTER PUBLICATION outbox_relay SET (publish_via_partition_root = false)")
        .unwrap();
    let before = pg.current_wal_lsn();
    let hidden = insert_at(&pg, 2, "2026-12-03");
    let status = relay.wait_exit(WAIT);
    assert!(!status.success(), "the relay stops");
    let stderr = plain(&relay.stderr());
    // The stream (an insert under the partition's name) or the outbox watch (the
    // publication's option changed), whichever sees it first, stops the relay.
    assert!(
        stderr.contains("publish_via_partition_root = true")
            && (stderr.contains("public.outbox_2026_12") || stderr.contains("through its root")),
        "says what changed and the fix: {stderr}"
    );
    assert!(
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(u64::MAX) <= before,
        "nothing past the hidden row was acknowledged"
    );
    assert_eq!(ids(&relay.lines()), std::slice::from_ref(&first));
    drop(relay);

    pg.client_db("app")
        .batch_execute("ALTER PUBLICATION outbox_relay SET (publish_via_partition_root = true)")
        .unwrap();
    let relay = RelayProcess::start(&stdout_config(&pg));
    let status = relay.wait_exit(WAIT);
    assert!(!status.success(), "stops on the same row again");
    let replayed = ids(&relay.lines());
    assert!(
        replayed.iter().all(|id| *id == first),
        "at most the earlier row again (at-least-once), never the hidden one: {replayed:?}"
    );
    assert!(
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(u64::MAX) <= before,
        "still unacknowledged"
    );
    // Rows written after the fix flow once the slot is moved past the hidden one (the
    // operator re-sends that row from the table).
    pg.client_db("app")
        .batch_execute("SELECT pg_replication_slot_advance('outbox_relay', pg_current_wal_lsn())")
        .unwrap();
    let after = insert_at(&pg, 3, "2026-12-04");
    let relay = RelayProcess::start(&stdout_config(&pg));
    assert_eq!(ids(&relay.wait_for_lines(1, WAIT)), [after]);
    assert!(!ids(&relay.lines()).contains(&hidden));
}
