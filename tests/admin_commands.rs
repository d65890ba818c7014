//! The operator commands beside `run`, against a real PostgreSQL: `init` (printed and
//! applied), `slot status`, `slot drop`, `cleanup`.

use outbox_relay_harness as support;

use std::process::{Command, Output};

use support::outbox::{cluster_with_app_db, event_ids, plain, SLOT, WAIT};
use support::{relay_bin, wait_until, PgCluster, RelayProcess};

/// Config of a relay connecting as `outbox_relay` (the role `init` creates; trust auth).
fn relay_config(pg: &PgCluster) -> String {
    format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"outbox_relay\"\nstatus_interval_ms = 200\n\
         [outbox]\ntable = \"public.outbox\"\n",
        pg.url("outbox_relay", None, "app")
    )
}

/// Runs `outbox-relay <args> --config <config>` to its end.
fn command(config: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("relay.toml");
    std::fs::write(&path, config).expect("writing the config");
    Command::new(relay_bin())
        .args(args)
        .arg("--config")
        .arg(&path)
        .output()
        .expect("running outbox-relay")
}

fn succeeded(output: &Output) -> (String, String) {
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = plain(&String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success(),
        "{}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    (stdout, stderr)
}

fn failed(output: &Output) -> String {
    let stderr = plain(&String::from_utf8_lossy(&output.stderr));
    assert!(
        !output.status.success(),
        "expected a failure; stderr:\n{stderr}"
    );
    stderr
}

/// A database set up by `init --apply`, as the superuser.
fn initialised(partitioned: bool) -> (PgCluster, String) {
    let pg = cluster_with_app_db();
    let config = relay_config(&pg);
    let admin = pg.url("postgres", None, "app");
    let mut args = vec!["init", "--apply", "--admin-url", admin.as_str()];
    if partitioned {
        args.push("--partitioned");
    }
    succeeded(&command(&config, &args));
    (pg, config)
}

fn app_client(pg: &PgCluster) -> postgres::Client {
    postgres::Config::new()
        .host("127.0.0.1")
        .port(pg.port())
        .user("app_writer")
        .dbname("app")
        .connect(postgres::NoTls)
        .expect("connecting as app_writer")
}

/// Inserts events as the application role (which may not read the outbox, so no
/// RETURNING: the ids are made first); their ids.
fn insert_as_app(pg: &PgCluster, rows: &[(&str, &str)]) -> Vec<String> {
    let mut app = app_client(pg);
    rows.iter()
        .map(|(kind, created_at)| {
            let id: String = app
                .query_one("SELECT gen_random_uuid()::text", &[])
                .expect("a new uuid")
                .get(0);
            app.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
                 VALUES ($1::text::uuid, $2, 'a', 'T', '{}', $3::text::timestamptz)",
                &[&id, kind, created_at],
            )
            .expect("inserting as app_writer");
            id
        })
        .collect()
}

fn start_relay(pg: &PgCluster, config: &str) -> RelayProcess {
    let relay = RelayProcess::start(config);
    relay.wait_streaming(&pg.superuser_url(), SLOT, WAIT);
    relay
}

fn wait_acknowledged(pg: &PgCluster) {
    let target = pg.current_wal_lsn();
    wait_until("the slot acknowledged everything so far", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= target
    });
}

fn count(pg: &PgCluster, sql: &str) -> i64 {
    pg.client_db("app").query_one(sql, &[]).expect(sql).get(0)
}

#[test]
fn init_prints_the_set_up_sql_without_connecting() {
    // Nothing listens on port 1: printing needs no server.
    let config = "[postgres]\nurl = \"postgres://outbox_relay@127.0.0.1:1/app\"\n";
    let (sql, _) = succeeded(&command(config, &["init", "--partitioned"]));
    assert!(sql.contains("PARTITION BY RANGE (created_at)"), "{sql}");
    assert!(sql.contains("publish_via_partition_root = true"), "{sql}");
    assert!(
        sql.contains("GRANT INSERT ON \"public\".\"outbox\" TO \"app_writer\""),
        "{sql}"
    );
}

