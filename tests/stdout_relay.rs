//! End-to-end tests of the walking skeleton against a real PostgreSQL: outbox rows
//! committed in the database come out of the relay's stdout sink as JSON lines, and the
//! slot is acknowledged exactly as DESIGN.md requires.

use outbox_relay_harness as support;

use std::time::Duration;

use serde_json::Value;
use support::outbox::{cluster_with_outbox, insert_events, stdout_config, SLOT, WAIT};
use support::{PgCluster, PgOptions, RelayProcess};

/// The relay's config with defaults everywhere else (status interval included: the
/// idle test relies on the default cadence).
fn config(url: &str) -> String {
    format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\n\
         [outbox]\ntable = \"public.outbox\"\n[sink]\ntype = \"stdout\"\n"
    )
}

/// Start the relay as the superuser and wait until it streams from its slot: rows
/// committed before the slot was created are, by design, not part of its stream.
fn start_relay(pg: &PgCluster) -> RelayProcess {
    let relay = RelayProcess::start(&config(&pg.url("postgres", None, "app")));
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    relay
}

fn parse(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"))
}

/// Insert one sentinel event and wait for it: proves that every line before it is all
/// the relay had to say (no fixed sleeps).
fn sentinel(pg: &PgCluster, relay: &RelayProcess, expected_before: usize) -> Vec<String> {
    pg.client_db("app")
        .batch_execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('00000000-0000-0000-0000-00000000ffff', 'sentinel', 's', 'Sentinel', '{}')",
        )
        .unwrap();
    let lines = relay.wait_for_lines(expected_before + 1, WAIT);
    assert_eq!(
        lines.len(),
        expected_before + 1,
        "expected exactly {expected_before} lines before the sentinel"
    );
    assert_eq!(
        parse(lines.last().unwrap())["topic"],
        "outbox.event.sentinel"
    );
    lines
}

/// The relay exits 0 after SIGTERM, its final status update past `lsn` (the WAL position
/// before the last transaction).
fn exits_acknowledging_past(pg: &PgCluster, relay: &RelayProcess, lsn: u64) {
    let status = relay.wait_exit(WAIT);
    assert!(status.success(), "graceful shutdown exits 0, got {status}");
    let confirmed = pg
        .slot_confirmed_flush_lsn(SLOT)
        .expect("slot has a position");
    assert!(
        confirmed > lsn,
        "the final status update acknowledged the last transaction: slot at {confirmed:X}, \
         last commit after {lsn:X}; relay stderr:\n{}",
        relay.stderr_tail()
    );
}

fn lsn_value(text: &str) -> u64 {
    support::lsn_to_u64(text)
}

#[test]
fn thousand_rows_in_37_transactions_arrive_in_commit_order() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_relay(&pg);
    let types = ["Order", "Kunde_Ü", "注文🚀"];
    let mut client = pg.client_db("app");
    let mut expected = Vec::new();
    let mut row = 0usize;
    for txn in 0..37usize {
        // Sizes 1, 2, ... varying, summing to exactly 1000 over 37 transactions.
        let size = if txn == 36 {
            1000 - row
        } else {
            1 + (txn * 7) % 46
        };
        let mut tx = client.transaction().unwrap();
        for _ in 0..size {
            let id = format!("00000000-0000-0000-0000-{row:012}");
            let kind = types[row % 3];
            let payload = format!(
                "{{\"n\": {row}, \"text\": \"grüße – {kind} \\\"q\\\"\", \"nested\": {{\"ok\": true}}}}"
            );
            tx.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) \
                 VALUES ($1::text::uuid, $2, $3, 'Created', $4::text::jsonb)",
                &[&id, &kind, &format!("agg-{}", row % 17), &payload],
            )
            .unwrap();
            expected.push((id, kind, payload));
            row += 1;
        }
        tx.commit().unwrap();
    }
    assert_eq!(row, 1000);

    relay.wait_for_lines(1000, WAIT);
    let lines = sentinel(&pg, &relay, 1000);
    let mut last_lsn = 0;
    for (line, (id, kind, payload)) in lines.iter().zip(&expected) {
        let v = parse(line);
        assert_eq!(v["topic"], format!("outbox.event.{kind}"), "{line}");
        assert_eq!(v["key"], id.as_str(), "{line}");
        assert_eq!(v["headers"], serde_json::json!({ "id": id }), "{line}");
        let want: Value = serde_json::from_str(payload).unwrap();
        assert_eq!(
            v["value"], want,
            "payload written as JSON, unicode intact: {line}"
        );
        let lsn = lsn_value(v["lsn"].as_str().expect("lsn is a string"));
        assert!(lsn > last_lsn, "lsn must grow in commit order: {line}");
        last_lsn = lsn;
        assert_eq!(
            v.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["headers", "key", "lsn", "topic", "value"],
            "exactly the specified fields: {line}"
        );
    }
}

