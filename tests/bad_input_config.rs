//! The bad-input catalogue, part 1: configuration, connection and wire problems.
//!
//! Each case feeds the relay one kind of bad input and asserts both the outcome (exit
//! status, retry, nothing acknowledged) and that the message says what is wrong and how
//! to fix it. Messages are matched on key phrases, never as whole strings. Part 2
//! (`bad_input_data.rs`) covers bad rows on the Kafka and stdout sinks.
//!
//! Truncated and garbage replication frames and pgoutput messages are unit-tested next
//! to the decoders (`src/pg/replication.rs`, `src/pg/pgoutput_tests.rs`, fuzz targets);
//! here only a whole server that speaks garbage is tried.

use outbox_relay_harness as support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use outbox_relay::metrics::RESTARTS_TOTAL;
use support::outbox::{
    cluster_with_app_db, cluster_with_outbox, metric, plain, stdout_config, with_metrics, SLOT,
    WAIT,
};
use support::relay::relay_bin;
use support::{run_relay_to_exit, wait_for, PgCluster, PgOptions, RelayProcess};

/// Exit code of a relay that stopped on a definite error (a panic would be 101).
const EXIT_FAILURE: i32 = 1;
/// A relay refusing its configuration does so at once.
const CONFIG_EXIT: Duration = Duration::from_secs(20);
/// The message the pipeline logs before each retry.
const RETRY_WARNING: &str = outbox_relay::relay::log::RETRYING;

/// Panics unless `text` contains every needle, quoting the text.
#[track_caller]
fn assert_mentions(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            text.contains(needle),
            "expected the message to mention {needle:?}; got:\n{text}"
        );
    }
}

/// The line the relay prints last when it stops: `error: …`.
fn final_error(stderr: &str) -> &str {
    stderr
        .lines()
        .rev()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("no final `error: ` line in:\n{stderr}"))
}

#[track_caller]
fn assert_failed(status: ExitStatus, stderr: &str) {
    assert_eq!(
        status.code(),
        Some(EXIT_FAILURE),
        "expected exit code {EXIT_FAILURE} (a definite error, no panic), got {status}; stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "the relay panicked:\n{stderr}"
    );
}

/// A config file in its own temp dir, for `outbox-relay check`.
struct ConfigFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl ConfigFile {
    fn new(toml: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-bad-input-")
            .tempdir()
            .expect("creating temp dir");
        let path = dir.path().join("relay.toml");
        std::fs::write(&path, toml).expect("writing config");
        ConfigFile { path, _dir: dir }
    }

    /// `outbox-relay check --offline --config FILE` (the file alone, no connection):
    /// (status, stdout, stderr).
    fn check(&self) -> (ExitStatus, String, String) {
        let output = Command::new(relay_bin())
            .args(["check", "--offline"])
            .arg("--config")
            .arg(&self.path)
            .env("RUST_LOG", "info")
            .output()
            .expect("running outbox-relay check");
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            plain(&String::from_utf8_lossy(&output.stderr)),
        )
    }
}

/// Both `check` and `run` refuse `toml`, before connecting anywhere; returns the
/// stderr of `check` after asserting that `run` says the same.
#[track_caller]
fn refused_by_check_and_run(toml: &str, needles: &[&str]) -> String {
    let (status, stdout, stderr) = ConfigFile::new(toml).check();
    assert_failed(status, &stderr);
    assert!(
        stdout.is_empty(),
        "check prints problems on stderr: {stdout}"
    );
    assert_mentions(&stderr, needles);
    let (status, stdout, run_stderr) = run_relay_to_exit(toml, CONFIG_EXIT);
    let run_stderr = plain(&run_stderr);
    assert_failed(status, &run_stderr);
    assert!(stdout.is_empty(), "no events: {stdout}");
    assert_mentions(&run_stderr, needles);
    assert!(
        !run_stderr.contains(outbox_relay::relay::log::STARTING_REPLICATION)
            && !run_stderr.contains(RETRY_WARNING),
        "a bad config is refused before connecting:\n{run_stderr}"
    );
    stderr
}

