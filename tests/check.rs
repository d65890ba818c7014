//! `outbox-relay check`, the live preflight, on real PostgreSQL clusters and a real
//! Kafka broker: a healthy set-up passes (and the check creates nothing), then each
//! problem is provoked alone (exit 1, the finding names the problem and the fix), then
//! several at once (all reported in one run, the same in `--json`); `--offline` does
//! not connect; no password is ever printed.

use outbox_relay_harness as support;

use std::process::ExitStatus;
use std::time::Duration;

use outbox_relay::pg::sql::QualifiedName;
use outbox_relay::pg::state;
use serde_json::Value;
use support::outbox::{
    cluster_with_app_db, cluster_with_outbox, free_port, stdout_config, PUBLICATION, SLOT, WAIT,
};
use support::relay::run_command;
use support::{KafkaBroker, PgCluster, PgOptions, RelayProcess};

/// A check gives up on Kafka after 10 s; everything else answers at once.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);
/// The relay role's password: it must never appear in any output.
const PASSWORD: &str = "Zq-Secret-77";
const RELAY_HBA: &str = "host all relay 127.0.0.1/32 scram-sha-256";

struct Checked {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Checked {
    fn output(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// `outbox-relay check <extra> --config FILE`.
fn check(config: &str, extra: &[&str]) -> Checked {
    let mut args = vec!["check"];
    args.extend_from_slice(extra);
    let (status, stdout, stderr) = run_command(&args, config, CHECK_TIMEOUT);
    let checked = Checked {
        status,
        stdout,
        stderr,
    };
    assert!(
        !checked.output().contains("panicked"),
        "check panicked:\n{}",
        checked.output()
    );
    assert!(
        !checked.output().contains(PASSWORD),
        "the password was printed:\n{}",
        checked.output()
    );
    checked
}

/// `--json`: the findings, after asserting the output is one JSON array.
fn check_json(config: &str) -> (ExitStatus, Vec<Value>) {
    let checked = check(config, &["--json"]);
    let findings: Vec<Value> = serde_json::from_str(&checked.stdout).unwrap_or_else(|e| {
        panic!(
            "--json output is not a JSON array ({e}):\n{}",
            checked.output()
        )
    });
    for finding in &findings {
        for key in ["id", "status", "message", "fix"] {
            assert!(finding.get(key).is_some(), "no {key:?} in {finding}");
        }
    }
    (checked.status, findings)
}

/// `(status, id)` of each finding of the text output.
fn text_findings(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            match (words.next(), words.next()) {
                (Some(status @ ("ok" | "PROBLEM" | "warning")), Some(id)) => {
                    Some((status.to_lowercase(), id.to_owned()))
                }
                _ => None,
            }
        })
        .collect()
}

/// The check failed (exit 1) with a PROBLEM `id` whose message and fix mention every
/// needle.
#[track_caller]
fn assert_problem(checked: &Checked, id: &str, needles: &[&str]) {
    assert_eq!(
        checked.status.code(),
        Some(1),
        "a problem exits 1:\n{}",
        checked.output()
    );
    let lines: Vec<&str> = checked.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|line| {
            let mut words = line.split_whitespace();
            words.next() == Some("PROBLEM") && words.next() == Some(id)
        })
        .unwrap_or_else(|| panic!("no PROBLEM {id}:\n{}", checked.output()));
    let fix = lines.get(at + 1).copied().unwrap_or_default();
    assert!(
        fix.trim_start().starts_with("fix: "),
        "no fix under {id}:\n{}",
        checked.stdout
    );
    let text = format!("{}\n{fix}", lines[at]);
    for needle in needles {
        assert!(
            text.contains(needle),
            "{id} should mention {needle:?}:\n{text}"
        );
    }
}

/// Only these findings are problems.
#[track_caller]
fn assert_only_problems(checked: &Checked, ids: &[&str]) {
    let problems: Vec<String> = text_findings(&checked.stdout)
        .into_iter()
        .filter(|(status, _)| status == "problem")
        .map(|(_, id)| id)
        .collect();
    assert_eq!(problems, ids, "problems:\n{}", checked.output());
}