#[test]
fn rolled_back_transactions_print_nothing() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_relay(&pg);
    let mut client = pg.client_db("app");
    let mut tx = client.transaction().unwrap();
    for n in 0..5 {
        tx.execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('rolled', $1, 'X', '{}')",
            &[&n.to_string()],
        )
        .unwrap();
    }
    tx.rollback().unwrap();
    client
        .batch_execute(
            "BEGIN; INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('kept', '1', 'X', '\"ok\"'); COMMIT;",
        )
        .unwrap();
    let lines = sentinel(&pg, &relay, 1);
    assert_eq!(parse(&lines[0])["topic"], "outbox.event.kept");
    assert!(lines.iter().all(|l| !l.contains("rolled")), "{lines:?}");
}

#[test]
fn sigterm_acknowledges_end_lsn_so_a_restart_prints_only_new_rows() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_relay(&pg);
    let mut client = pg.client_db("app");
    let mut before_last_commit = 0;
    for n in 0..5 {
        before_last_commit = pg.current_wal_lsn();
        client
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('before', $1, 'X', '{}')",
                &[&n.to_string()],
            )
            .unwrap();
    }
    relay.wait_for_lines(5, WAIT);
    relay.sigterm();
    exits_acknowledging_past(&pg, &relay, before_last_commit);
    drop(relay);

    for n in 0..10 {
        client
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('after', $1, 'X', '{}')",
                &[&n.to_string()],
            )
            .unwrap();
    }
    let relay = RelayProcess::start(&config(&pg.url("postgres", None, "app")));
    let lines = sentinel(&pg, &relay, 10);
    for line in &lines[..10] {
        let v = parse(line);
        assert_eq!(
            v["topic"], "outbox.event.after",
            "no replay of earlier rows: {line}"
        );
        assert_eq!(v["headers"]["id"], v["key"]);
    }
}

/// The final status update at SIGTERM acknowledges the last delivered transaction even
/// when an outbox check was under way as the shutdown came, having read its WAL position
/// before that transaction committed (its report falls short: the relay must ask again).
/// The check is held in that state by a lock on the catalog it reads.
#[test]
fn sigterm_during_a_slow_outbox_check_still_acknowledges_the_last_transaction() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_relay(&pg);
    let mut client = pg.client_db("app");
    let insert = |client: &mut postgres::Client, n: usize| {
        client
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('before', $1, 'X', '{}')",
                &[&n.to_string()],
            )
            .unwrap();
    };
    // Taken before the commit: one taken after it can include WAL that others wrote
    // meanwhile (a running-xacts record), which no record of the relay ever reaches.
    let before_first = pg.current_wal_lsn();
    insert(&mut client, 0);
    relay.wait_for_lines(1, WAIT);
    // Its record written first (the record's UPDATE, on the watch's connection, reads
    // the publication catalogs too): the next record is then a second away, and the
    // check asked on the next delivery runs before it.
    support::wait_until("the first event recorded", WAIT, || {
        support::outbox::recorded_lsn(&pg).is_some_and(|lsn| lsn > before_first)
    });
    // Hold every outbox check at its second step (after it read the WAL position).
    let mut locker = pg.client_db("app");
    let mut lock = locker.transaction().unwrap();
    lock.batch_execute("LOCK TABLE pg_catalog.pg_publication_rel IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    for n in 1..4 {
        insert(&mut client, n);
    }
    relay.wait_for_lines(4, WAIT);
    let mut observer = pg.client_db("app");
    support::wait_until("an outbox check waits on the lock", WAIT, || {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE wait_event_type = 'Lock' AND query LIKE '%pg_publication_rel%' \
                    AND pid <> pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0);
        waiting > 0
    });
    let before_last_commit = pg.current_wal_lsn();
    insert(&mut client, 4);
    relay.wait_for_lines(5, WAIT);
    relay.sigterm();
    relay.wait_for_stderr("shutdown requested", WAIT);
    lock.rollback().unwrap();
    exits_acknowledging_past(&pg, &relay, before_last_commit);
}