fn stdout_config_with_url(url: &str) -> String {
    format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{SLOT}\"\nstatus_interval_ms = 200\n\
         [outbox]\ntable = \"public.outbox\"\n[sink]\ntype = \"stdout\"\n"
    )
}

/// Runs the relay until it exits by itself; stderr without colours.
fn run_to_exit(config: &str) -> (ExitStatus, String, String) {
    let (status, stdout, stderr) = run_relay_to_exit(config, WAIT);
    (status, stdout, plain(&stderr))
}

// ---------------------------------------------------------------------------------
// Configuration file
// ---------------------------------------------------------------------------------

#[test]
fn unknown_key_is_refused_naming_it_and_the_valid_keys() {
    let toml = "[postgres]\nurl = \"postgres://relay@127.0.0.1:5432/app\"\nslott = \"x\"\n";
    let stderr = refused_by_check_and_run(
        toml,
        &[
            "unknown field `slott`",
            // How to fix it: the key it should have been, and where.
            "`slot`",
            "line 3",
        ],
    );
    assert!(stderr.contains("relay.toml"), "names the file: {stderr}");
}

#[test]
fn missing_postgres_url_is_refused_naming_the_field_and_section() {
    refused_by_check_and_run(
        "[postgres]\nslot = \"outbox_relay\"\n",
        &["missing field `url`", "[postgres]"],
    );
}

#[test]
fn non_postgres_url_is_refused_with_the_expected_form_and_no_password() {
    let stderr = refused_by_check_and_run(
        "[postgres]\nurl = \"mysql://relay:s3cret-pw@127.0.0.1:3306/app\"\n",
        &[
            "postgres.url",
            "must start with postgres://",
            "postgres://user:password@host:port/dbname",
        ],
    );
    assert!(!stderr.contains("s3cret-pw"), "password echoed:\n{stderr}");
}

#[test]
fn url_with_bad_port_is_refused_naming_the_port_and_no_password() {
    let stderr = refused_by_check_and_run(
        "[postgres]\nurl = \"postgres://relay:s3cret-pw@127.0.0.1:99999/app\"\n",
        &["postgres.url", "port \"99999\"", "1 to 65535"],
    );
    assert!(!stderr.contains("s3cret-pw"), "password echoed:\n{stderr}");
}

#[test]
fn every_config_problem_is_listed_at_once_with_its_key() {
    let toml = "[postgres]\nurl = \"postgres://relay@127.0.0.1/app\"\nslot = \"Bad-Slot\"\n\
                [sink]\ntype = \"kafka\"\n\
                [kafka]\nbrokers = \"127.0.0.1:9092\"\ntopic_partitions = 0\n\
                [kafka.properties]\n\"acks\" = \"1\"\n\
                [relay]\nmax_in_flight = 0\n";
    refused_by_check_and_run(
        toml,
        &[
            "problem(s)",
            "postgres.slot",
            "lower case letters, digits and underscores",
            "kafka.topic_partitions",
            "kafka.properties.\"acks\"",
            "must stay \"all\"",
            "relay.max_in_flight",
        ],
    );
}

/// `[kafka]` (and `[dead_letter]`) without `[sink]`: the sink would be stdout, printing
/// the events and acknowledging them while Kafka's consumers wait; refused, saying how
/// to fix it.
#[test]
fn a_kafka_section_on_the_stdout_sink_is_refused() {
    refused_by_check_and_run(
        "[postgres]\nurl = \"postgres://relay@127.0.0.1:9/app\"\n\
         [kafka]\nbrokers = \"127.0.0.1:9092\"\n[dead_letter]\ntopic = \"dead\"\n",
        &[
            "a [kafka] section is set but the sink is stdout",
            "[sink] type = \"kafka\"",
            "remove the [kafka] section",
        ],
    );
}

