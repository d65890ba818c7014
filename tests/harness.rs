//! Tests of the integration-test harness itself (`harness/` (the crate `outbox-relay-harness`)): if these fail, the
//! other integration tests cannot be trusted.

use outbox_relay_harness as support;

use std::process::Command;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::NoTls;
use support::{
    lsn_to_u64, query_lsn, u64_to_lsn, wait_for, wait_until, ChildProcess, PgCluster, PgOptions,
};

fn show(pg: &PgCluster, setting: &str) -> String {
    let row = pg
        .client()
        .query_one(&format!("SHOW {setting}"), &[])
        .expect("SHOW");
    row.get(0)
}

#[test]
fn cluster_starts_with_logical_wal_and_runs_queries() {
    let pg = PgCluster::start();
    let mut client = pg.client();
    let row = client.query_one("SELECT 40 + 2", &[]).unwrap();
    assert_eq!(row.get::<_, i32>(0), 42);
    assert_eq!(show(&pg, "wal_level"), "logical");
    assert_eq!(show(&pg, "max_replication_slots"), "10");
    assert_eq!(show(&pg, "port"), pg.port().to_string());
    assert_eq!(
        pg.superuser_url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );

    // client_db and the URL form both reach a freshly created database.
    client.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = pg.client_db("app");
    let row = app.query_one("SELECT current_database()", &[]).unwrap();
    assert_eq!(row.get::<_, String>(0), "app");
    let mut by_url = postgres::Client::connect(&pg.url("postgres", None, "app"), NoTls).unwrap();
    let row = by_url.query_one("SELECT current_user", &[]).unwrap();
    assert_eq!(row.get::<_, String>(0), "postgres");

    assert!(
        pg.log_tail().contains("ready to accept connections"),
        "{}",
        pg.log_tail()
    );
}

#[test]
fn options_set_wal_level_and_extra_conf() {
    let pg = PgCluster::start_with(PgOptions {
        wal_level: "replica",
        extra_conf: vec![("wal_sender_timeout".into(), "7s".into())],
        ..PgOptions::default()
    });
    assert_eq!(show(&pg, "wal_level"), "replica");
    assert_eq!(show(&pg, "wal_sender_timeout"), "7s");
}

#[test]
fn hba_lines_come_first_and_scram_checks_the_password() {
    let pg = PgCluster::start_with(PgOptions {
        hba: vec!["host all alice 127.0.0.1/32 scram-sha-256".into()],
        ..PgOptions::default()
    });
    // A password with URL-reserved characters exercises the percent-encoding.
    let password = "p@ss:w/rd%?#";
    pg.batch_execute(&format!(
        "SET password_encryption = 'scram-sha-256'; \
         CREATE ROLE alice LOGIN PASSWORD '{password}'"
    ));

    let wrong = postgres::Client::connect(&pg.url("alice", Some("wrong"), "postgres"), NoTls)
        .err()
        .expect("a wrong password must be rejected");
    assert_eq!(wrong.code(), Some(&SqlState::INVALID_PASSWORD), "{wrong}");

    let missing = postgres::Client::connect(&pg.url("alice", None, "postgres"), NoTls);
    assert!(
        missing.is_err(),
        "no password must be rejected under scram-sha-256"
    );

    let mut alice = postgres::Client::connect(&pg.url("alice", Some(password), "postgres"), NoTls)
        .expect("the right password must be accepted");
    let row = alice.query_one("SELECT current_user", &[]).unwrap();
    assert_eq!(row.get::<_, String>(0), "alice");

    // Users without an extra line still get initdb's trust lines.
    assert_eq!(show(&pg, "port"), pg.port().to_string());
}

#[test]
fn stop_and_start_again_keep_data() {
    let mut pg = PgCluster::start();
    pg.batch_execute("CREATE TABLE kept (id int); INSERT INTO kept VALUES (1)");
    let port = pg.port();
    let first_pid = pg.pid();

    assert!(pg.stop_fast().success(), "fast shutdown exits 0");
    assert!(!pg.is_running());
    assert!(
        postgres::Client::connect(&pg.superuser_url(), NoTls).is_err(),
        "a stopped cluster must refuse connections"
    );

    pg.start_again();
    assert_eq!(pg.port(), port);
    assert_ne!(pg.pid(), first_pid);
    pg.batch_execute("INSERT INTO kept VALUES (2)");

    // Immediate shutdown is a crash: committed rows survive through WAL replay.
    pg.stop_immediate();
    pg.start_again();
    let count: i64 = pg
        .client()
        .query_one("SELECT count(*) FROM kept", &[])
        .unwrap()
        .get(0);
    assert_eq!(count, 2);
    assert!(
        pg.log_tail().contains("database system was interrupted"),
        "{}",
        pg.log_tail()
    );
}