/// With the default 10 s status interval, the slot follows delivery within a fraction of
/// a second (a status update goes out soon after the acknowledged position moves), so a
/// `kill -9` right after delivery replays nothing.
#[test]
fn acknowledged_promptly_so_kill_9_after_delivery_replays_nothing() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_relay(&pg);
    let mut client = pg.client_db("app");
    for round in 0..3 {
        for n in 0..20 {
            client
                .execute(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('prompt', $1, 'X', '{}')",
                    &[&format!("{round}-{n}")],
                )
                .unwrap();
        }
        let after_commits = pg.current_wal_lsn();
        relay.wait_for_lines((round + 1) * 20, WAIT);
        // Well under the 10 s status timer: only a prompt update can do this.
        support::wait_until(
            "the slot is acknowledged past the delivered transactions within 2 s",
            Duration::from_secs(2),
            || pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= after_commits,
        );
    }
    relay.kill9();
    relay.wait_exit(WAIT);
    let relay = RelayProcess::start(&config(&pg.url("postgres", None, "app")));
    let lines = sentinel(&pg, &relay, 0);
    assert_eq!(lines.len(), 1, "nothing replayed after kill -9: {lines:?}");
}

#[test]
fn idle_outbox_does_not_hold_back_wal_of_other_tables() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_relay(&pg);
    let mut client = pg.client_db("app");
    client
        .batch_execute("CREATE TABLE other (id int, filler text)")
        .unwrap();
    let before = pg.current_wal_lsn();
    client
        .batch_execute(
            "INSERT INTO other SELECT g, repeat(md5(g::text), 32) FROM generate_series(1, 50000) g",
        )
        .unwrap();
    let written = pg.current_wal_lsn() - before;
    assert!(written >= 50 << 20, "wrote only {written} bytes of WAL");
    support::wait_until(
        "confirmed_flush_lsn within 1 MB of pg_current_wal_lsn()",
        Duration::from_secs(30),
        || {
            let current = pg.current_wal_lsn();
            let confirmed = pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0);
            current.saturating_sub(confirmed) < 1 << 20
        },
    );
    assert_eq!(relay.line_count(), 0, "no outbox rows were written");
}

fn scram_cluster() -> PgCluster {
    let pg = cluster_with_outbox(PgOptions {
        hba: vec![
            "host all scram_user 127.0.0.1/32 scram-sha-256".into(),
            "host all md5_user 127.0.0.1/32 md5".into(),
            "host all clear_user 127.0.0.1/32 password".into(),
        ],
        ..PgOptions::default()
    });
    pg.client_db("app")
        .batch_execute(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE scram_user LOGIN REPLICATION PASSWORD 'correct horse';
             CREATE ROLE clear_user LOGIN REPLICATION PASSWORD 'plain';
             SET password_encryption = 'md5';
             CREATE ROLE md5_user LOGIN REPLICATION PASSWORD 'md5 pw';
             GRANT SELECT ON outbox TO scram_user, md5_user, clear_user;
             CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert');
             CREATE TABLE outbox_relay_state (slot_name text PRIMARY KEY, system_identifier text,
                 created_at timestamptz, first_streamed_at timestamptz, acknowledged_lsn pg_lsn,
                 acknowledged_at timestamptz, gap_accepted_at timestamptz, gap_from_lsn pg_lsn,
                 gap_to_lsn pg_lsn);
             GRANT SELECT, INSERT, UPDATE ON outbox_relay_state TO scram_user, md5_user, clear_user;",
        )
        .unwrap();
    pg
}

#[test]
fn password_users_connect_with_scram_md5_and_cleartext() {
    let pg = scram_cluster();
    for (user, password) in [
        ("scram_user", "correct horse"),
        ("md5_user", "md5 pw"),
        ("clear_user", "plain"),
    ] {
        let slot = format!("slot_{user}");
        let toml = config(&pg.url(user, Some(password), "app"))
            .replace(&format!("slot = \"{SLOT}\""), &format!("slot = \"{slot}\""));
        let relay = RelayProcess::start(&toml);
        relay.wait_streaming(&pg.superuser_url(), &slot, WAIT);
        pg.client_db("app")
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, '1', 'X', '{}')",
                &[&user],
            )
            .unwrap();
        let lines = relay.wait_for_lines(1, WAIT);
        assert_eq!(parse(&lines[0])["topic"], format!("outbox.event.{user}"));
    }
}

#[test]
fn wrong_password_exits_nonzero_saying_authentication_failed() {
    let pg = scram_cluster();
    let (status, stdout, stderr) =
        support::run_relay_to_exit(&config(&pg.url("scram_user", Some("wrong"), "app")), WAIT);
    assert!(!status.success());
    assert!(stdout.is_empty(), "nothing on stdout: {stdout}");
    assert!(
        stderr.contains("authentication failed for user \"scram_user\""),
        "stderr: {stderr}"
    );
}