#[test]
fn init_apply_gives_a_database_the_relay_runs_against_and_an_insert_only_app_role() {
    let (pg, config) = initialised(false);
    // Safe to run again.
    let admin = pg.url("postgres", None, "app");
    succeeded(&command(
        &config,
        &["init", "--apply", "--admin-url", &admin],
    ));
    // The preflight finds what init set up complete, the takeover privilege included:
    // no warning right after init.
    let check = command(&config, &["check", "--json"]);
    let findings: serde_json::Value =
        serde_json::from_slice(&check.stdout).expect("check --json prints a JSON array");
    let findings = findings.as_array().expect("an array of findings");
    assert!(
        findings.iter().any(|f| f["id"] == "postgres.takeover"),
        "{findings:?}"
    );
    let not_ok: Vec<_> = findings.iter().filter(|f| f["status"] != "ok").collect();
    assert!(not_ok.is_empty(), "check after init: {not_ok:?}");
    assert!(check.status.success());

    let relay = start_relay(&pg, &config);
    let ids = insert_as_app(&pg, &[("order", "now"), ("order", "now")]);
    let lines = relay.wait_for_lines(2, WAIT);
    assert_eq!(event_ids(&lines), ids);

    let mut app = app_client(&pg);
    for sql in [
        "UPDATE outbox SET type = 'rewritten'",
        "DELETE FROM outbox",
        "TRUNCATE outbox",
        "SELECT * FROM outbox",
    ] {
        let error = app.batch_execute(sql).expect_err(sql);
        assert_eq!(
            error.code(),
            Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {error}"
        );
    }
}

#[test]
fn init_apply_partitioned_streams_through_the_root() {
    let (pg, config) = initialised(true);
    let relay = start_relay(&pg, &config);
    let ids = insert_as_app(&pg, &[("order", "now"), ("order", "2001-01-01")]);
    let lines = relay.wait_for_lines(2, WAIT);
    assert_eq!(
        event_ids(&lines),
        ids,
        "this month's partition and the default one"
    );
    assert!(lines
        .iter()
        .all(|l| l.contains("\"topic\":\"outbox.event.order\"")));
}