/// A cluster with the outbox of `sql/outbox.sql` in database `app` and the role
/// `relay` (LOGIN REPLICATION, password), owning the outbox, with CREATE on the
/// database and on schema public: what the README asks for.
fn relay_cluster(options: PgOptions) -> PgCluster {
    let mut hba = options.hba.clone();
    hba.push(RELAY_HBA.into());
    // PostgreSQL 13 stores new passwords as md5 by default, which scram-sha-256 in
    // pg_hba.conf refuses.
    let mut extra_conf = options.extra_conf.clone();
    extra_conf.push(("password_encryption".into(), "scram-sha-256".into()));
    let pg = cluster_with_outbox(PgOptions {
        hba,
        extra_conf,
        ..options
    });
    pg.client_db("app")
        .batch_execute(&format!(
            "CREATE ROLE relay LOGIN REPLICATION PASSWORD '{PASSWORD}';
             ALTER TABLE public.outbox OWNER TO relay;
             GRANT CREATE ON DATABASE app TO relay;
             GRANT CREATE ON SCHEMA public TO relay;"
        ))
        .expect("creating the relay role");
    pg
}

/// The stdout-sink config of the role `relay`.
fn relay_config(pg: &PgCluster) -> String {
    stdout_config(pg).replace(
        &pg.url("postgres", None, "app"),
        &pg.url("relay", Some(PASSWORD), "app"),
    )
}

/// A stdout config as a Kafka config with `[kafka] brokers` and `extra` appended.
fn with_kafka(config: &str, brokers: &str, extra: &str) -> String {
    format!(
        "{}\n[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"{brokers}\"\n{extra}",
        config.replace("[sink]\ntype = \"stdout\"\n", "")
    )
}

fn exists(pg: &PgCluster, sql: &str) -> bool {
    pg.client_db("app")
        .query_one(&format!("SELECT EXISTS ({sql})"), &[])
        .expect("querying the catalogs")
        .get(0)
}