#[test]
fn wal_level_replica_exits_nonzero_saying_how_to_fix_it() {
    let pg = cluster_with_outbox(PgOptions {
        wal_level: "replica",
        ..PgOptions::default()
    });
    let (status, _stdout, stderr) =
        support::run_relay_to_exit(&config(&pg.url("postgres", None, "app")), WAIT);
    assert!(!status.success());
    assert!(stderr.contains("wal_level=logical"), "stderr: {stderr}");
    assert!(stderr.contains("restart PostgreSQL"), "stderr: {stderr}");
}

#[test]
fn the_server_under_test_is_the_one_pg_bindir_names() {
    let pg = PgCluster::start();
    let version = support::query_lsn(&mut pg.client(), "SHOW server_version");
    support::outbox::report(&format!("stdout_relay: PostgreSQL {version}"));
    if let Some(bindir) = std::env::var_os("PG_BINDIR").filter(|dir| !dir.is_empty()) {
        let output = std::process::Command::new(std::path::Path::new(&bindir).join("postgres"))
            .arg("--version")
            .output()
            .expect("running postgres --version");
        let reported = String::from_utf8_lossy(&output.stdout);
        assert!(
            reported.contains(&format!("(PostgreSQL) {version}")),
            "PG_BINDIR's postgres says {reported:?}, the cluster runs {version}"
        );
    }
}

/// PostgreSQL 13 and 14 send a Begin/Commit pair for every transaction, even one
/// without a published change; 15 and later send only keepalives. Either way the
/// relay prints only outbox events and acknowledges past the other transactions.
#[test]
fn transactions_without_outbox_rows_between_events_are_acknowledged() {
    let pg = cluster_with_outbox(PgOptions::default());
    // Status updates every 200 ms: the wait below is for an acknowledgement.
    let relay = RelayProcess::start(
        &config(&pg.url("postgres", None, "app"))
            .replace("[outbox]", "status_interval_ms = 200\n[outbox]"),
    );
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    let mut client = pg.client_db("app");
    client.batch_execute("CREATE TABLE other (id int)").unwrap();
    for n in 0..10 {
        client
            .batch_execute(&format!(
                "INSERT INTO other VALUES ({n}); INSERT INTO other VALUES ({n});"
            ))
            .unwrap();
        client
            .execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('mixed', $1, 'X', '{}')",
                &[&n.to_string()],
            )
            .unwrap();
    }
    client
        .batch_execute("INSERT INTO other VALUES (-1)")
        .unwrap();
    let last_commit = pg.current_wal_lsn();
    relay.wait_for_lines(10, WAIT);
    support::wait_until(
        "confirmed_flush_lsn past the last transaction (other table only)",
        WAIT,
        || pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= last_commit,
    );
    let lines = sentinel(&pg, &relay, 10);
    for (n, line) in lines[..10].iter().enumerate() {
        let v = parse(line);
        assert_eq!(v["topic"], "outbox.event.mixed", "{line}");
        assert_eq!(v["headers"]["id"], v["key"], "{line}");
        assert_eq!(v["value"], serde_json::json!({}), "event {n}: {line}");
    }
}

#[test]
fn json_logs_are_one_object_per_line_including_the_final_error() {
    let pg = cluster_with_outbox(PgOptions::default());
    let relay =
        support::RelayProcess::start_with_args(&stdout_config(&pg), &["--log-format", "json"], &[]);
    relay.wait_streaming(&pg.url("postgres", None, "app"), SLOT, WAIT);
    insert_events(&pg, "json", 1);
    relay.wait_for_lines(1, WAIT);
    // A definite error ends the run: the publication disappears.
    pg.client_db("app")
        .batch_execute("DROP PUBLICATION outbox_relay")
        .unwrap();
    insert_events(&pg, "json", 1);
    let status = relay.wait_exit(WAIT);
    assert!(!status.success());
    let stderr = relay.stderr();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"))
        })
        .collect();
    assert!(
        lines.iter().any(
            |l| l["message"] == outbox_relay::relay::log::STARTING_REPLICATION
                && l["slot"] == SLOT
                && l["level"] == "INFO"
        ),
        "{stderr}"
    );
    let last = lines.last().expect("log lines");
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert!(
        last["error"]
            .as_str()
            .is_some_and(|e| e.contains("CREATE PUBLICATION")),
        "{stderr}"
    );
}