/// A secret of every TOML type in every secret-bearing key, from the file and from the
/// environment: `check` and `run` refuse it naming the key, never the value (serde
/// quotes integers, floats and booleans in its type errors).
#[test]
fn a_secret_of_any_type_is_refused_without_its_value() {
    let values = [
        "87654321",
        "8765.4321",
        "true",
        "[\"Zq-secret-a\"]",
        "{ zq = \"Zq-secret-t\" }",
    ];
    let url = "url = \"postgres://relay@127.0.0.1:9/app\"\n";
    for value in values {
        for (toml, key) in [
            (format!("[postgres]\nurl = {value}\n"), "postgres.url"),
            (
                format!("[postgres]\n{url}password = {value}\n"),
                "postgres.password",
            ),
            (
                format!(
                    "[postgres]\n{url}[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"127.0.0.1:9\"\n\
                     [kafka.properties]\n\"sasl.password\" = {value}\n"
                ),
                "kafka.properties.\"sasl.password\"",
            ),
        ] {
            let stderr = refused_by_check_and_run(&toml, &[key, "must be a string"]);
            for secret in ["8765", "Zq-secret", "true"] {
                assert!(
                    !stderr.contains(secret),
                    "{secret} of {toml} echoed:\n{stderr}"
                );
            }
        }
    }
    // From the environment a value is a string (secret keys take text as it is), so
    // nothing is refused for its type; a bad URL there is refused without its text.
    let file = ConfigFile::new("[outbox]\ntable = \"public.outbox\"\n");
    let output = Command::new(relay_bin())
        .args(["check", "--offline", "--config"])
        .arg(&file.path)
        .env(
            "OUTBOX_RELAY__POSTGRES__URL",
            "mysql://relay:87654321@h/app",
        )
        .env("OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_PASSWORD", "87654321")
        .output()
        .expect("running outbox-relay check");
    let stderr = plain(&String::from_utf8_lossy(&output.stderr));
    assert_failed(output.status, &stderr);
    assert_mentions(&stderr, &["postgres.url", "OUTBOX_RELAY__POSTGRES__URL"]);
    assert!(!stderr.contains("8765"), "secret echoed:\n{stderr}");
}

/// A Kafka sink config on an address nothing listens on (a refused config never
/// connects), with `extra` appended.
fn kafka_config_with(extra: &str) -> String {
    format!(
        "[postgres]\nurl = \"postgres://relay@127.0.0.1:1/app\"\n\
         [sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"127.0.0.1:1\"\n{extra}"
    )
}

/// Settings that let librdkafka give up on events by itself (a message timeout, fewer
/// retries, acks short of all, a transactional producer) are refused under every name
/// librdkafka accepts for them, aliases and `topic.` prefixes included, naming the key
/// as written and why. Before, `"request.required.acks" = "1"` passed `check` and then
/// started or failed at random (two names of one property, applied in hash order).
#[test]
fn kafka_properties_that_let_librdkafka_give_up_are_refused_under_every_name() {
    for (key, value, why) in [
        (
            "message.timeout.ms",
            "3000",
            "gives up on events during a broker outage",
        ),
        (
            "delivery.timeout.ms",
            "3000",
            "gives up on events during a broker outage",
        ),
        (
            "topic.message.timeout.ms",
            "3000",
            "gives up on events during a broker outage",
        ),
        ("request.required.acks", "1", "must stay \"all\""),
        ("topic.acks", "1", "must stay \"all\""),
        ("retries", "3", "unlimited"),
        ("transactional.id", "relay", "transactions"),
    ] {
        let stderr = refused_by_check_and_run(
            &kafka_config_with(&format!("[kafka.properties]\n\"{key}\" = \"{value}\"\n")),
            &[
                &format!("kafka.properties.\"{key}\""),
                why,
                "remove the key",
            ],
        );
        // The same configuration gives the same answer every time.
        let problems = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|line| line.trim_start().starts_with("- "))
                .map(str::to_owned)
                .collect()
        };
        for _ in 0..3 {
            let (status, _, again) = ConfigFile::new(&kafka_config_with(&format!(
                "[kafka.properties]\n\"{key}\" = \"{value}\"\n"
            )))
            .check();
            assert_failed(status, &again);
            assert_eq!(problems(&again), problems(&stderr), "deterministic");
        }
    }
    // No timeout is what the relay sets itself; saying so explicitly is fine.
    let (status, _, stderr) = ConfigFile::new(&kafka_config_with(
        "[kafka.properties]\n\"message.timeout.ms\" = \"0\"\n\"acks\" = \"all\"\n",
    ))
    .check();
    assert!(status.success(), "accepted:\n{stderr}");
}