#[test]
fn a_healthy_setup_passes_and_the_check_changes_nothing() {
    let pg = relay_cluster(PgOptions::default());
    let broker = KafkaBroker::shared();
    let config = with_kafka(
        &relay_config(&pg),
        &broker.bootstrap(),
        "[dead_letter]\ntopic = \"outbox.dead-letter\"\n",
    );
    let checked = check(&config, &[]);
    assert!(checked.status.success(), "healthy:\n{}", checked.output());
    assert!(checked.stdout.contains("no problems"), "{}", checked.stdout);
    let found = text_findings(&checked.stdout);
    for id in [
        "config",
        "postgres.connection",
        "postgres.version",
        "postgres.wal_level",
        "postgres.replication_role",
        "postgres.replication_slots",
        "postgres.wal_senders",
        "outbox.table",
        "outbox.id_column",
        "outbox.payload_column",
        "postgres.publication",
        "postgres.slot",
        "postgres.state_table",
        "kafka.brokers",
        "kafka.topics",
        "kafka.dead_letter",
    ] {
        assert!(
            found
                .iter()
                .any(|(status, found)| found == id && status == "ok"),
            "{id} ok:\n{}",
            checked.stdout
        );
    }
    // The README's role cannot see another walsender's reply_time: a standby could not
    // take over from a silent relay before wal_sender_timeout.
    assert!(
        found
            .iter()
            .any(|(status, found)| found == "postgres.takeover" && status == "warning"),
        "postgres.takeover warning:\n{}",
        checked.stdout
    );
    assert!(
        checked
            .stdout
            .contains("GRANT pg_read_all_stats TO \"relay\""),
        "{}",
        checked.stdout
    );
    // The URL is shown, redacted.
    assert!(
        checked.stdout.contains("postgres://relay:***@127.0.0.1"),
        "{}",
        checked.stdout
    );
    // What the relay would create is announced, not created.
    assert!(checked.stdout.contains("will create"), "{}", checked.stdout);
    assert!(!exists(
        &pg,
        &format!("SELECT 1 FROM pg_publication WHERE pubname = '{PUBLICATION}'")
    ));
    assert!(!exists(
        &pg,
        &format!("SELECT 1 FROM pg_replication_slots WHERE slot_name = '{SLOT}'")
    ));
    assert!(!exists(
        &pg,
        "SELECT 1 FROM pg_class WHERE relname = 'outbox_relay_state'"
    ));
    assert!(support::list_topics(&broker.bootstrap())
        .iter()
        .all(|t| !t.starts_with("outbox")));

    // JSON lists the same findings.
    let (status, json) = check_json(&config);
    assert!(status.success());
    let json_ids: Vec<(String, String)> = json
        .iter()
        .map(|f| {
            (
                f["status"].as_str().unwrap().to_owned(),
                f["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(json_ids, found);

    // With the relay streaming (the slot, publication and record exist now), the
    // check still passes and says the slot is in use.
    let relay = RelayProcess::start(&relay_config(&pg));
    relay.wait_streaming(&pg.url("postgres", None, "app"), SLOT, WAIT);
    let checked = check(&config, &[]);
    assert!(
        checked.status.success(),
        "while streaming:\n{}",
        checked.output()
    );
    assert!(
        checked.stdout.contains("streamed from by pid"),
        "{}",
        checked.stdout
    );
}

#[test]
fn wal_level_replica_is_a_problem() {
    let pg = relay_cluster(PgOptions {
        wal_level: "replica",
        ..PgOptions::default()
    });
    let checked = check(&relay_config(&pg), &[]);
    assert_problem(
        &checked,
        "postgres.wal_level",
        &["replica", "wal_level = logical", "restart PostgreSQL"],
    );
    assert_only_problems(&checked, &["postgres.wal_level"]);
}

#[test]
fn a_role_without_replication_is_a_problem() {
    let pg = relay_cluster(PgOptions::default());
    pg.batch_execute("ALTER ROLE relay NOREPLICATION");
    let checked = check(&relay_config(&pg), &[]);
    assert_problem(
        &checked,
        "postgres.replication_role",
        &["REPLICATION", "ALTER ROLE \"relay\" WITH REPLICATION"],
    );
    assert_only_problems(&checked, &["postgres.replication_role"]);
}

#[test]
fn a_missing_outbox_table_is_a_problem() {
    let pg = cluster_with_app_db();
    let checked = check(&stdout_config(&pg), &[]);
    assert_problem(
        &checked,
        "outbox.table",
        &[
            "public.outbox does not exist",
            "sql/outbox.sql",
            "[outbox] table",
        ],
    );
    assert_only_problems(&checked, &["outbox.table"]);
}

#[test]
fn a_missing_column_and_a_null_able_id_are_problems() {
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox DROP COLUMN payload")
        .unwrap();
    let checked = check(&stdout_config(&pg), &[]);
    assert_problem(
        &checked,
        "outbox.payload_column",
        &["no column \"payload\"", "outbox.payload_column"],
    );
    assert_only_problems(&checked, &["outbox.payload_column"]);

    let pg = cluster_with_app_db();
    pg.client_db("app")
        .batch_execute(
            "CREATE TABLE outbox (id uuid, aggregatetype text NOT NULL, aggregateid text, type text, payload jsonb)",
        )
        .unwrap();
    let checked = check(&stdout_config(&pg), &[]);
    assert_problem(
        &checked,
        "outbox.id_column",
        &[
            "may be NULL",
            "ALTER TABLE \"public\".\"outbox\" ALTER COLUMN \"id\" SET NOT NULL",
        ],
    );
    assert_only_problems(&checked, &["outbox.id_column"]);
}

#[test]
fn a_publication_without_inserts_is_a_problem() {
    let pg = cluster_with_outbox(PgOptions::default());
    pg.client_db("app")
        .batch_execute(&format!(
            "CREATE PUBLICATION {PUBLICATION} FOR TABLE outbox WITH (publish = 'update, delete')"
        ))
        .unwrap();
    let checked = check(&stdout_config(&pg), &[]);
    assert_problem(
        &checked,
        "postgres.publication",
        &["does not publish inserts", "SET (publish = 'insert')"],
    );
    assert_only_problems(&checked, &["postgres.publication"]);
}

#[test]
fn a_partitioned_outbox_published_without_its_root_is_a_problem() {
    let pg = cluster_with_app_db();
    pg.client_db("app")
        .batch_execute(&format!(
            "CREATE TABLE public.outbox (
                 id uuid NOT NULL DEFAULT gen_random_uuid(), aggregatetype varchar(255) NOT NULL,
                 aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb,
                 created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (id, created_at)
             ) PARTITION BY RANGE (created_at);
             CREATE TABLE public.outbox_2026 PARTITION OF public.outbox
                 FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
             CREATE PUBLICATION {PUBLICATION} FOR TABLE public.outbox WITH (publish = 'insert');"
        ))
        .unwrap();
    let checked = check(&stdout_config(&pg), &[]);
    assert_problem(
        &checked,
        "postgres.publication",
        &[
            "partitions' names",
            "ALTER PUBLICATION \"outbox_relay\" SET (publish_via_partition_root = true)",
        ],
    );
    assert_only_problems(&checked, &["postgres.publication"]);
}

#[test]
fn no_free_replication_slot_is_a_problem() {
    let pg = cluster_with_outbox(PgOptions {
        extra_conf: vec![("max_replication_slots".into(), "1".into())],
        ..PgOptions::default()
    });
    pg.client_db("app")
        .batch_execute("SELECT pg_create_logical_replication_slot('someone_else', 'pgoutput')")
        .unwrap();
    let checked = check(&stdout_config(&pg), &[]);
    assert_problem(
        &checked,
        "postgres.replication_slots",
        &["max_replication_slots", "pg_drop_replication_slot"],
    );
    assert_only_problems(&checked, &["postgres.replication_slots"]);
}

#[test]
fn a_lost_slot_record_is_a_problem_with_the_repair_commands() {
    let pg = cluster_with_outbox(PgOptions::default());
    let table = QualifiedName::parse("public.outbox_relay_state").unwrap();
    // What the relay writes when it starts streaming; the slot is gone since.
    pg.client_db("app")
        .batch_execute(&format!(
            "{}; {}; {}",
            state::create_table_sql(&table),
            state::streaming_sql(&table, SLOT, "7"),
            state::acknowledged_sql(&table, SLOT, outbox_relay::Lsn(0x1A2B3C)),
        ))
        .unwrap();
    let checked = check(&stdout_config(&pg), &[]);
    assert_problem(
        &checked,
        "postgres.slot",
        &[
            "does not exist, but this relay streamed from it",
            "0/1A2B3C",
            "slot create --accept-gap --config",
            "backfill --config",
        ],
    );
    assert_only_problems(&checked, &["postgres.slot"]);
}

#[test]
fn an_unreachable_kafka_is_a_problem() {
    let pg = cluster_with_outbox(PgOptions::default());
    let config = with_kafka(
        &stdout_config(&pg),
        &format!("127.0.0.1:{}", free_port()),
        "",
    );
    let checked = check(&config, &[]);
    assert_problem(
        &checked,
        "kafka.brokers",
        &["no answer from the brokers", "[kafka] brokers"],
    );
    assert_only_problems(&checked, &["kafka.brokers"]);
}

#[test]
fn several_problems_are_reported_in_one_run_in_text_and_json() {
    let pg = relay_cluster(PgOptions {
        wal_level: "replica",
        ..PgOptions::default()
    });
    pg.batch_execute("ALTER ROLE relay NOREPLICATION");
    pg.client_db("app")
        .batch_execute("ALTER TABLE outbox DROP COLUMN aggregatetype")
        .unwrap();
    let config = with_kafka(
        &relay_config(&pg),
        &format!("127.0.0.1:{}", free_port()),
        "",
    );
    let expected = [
        "postgres.wal_level",
        "postgres.replication_role",
        "outbox.route_by_column",
        "kafka.brokers",
    ];
    let checked = check(&config, &[]);
    assert_eq!(checked.status.code(), Some(1), "{}", checked.output());
    assert_only_problems(&checked, &expected);
    assert!(
        checked.stdout.contains("4 problem(s)"),
        "{}",
        checked.stdout
    );

    let (status, json) = check_json(&config);
    assert_eq!(status.code(), Some(1));
    let problems: Vec<&str> = json
        .iter()
        .filter(|f| f["status"] == "problem")
        .map(|f| f["id"].as_str().unwrap())
        .collect();
    assert_eq!(problems, expected);
    assert!(json
        .iter()
        .filter(|f| f["status"] == "problem")
        .all(|f| f["fix"].as_str().is_some_and(|fix| !fix.is_empty())));
}

#[test]
fn offline_does_not_connect() {
    // Nothing listens on this port: a live check fails, an offline one passes.
    let url = format!("postgres://relay:{PASSWORD}@127.0.0.1:{}/app", free_port());
    let config = format!(
        "[postgres]\nurl = \"{url}\"\n[sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"127.0.0.1:{}\"\n",
        free_port()
    );
    let checked = check(&config, &["--offline"]);
    assert!(checked.status.success(), "{}", checked.output());
    assert!(checked.stderr.contains(": ok"), "{}", checked.output());
    let (status, json) = {
        let checked = check(&config, &["--offline", "--json"]);
        (
            checked.status,
            serde_json::from_str::<Vec<Value>>(&checked.stdout).unwrap(),
        )
    };
    assert!(status.success());
    assert_eq!(json.len(), 1, "{json:?}");
    assert_eq!(json[0]["id"], "config");

    let checked = check(&config, &[]);
    assert_problem(
        &checked,
        "postgres.connection",
        &[
            "cannot connect",
            "postgres://relay:***@127.0.0.1",
            "check host and port",
        ],
    );
}

/// A password equal to the user name, the database name, or a part of the state
/// table's name: the report shows those names as they are (a report built by
/// find-and-replace printed `as "***"` and `"public"."outbox_***_state"`, telling the
/// password and breaking the fixes).
#[test]
fn a_password_equal_to_a_name_leaves_the_names_whole() {
    let pg = relay_cluster(PgOptions::default());
    for password in ["relay", "app", "state"] {
        pg.client_db("app")
            .batch_execute(&format!("ALTER ROLE relay PASSWORD '{password}'"))
            .expect("setting the password");
        let config = stdout_config(&pg).replace(
            &pg.url("postgres", None, "app"),
            &pg.url("relay", Some(password), "app"),
        );
        let checked = check(&config, &[]);
        assert!(checked.status.success(), "healthy:\n{}", checked.output());
        let text = &checked.stdout;
        assert!(text.contains("as \"relay\""), "{text}");
        assert!(text.contains("/app as"), "{text}");
        assert!(text.contains("outbox_relay_state"), "{text}");
        // The only stars are the URL's password.
        assert_eq!(text.matches("***").count(), 1, "{text}");
        assert!(text.contains("postgres://relay:***@127.0.0.1"), "{text}");
    }
}

#[test]
fn a_wrong_password_is_reported_without_printing_it() {
    let pg = relay_cluster(PgOptions::default());
    let config = relay_config(&pg).replace(PASSWORD, "Wr0ng-Secret-99");
    let checked = check(&config, &[]);
    assert_problem(
        &checked,
        "postgres.connection",
        &["authentication failed", "password"],
    );
    assert!(
        !checked.output().contains("Wr0ng-Secret-99"),
        "{}",
        checked.output()
    );
    let (_, json) = check_json(&config);
    assert!(!serde_json::to_string(&json)
        .unwrap()
        .contains("Wr0ng-Secret-99"));
}