#[test]
fn drop_kills_the_server_and_removes_its_dir() {
    let pg = PgCluster::start();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pg.pid()).unwrap());
    let data_dir = pg.data_dir().to_owned();
    assert!(data_dir.join("PG_VERSION").exists());
    drop(pg);
    // The postmaster was reaped by drop, so the pid is gone (barring reuse).
    assert_eq!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    );
    assert!(!data_dir.exists(), "{} still exists", data_dir.display());
}

#[test]
fn lsn_helpers_follow_a_slot() {
    assert_eq!(lsn_to_u64("16/B374D848"), 0x16_B374_D848);
    assert_eq!(lsn_to_u64("0/0"), 0);
    assert_eq!(u64_to_lsn(0x16_B374_D848), "16/B374D848");

    let pg = PgCluster::start();
    assert_eq!(pg.slot_confirmed_flush_lsn("nope"), None);
    let created = query_lsn(
        &mut pg.client(),
        "SELECT lsn FROM pg_create_logical_replication_slot('harness', 'pgoutput')",
    );
    let slot_lsn = pg.slot_confirmed_flush_lsn("harness").expect("slot exists");
    assert_eq!(slot_lsn, lsn_to_u64(&created));

    pg.batch_execute(
        "CREATE TABLE t (id int); CREATE PUBLICATION harness_pub FOR TABLE t; \
         INSERT INTO t SELECT generate_series(1, 100)",
    );
    let current = pg.current_wal_lsn();
    assert!(current > slot_lsn, "{current:X} > {slot_lsn:X}");

    // Consuming the slot moves confirmed_flush_lsn forward.
    pg.batch_execute(
        "SELECT count(*) FROM pg_logical_slot_get_binary_changes('harness', NULL, NULL, \
         'proto_version', '1', 'publication_names', 'harness_pub')",
    );
    let advanced = pg.slot_confirmed_flush_lsn("harness").unwrap();
    assert!(advanced > slot_lsn, "{advanced:X} > {slot_lsn:X}");
}

#[test]
fn wait_helpers_poll_until_true() {
    let start = Instant::now();
    let mut calls = 0;
    wait_until("third call", Duration::from_secs(5), || {
        calls += 1;
        calls == 3
    });
    assert_eq!(calls, 3);
    let value = wait_for("an elapsed 100 ms", Duration::from_secs(5), || {
        (start.elapsed() >= Duration::from_millis(100)).then_some(7)
    });
    assert_eq!(value, 7);
}

#[test]
#[should_panic(expected = "timed out after 200ms: never")]
fn wait_until_panics_at_the_deadline() {
    wait_until("never", Duration::from_millis(200), || false);
}

fn shell(script: &str) -> ChildProcess {
    let mut command = Command::new("sh");
    command.arg("-c").arg(script);
    ChildProcess::spawn("sh", command)
}

#[test]
fn child_process_captures_lines_and_signals() {
    let child = shell("echo one; echo two; echo oops >&2; exec sleep 60");
    let lines = child.wait_for_lines(2, Duration::from_secs(10));
    assert_eq!(lines, ["one", "two"]);
    child.wait_for_stderr("oops", Duration::from_secs(10));
    assert_eq!(child.exit_status(), None);
    child.sigterm();
    let status = child.wait_exit(Duration::from_secs(10));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(nix::sys::signal::Signal::SIGTERM as i32)
    );
}

#[test]
fn child_process_exit_is_complete() {
    let child = shell("for i in 1 2 3; do echo \"{\\\"n\\\":$i}\"; done; echo bye >&2; exit 3");
    let status = child.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(3));
    assert_eq!(child.lines(), [r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":3}"#]);
    assert_eq!(child.line_count(), 3);
    assert_eq!(child.stderr(), "bye\n");
}

#[test]
#[should_panic(expected = "exited (exit status: 0) after 1 of 5 expected stdout lines")]
fn wait_for_lines_fails_fast_when_the_child_exits() {
    let child = shell("echo only");
    child.wait_for_lines(5, Duration::from_secs(30));
}

#[test]
fn child_process_is_killed_on_drop() {
    let child = shell("exec sleep 60");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.pid()).unwrap());
    drop(child);
    assert_eq!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    );
}