/// Two names of one librdkafka property with different values would race: refused.
#[test]
fn two_names_of_one_kafka_property_are_refused_naming_both() {
    refused_by_check_and_run(
        &kafka_config_with(
            "[kafka.properties]\n\"linger.ms\" = \"5\"\n\"queue.buffering.max.ms\" = \"50\"\n",
        ),
        &[
            "\"linger.ms\"",
            "\"queue.buffering.max.ms\"",
            "same librdkafka property",
            "keep one",
        ],
    );
}

/// A constant topic template equal to the dead-letter topic would send every event
/// where dead letters go.
#[test]
fn a_constant_topic_equal_to_the_dead_letter_topic_is_refused() {
    refused_by_check_and_run(
        &kafka_config_with("[dead_letter]\ntopic = \"events\"\n")
            .replace("[sink]", "[outbox]\ntopic = \"events\"\n[sink]"),
        &["outbox.topic", "\"events\"", "dead_letter.topic"],
    );
}

// ---------------------------------------------------------------------------------
// Connecting
// ---------------------------------------------------------------------------------

#[test]
fn unreachable_host_is_retried_with_backoff_naming_address_and_cause() {
    // Port 1 on the loopback: nothing listens there, the connection is refused at once.
    let (config, port) = with_metrics(&stdout_config_with_url(
        "postgres://postgres@127.0.0.1:1/app",
    ));
    let relay = RelayProcess::start(&config);
    // Two retries prove it keeps going (with backoff) rather than giving up.
    relay.wait_metric(port, RESTARTS_TOTAL, "two retries", WAIT, |n| n >= 2);
    assert_eq!(relay.exit_status(), None, "still retrying");
    let stderr = plain(&relay.stderr());
    let warning = stderr
        .lines()
        .find(|line| line.contains(RETRY_WARNING))
        .expect("a retry warning");
    assert_mentions(
        warning,
        &["WARN", "127.0.0.1:1", "Connection refused", "retry_in_ms="],
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    relay.kill9();
}

/// A listener that accepts TCP connections (the kernel completes the handshake) and
/// never says a word: a hung server, the local stand-in for a blackholed address.
#[test]
fn connect_timeout_in_the_url_bounds_a_silent_server() {
    let silent = TcpListener::bind("127.0.0.1:0").expect("binding a silent listener");
    let addr = silent.local_addr().expect("local address");
    let started = Instant::now();
    let relay = RelayProcess::start(&stdout_config_with_url(&format!(
        "postgres://postgres@{addr}/app?connect_timeout=1"
    )));
    let needle = format!("timed out after 1 s connecting to PostgreSQL at {addr}");
    relay.wait_for_stderr(&needle, Duration::from_secs(30));
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(8),
        "connect_timeout=1 honoured (the default is 10 s): first timeout after {elapsed:?}"
    );
    // Retryable: the relay tries again rather than exiting.
    wait_for("a second timeout", WAIT, || {
        (plain(&relay.stderr()).matches(&needle).count() >= 2).then_some(())
    });
    assert_eq!(relay.exit_status(), None, "still retrying");
    let stderr = plain(&relay.stderr());
    assert!(stderr.contains(RETRY_WARNING), "{stderr}");
    relay.kill9();
    drop(silent);
}