#[test]
fn slot_status_matches_pg_replication_slots() {
    let (pg, config) = initialised(false);
    let missing = succeeded(&command(&config, &["slot", "status"])).0;
    assert!(missing.contains("does not exist"), "{missing}");

    let relay = start_relay(&pg, &config);
    insert_as_app(&pg, &[("order", "now")]);
    relay.wait_for_lines(1, WAIT);
    wait_acknowledged(&pg);
    let (json, _) = succeeded(&command(&config, &["slot", "status", "--json"]));
    let status: serde_json::Value = serde_json::from_str(&json).expect(&json);
    let row = pg
        .client()
        .query_one(
            "SELECT active, active_pid, wal_status FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .unwrap();
    assert_eq!(status["active"], row.get::<_, bool>(0));
    assert_eq!(status["active_pid"], row.get::<_, i32>(1));
    assert_eq!(status["wal_status"], row.get::<_, String>(2));

    relay.sigterm();
    assert!(relay.wait_exit(WAIT).success());
    let (json, _) = succeeded(&command(&config, &["slot", "status", "--json"]));
    let status: serde_json::Value = serde_json::from_str(&json).expect(&json);
    let row = pg
        .client()
        .query_one(
            "SELECT confirmed_flush_lsn::text, restart_lsn::text, active,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
                    pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
               FROM pg_replication_slots WHERE slot_name = $1",
            &[&SLOT],
        )
        .unwrap();
    assert_eq!(status["confirmed_flush_lsn"], row.get::<_, String>(0));
    assert_eq!(status["restart_lsn"], row.get::<_, String>(1));
    assert_eq!(status["active"], false);
    assert_eq!(status["lag_bytes"], row.get::<_, i64>(3));
    assert_eq!(status["retained_bytes"], row.get::<_, i64>(4));
    assert_eq!(status["record"]["streamed"], true);
    let (text, _) = succeeded(&command(&config, &["slot", "status"]));
    assert!(text.contains(&row.get::<_, String>(0)), "{text}");
}

#[test]
fn slot_drop_is_refused_while_streaming_and_keeps_the_record_unless_told() {
    let (pg, config) = initialised(false);
    let relay = start_relay(&pg, &config);
    let refused = failed(&command(&config, &["slot", "drop"]));
    assert!(refused.contains("is in use"), "{refused}");
    relay.sigterm();
    assert!(relay.wait_exit(WAIT).success());

    let (_, said) = succeeded(&command(&config, &["slot", "drop"]));
    assert!(said.contains("dropped replication slot"), "{said}");
    assert_eq!(pg.slot_confirmed_flush_lsn(SLOT), None);
    // A slot dropped after the relay streamed from it is lost: `slot status` says so
    // with exit code 2, for scripts and probes.
    let lost = command(&config, &["slot", "status"]);
    let text = String::from_utf8_lossy(&lost.stdout);
    assert_eq!(lost.status.code(), Some(2), "{text}");
    assert!(text.contains("the slot was lost"), "{text}");
    let lost = command(&config, &["slot", "status", "--json"]);
    assert_eq!(lost.status.code(), Some(2));
    let json: serde_json::Value = serde_json::from_slice(&lost.stdout).expect("one JSON object");
    assert_eq!(json["lost"], true);
    // The record stays: a relay refuses to replace the slot silently.
    let (status, _, stderr) = support::run_relay_to_exit(&config, WAIT);
    assert!(!status.success());
    assert!(stderr.contains("--accept-gap"), "{stderr}");

    let (_, said) = succeeded(&command(&config, &["slot", "drop", "--forget"]));
    assert!(said.contains("removed the relay's record"), "{said}");
    let relay = start_relay(&pg, &config);
    drop(relay);
}

#[test]
fn cleanup_deletes_only_old_rows_the_slot_passed() {
    let (pg, config) = initialised(false);
    let relay = start_relay(&pg, &config);
    insert_as_app(&pg, &[("old", "2001-01-01"), ("old", "2001-01-02")]);
    let recent = insert_as_app(&pg, &[("new", "now")]);
    relay.wait_for_lines(3, WAIT);
    wait_acknowledged(&pg);
    relay.sigterm();
    assert!(relay.wait_exit(WAIT).success());

    // An old row whose transaction is still open when cleanup takes its snapshot, and
    // commits while cleanup waits for the slot: whatever its age, it was not in the
    // snapshot, so nothing proves it was relayed when cleanup started. It stays.
    let mut open = pg.client_db("app");
    let mut open_txn = open.transaction().unwrap();
    open_txn
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, created_at)
             VALUES ('late', 'a', 'T', '{}', '2001-01-03')",
        )
        .unwrap();
    // WAL the stopped relay has not acknowledged: cleanup must wait for it.
    pg.client_db("app")
        .batch_execute("CREATE TABLE unrelated (x int); INSERT INTO unrelated VALUES (1)")
        .unwrap();
    let admin = pg.url("postgres", None, "app");
    let cleanup = {
        let config = config.clone();
        let admin = admin.clone();
        std::thread::spawn(move || {
            command(
                &config,
                &[
                    "cleanup",
                    "--older-than",
                    "7d",
                    "--batch",
                    "1",
                    "--admin-url",
                    &admin,
                ],
            )
        })
    };
    wait_until("cleanup waits for the slot", WAIT, || {
        assert!(
            !cleanup.is_finished(),
            "cleanup ended before the slot caught up"
        );
        count(
            &pg,
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query LIKE '%confirmed_flush_lsn >= %'",
        ) > 0
    });
    open_txn.commit().unwrap();
    // The relay catches up (the late row too), and cleanup goes on.
    let relay = start_relay(&pg, &config);
    relay.wait_for_lines(1, WAIT);
    let output = cleanup.join().expect("cleanup thread");
    let (_, said) = succeeded(&output);
    assert!(said.contains("deleted 2 rows"), "{said}");
    let left: Vec<String> = pg
        .client_db("app")
        .query("SELECT aggregatetype FROM outbox ORDER BY created_at", &[])
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(left, ["late", "new"]);
    assert_eq!(
        count(
            &pg,
            &format!("SELECT count(*) FROM outbox WHERE id = '{}'", recent[0])
        ),
        1
    );

    // The relay's own role may not delete: cleanup says which role it needs.
    wait_acknowledged(&pg);
    let refused = failed(&command(&config, &["cleanup", "--older-than", "7d"]));
    assert!(refused.contains("--admin-url"), "{refused}");
    assert_eq!(count(&pg, "SELECT count(*) FROM outbox"), 2);
}