fn scram_cluster() -> PgCluster {
    let pg = cluster_with_outbox(PgOptions {
        hba: vec!["host all alice 127.0.0.1/32 scram-sha-256".into()],
        ..PgOptions::default()
    });
    pg.client_db("app")
        .batch_execute(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE alice LOGIN REPLICATION PASSWORD 'right';
             GRANT SELECT ON outbox TO alice;
             CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert');",
        )
        .unwrap();
    pg
}

#[test]
fn wrong_password_stops_saying_authentication_failed_and_where_to_fix_it() {
    let pg = scram_cluster();
    let (status, stdout, stderr) = run_to_exit(&stdout_config(&pg).replace(
        &pg.url("postgres", None, "app"),
        &pg.url("alice", Some("wrong-pw"), "app"),
    ));
    assert_failed(status, &stderr);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(!stderr.contains(RETRY_WARNING), "not retried:\n{stderr}");
    assert!(!stderr.contains("wrong-pw"), "password echoed:\n{stderr}");
    // What: whose authentication failed. How to fix: where the password comes from.
    assert_mentions(&stderr, &["authentication failed", "\"alice\""]);
    assert!(
        stderr.contains("[postgres] url") || stderr.contains("postgres.url"),
        "says where the password is configured:\n{stderr}"
    );
    assert!(stderr.contains("PGPASSWORD"), "{stderr}");
}

#[test]
fn missing_database_stops_naming_it_and_the_url() {
    let pg = PgCluster::start();
    let (status, stdout, stderr) = run_to_exit(&stdout_config_with_url(&pg.url(
        "postgres",
        None,
        "no_such_db",
    )));
    assert_failed(status, &stderr);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(!stderr.contains(RETRY_WARNING), "not retried:\n{stderr}");
    assert_mentions(&stderr, &["\"no_such_db\"", "does not exist"]);
    assert!(
        stderr.contains("[postgres] url") || stderr.contains("postgres.url"),
        "says to fix the database name in the url (or create the database):\n{stderr}"
    );
}

#[test]
fn wal_level_replica_stops_saying_set_logical_and_restart() {
    let pg = cluster_with_outbox(PgOptions {
        wal_level: "replica",
        ..PgOptions::default()
    });
    let (status, _stdout, stderr) = run_to_exit(&stdout_config(&pg));
    assert_failed(status, &stderr);
    assert!(!stderr.contains(RETRY_WARNING), "not retried:\n{stderr}");
    assert_mentions(
        &stderr,
        &[
            "wal_level=replica",
            "wal_level=logical",
            "restart PostgreSQL",
        ],
    );
    assert!(
        pg.slot_confirmed_flush_lsn(SLOT).is_none(),
        "no slot created"
    );
}

#[test]
fn role_without_replication_stops_saying_alter_role() {
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute(
            "CREATE ROLE norepl LOGIN;
             GRANT SELECT ON outbox TO norepl;
             CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert');",
        )
        .unwrap();
    let (status, stdout, stderr) = run_to_exit(&stdout_config(&pg).replace(
        &pg.url("postgres", None, "app"),
        &pg.url("norepl", None, "app"),
    ));
    assert_failed(status, &stderr);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(!stderr.contains(RETRY_WARNING), "not retried:\n{stderr}");
    assert_mentions(&stderr, &["replication", "ALTER ROLE", "REPLICATION"]);
    assert!(
        stderr.contains("norepl"),
        "names the role that lacks it:\n{stderr}"
    );
}