#[test]
fn cleanup_refuses_while_the_relay_lags_and_deletes_nothing() {
    let (pg, config) = initialised(false);
    let relay = start_relay(&pg, &config);
    relay.sigterm();
    assert!(relay.wait_exit(WAIT).success());
    // Committed after the relay stopped: not in Kafka.
    insert_as_app(&pg, &[("old", "2001-01-01")]);
    let refused = failed(&command(
        &config,
        &["cleanup", "--older-than", "7d", "--wait-seconds", "1"],
    ));
    assert!(refused.contains("the relay lags behind"), "{refused}");
    assert!(refused.contains("nothing was deleted"), "{refused}");
    assert_eq!(count(&pg, "SELECT count(*) FROM outbox"), 1);
}

#[test]
fn cleanup_drops_old_partitions_the_slot_passed() {
    let (pg, config) = initialised(true);
    pg.client_db("app")
        .batch_execute(
            "CREATE TABLE public.outbox_2001_01 PARTITION OF public.outbox
               FOR VALUES FROM ('2001-01-01') TO ('2001-02-01');
             GRANT INSERT ON public.outbox_2001_01 TO app_writer;",
        )
        .unwrap();
    let relay = start_relay(&pg, &config);
    insert_as_app(
        &pg,
        &[("old", "2001-01-05"), ("old", "2001-01-06"), ("new", "now")],
    );
    relay.wait_for_lines(3, WAIT);
    wait_acknowledged(&pg);
    let admin = pg.url("postgres", None, "app");
    let (_, said) = succeeded(&command(
        &config,
        &["cleanup", "--older-than", "7d", "--admin-url", &admin],
    ));
    assert!(
        said.contains("dropped partitions public.outbox_2001_01"),
        "{said}"
    );
    assert_eq!(
        count(
            &pg,
            "SELECT count(*) FROM pg_class WHERE relname = 'outbox_2001_01'"
        ),
        0
    );
    assert_eq!(
        count(&pg, "SELECT count(*) FROM outbox"),
        1,
        "this month's row stays"
    );
    // Streaming goes on.
    insert_as_app(&pg, &[("after", "now")]);
    relay.wait_for_lines(4, WAIT);
}

/// A failed `--admin-url` login names `--admin-url` as the thing to fix, not the
/// configuration's `[postgres] url` (which was not used).
#[test]
fn a_failed_admin_login_points_at_admin_url() {
    let pg = PgCluster::start_with(support::PgOptions {
        hba: vec!["host all admin_user 127.0.0.1/32 scram-sha-256".into()],
        ..Default::default()
    });
    pg.batch_execute("CREATE DATABASE app");
    pg.batch_execute(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE admin_user LOGIN SUPERUSER PASSWORD 'right';",
    );
    let config = relay_config(&pg);
    let admin = pg.url("admin_user", Some("wrong"), "app");
    let refused = failed(&command(
        &config,
        &["init", "--apply", "--admin-url", &admin],
    ));
    assert!(refused.contains("authentication failed"), "{refused}");
    assert!(
        refused.contains("check the user and password (--admin-url"),
        "{refused}"
    );
    assert!(!refused.contains("[postgres] url"), "{refused}");
    assert!(
        !refused.contains("wrong"),
        "the password is never printed: {refused}"
    );
}