#[test]
fn exhausted_replication_slots_stop_saying_raise_or_drop() {
    let pg = cluster_with_outbox(PgOptions {
        extra_conf: vec![("max_replication_slots".into(), "1".into())],
        ..PgOptions::default()
    });
    pg.client_db("app")
        .batch_execute("SELECT pg_create_logical_replication_slot('someone_else', 'pgoutput')")
        .unwrap();
    let (status, _stdout, stderr) = run_to_exit(&stdout_config(&pg));
    assert_failed(status, &stderr);
    assert!(!stderr.contains(RETRY_WARNING), "not retried:\n{stderr}");
    assert_mentions(
        &stderr,
        &[
            SLOT,
            "all replication slots are in use",
            "max_replication_slots",
            "pg_drop_replication_slot",
        ],
    );
    assert!(pg.slot_confirmed_flush_lsn(SLOT).is_none());
    assert!(
        pg.slot_confirmed_flush_lsn("someone_else").is_some(),
        "the other slot is left alone"
    );
}

#[test]
fn missing_outbox_table_stops_naming_it_and_how_to_create_it() {
    let pg = cluster_with_app_db();
    let (status, _stdout, stderr) = run_to_exit(&stdout_config(&pg));
    assert_failed(status, &stderr);
    assert!(!stderr.contains(RETRY_WARNING), "not retried:\n{stderr}");
    assert_mentions(
        &stderr,
        &[
            "public.outbox",
            "does not exist",
            "sql/outbox.sql",
            "[outbox] table",
        ],
    );
}

#[test]
fn missing_payload_column_on_stdout_stops_naming_column_and_setting_unacknowledged() {
    let pg = cluster_with_outbox(PgOptions::default());
    let config = stdout_config(&pg).replace("[outbox]\n", "[outbox]\npayload_column = \"body\"\n");
    let relay = support::outbox::start_streaming(&config);
    pg.client_db("app")
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) \
             VALUES ('order', 'o-1', 'Created', '{\"n\": 1}')",
        )
        .unwrap();
    let after_insert = pg.current_wal_lsn();
    let status = relay.wait_exit(WAIT);
    let stderr = plain(&relay.stderr());
    assert_failed(status, &stderr);
    assert!(
        relay.stdout().is_empty(),
        "the row is not printed without its payload"
    );
    assert_mentions(
        &stderr,
        &[
            "no column \"body\"",
            "outbox.payload_column",
            "add the column or change the setting",
            "[dead_letter]",
        ],
    );
    let confirmed = pg.slot_confirmed_flush_lsn(SLOT).expect("slot exists");
    assert!(
        confirmed < after_insert,
        "the row is not acknowledged ({confirmed:X} >= {after_insert:X})"
    ); // Said once: the reason is not repeated by the error's source chain.
    let error = final_error(&stderr);
    assert_eq!(
        error.matches("no column \"body\"").count(),
        1,
        "the reason is said once:\n{error}"
    );
}

// ---------------------------------------------------------------------------------
// Wire: a server that does not speak PostgreSQL
// ---------------------------------------------------------------------------------

/// Answers every connection's startup packet with bytes from `reply(n)` (n = the
/// connection's number), then closes it.
struct GarbageServer {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl GarbageServer {
    fn start(reply: impl Fn(u64) -> Vec<u8> + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding garbage server");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("local address");
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut served = 0;
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            answer(stream, &reply(served));
                            served += 1;
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
            }
        });
        GarbageServer {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

fn answer(mut stream: TcpStream, reply: &[u8]) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut startup = [0u8; 1024];
    let _ = stream.read(&mut startup);
    let _ = stream.write_all(reply);
    let _ = stream.flush();
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

impl Drop for GarbageServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Pointing `[postgres] url` at an HTTP server by mistake: the reply's first bytes
/// declare a message of over a gigabyte, which must be refused, not allocated.
#[test]
fn http_server_instead_of_postgres_stops_with_a_protocol_error_naming_the_address() {
    let server = GarbageServer::start(|_| {
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
    });
    let started = Instant::now();
    let (status, stdout, stderr) = run_relay_to_exit(
        &stdout_config_with_url(&format!("postgres://postgres@{}/app", server.addr)),
        Duration::from_secs(30),
    );
    let stderr = plain(&stderr);
    assert_failed(status, &stderr);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no hang: {:?}",
        started.elapsed()
    );
    assert_mentions(&stderr, &["protocol"]);
    // Which server, and the likely fix: it is not PostgreSQL.
    assert_mentions(&stderr, &[&server.addr.to_string(), "PostgreSQL"]);
    assert!(
        stderr.contains("[postgres] url") || stderr.contains("postgres.url"),
        "says to check host and port in the url:\n{stderr}"
    );
}

/// An ErrorResponse with no fields at all (no severity, SQLSTATE or message) is not
/// something PostgreSQL sends: it must read as a protocol problem of that server, not
/// as an empty database error.
#[test]
fn empty_error_response_is_reported_as_a_protocol_error_naming_the_address() {
    let server = GarbageServer::start(|_| vec![b'E', 0, 0, 0, 5, 0]);
    let (status, _stdout, stderr) = run_relay_to_exit(
        &stdout_config_with_url(&format!("postgres://postgres@{}/app", server.addr)),
        Duration::from_secs(30),
    );
    let stderr = plain(&stderr);
    assert_failed(status, &stderr);
    let error = final_error(&stderr);
    assert!(!error.contains("(SQLSTATE )"), "an empty error:\n{error}");
    assert_mentions(error, &[&server.addr.to_string(), "protocol"]);
}

/// xorshift64 bytes: reproducible garbage.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// Garbage for connection `n` of run `seed`: raw bytes (whose header mostly declares an
/// absurd length), or well-framed messages (tag, Int32 length, body) with random tags
/// and bodies, or backend tags the startup code knows (authentication, error, parameter
/// status, key data, ready) with random bodies.
fn garbage_reply(seed: u64, n: u64) -> Vec<u8> {
    const KNOWN_TAGS: &[u8] = b"REpostgres_SKZNW";
    let bytes = garbage(seed * 1000 + n, 700);
    let len = [3usize, 9, 64, 700][usize::try_from((seed + n) % 4).unwrap_or(0)];
    match seed % 3 {
        0 => bytes[..len].to_vec(),
        kind => {
            let mut out = Vec::new();
            for (i, body) in bytes[..len].chunks(9).enumerate() {
                let tag = if kind == 1 {
                    body[0]
                } else {
                    KNOWN_TAGS[(i + usize::from(body[0])) % KNOWN_TAGS.len()]
                };
                out.push(tag);
                let declared = u32::try_from(body.len() - 1 + 4).expect("small");
                out.extend_from_slice(&declared.to_be_bytes());
                out.extend_from_slice(&body[1..]);
            }
            out
        }
    }
}

/// Random replies of all sizes and shapes: each either stops the relay with a definite
/// error or makes it retry (the server closes the connection), never a panic or a hang.
#[test]
fn random_bytes_from_the_server_never_panic_or_hang() {
    for seed in 1..=12u64 {
        let server = GarbageServer::start(move |n| garbage_reply(seed, n));
        let (config, port) = with_metrics(&stdout_config_with_url(&format!(
            "postgres://postgres@{}/app?connect_timeout=2",
            server.addr
        )));
        let relay = RelayProcess::start(&config);
        let outcome = wait_for(
            &format!("seed {seed}: an exit or a retry"),
            Duration::from_secs(30),
            || {
                if let Some(status) = relay.exit_status() {
                    return Some(Some(status));
                }
                metric(port, RESTARTS_TOTAL)
                    .is_some_and(|restarts| restarts >= 1)
                    .then_some(None)
            },
        );
        let stderr = plain(&relay.stderr());
        assert!(
            !stderr.contains("panicked"),
            "seed {seed} panicked:\n{stderr}"
        );
        match outcome {
            Some(status) => {
                relay.wait_exit(Duration::from_secs(5));
                let stderr = plain(&relay.stderr());
                assert_failed(status, &stderr);
                assert!(
                    stderr.contains("error: "),
                    "seed {seed}: exits with a message:\n{stderr}"
                );
            }
            None => relay.kill9(),
        }
    }
}
