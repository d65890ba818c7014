//! Configuration from the environment, and secrets kept out of every message, through
//! the binary: `outbox-relay check` and `outbox-relay run` on inputs that used to print
//! a password back (a bad percent-escape, an unescaped '/', a TOML error's snippet of
//! the file, librdkafka's configuration errors), then overrides end to end: a nearly
//! empty file plus `OUTBOX_RELAY__*` variables and a password file streaming from a
//! real PostgreSQL.
//!
//! Each secret is a distinctive string; the assertions look for it, and for the parts
//! an echo would show, anywhere in stdout and stderr.

use outbox_relay_harness as support;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use support::outbox::{cluster_with_outbox, insert_events, plain, SLOT, WAIT};
use support::relay::relay_bin;
use support::{PgOptions, RelayProcess};

/// Exit code of a relay that stopped on a definite error (a panic would be 101).
const EXIT_FAILURE: i32 = 1;
/// A relay refusing its configuration does so at once.
const CONFIG_EXIT: Duration = Duration::from_secs(20);

/// A config file in its own temp dir.
struct ConfigFile {
    path: PathBuf,
    dir: tempfile::TempDir,
}

impl ConfigFile {
    fn new(toml: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-config-env-")
            .tempdir()
            .expect("creating temp dir");
        let path = dir.path().join("relay.toml");
        std::fs::write(&path, toml).expect("writing config");
        ConfigFile { path, dir }
    }

    /// A file beside the config holding `content` (a mounted secret).
    fn secret(&self, name: &str, content: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, content).expect("writing a secret file");
        path
    }

    /// `outbox-relay check --offline --config FILE` (the file and the environment, no
    /// connection) with `env` added: (status, stdout, stderr).
    fn check(&self, env: &[(&str, &str)]) -> (ExitStatus, String, String) {
        let output = Command::new(relay_bin())
            .args(["check", "--offline"])
            .arg("--config")
            .arg(&self.path)
            .env("RUST_LOG", "info")
            .env_remove("PGPASSWORD")
            .envs(env.iter().copied())
            .output()
            .expect("running outbox-relay check");
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            plain(&String::from_utf8_lossy(&output.stderr)),
        )
    }
}

/// `outbox-relay run` on `toml` with `env` until it exits by itself.
fn run_to_exit(toml: &str, env: &[(&str, &str)], timeout: Duration) -> (ExitStatus, String) {
    let relay = RelayProcess::start_with_env(toml, env);
    let status = relay.wait_exit(timeout);
    (
        status,
        format!("{}{}", relay.stdout(), plain(&relay.stderr())),
    )
}

#[track_caller]
fn assert_failed(status: ExitStatus, output: &str) {
    assert_eq!(
        status.code(),
        Some(EXIT_FAILURE),
        "expected exit code {EXIT_FAILURE}, got {status}; output:\n{output}"
    );
    assert!(
        !output.contains("panicked"),
        "the relay panicked:\n{output}"
    );
}

/// Panics if any of `secrets` appears in `output`.
#[track_caller]
fn assert_hidden(output: &str, secrets: &[&str]) {
    for secret in secrets {
        assert!(
            !output.contains(secret),
            "the secret {secret:?} is printed:\n{output}"
        );
    }
}

#[track_caller]
fn assert_mentions(output: &str, needles: &[&str]) {
    for needle in needles {
        assert!(
            output.contains(needle),
            "expected the message to mention {needle:?}; got:\n{output}"
        );
    }
}

/// `check` and `run` both refuse `toml` (before connecting anywhere: the address is
/// closed) without printing `secrets`, saying `needles`.
#[track_caller]
fn refused_without_secrets(toml: &str, env: &[(&str, &str)], secrets: &[&str], needles: &[&str]) {
    let file = ConfigFile::new(toml);
    let (status, stdout, stderr) = file.check(env);
    let output = format!("{stdout}{stderr}");
    assert_failed(status, &output);
    assert_hidden(&output, secrets);
    assert_mentions(&output, needles);
    let (status, output) = run_to_exit(toml, env, CONFIG_EXIT);
    assert_failed(status, &output);
    assert_hidden(&output, secrets);
    assert_mentions(&output, needles);
}

fn stdout_config_with_url(url: &str) -> String {
    format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{SLOT}\"\n\
         [outbox]\ntable = \"public.outbox\"\n[sink]\ntype = \"stdout\"\n"
    )
}

// ---------------------------------------------------------------------------------
// Secrets in messages
// ---------------------------------------------------------------------------------

#[test]
fn a_password_with_a_bad_percent_escape_is_not_printed_back() {
    refused_without_secrets(
        &stdout_config_with_url("postgres://relay:Zq%zzSecret5@127.0.0.1:1/app"),
        &[],
        &["Zq%zzSecret5", "zzSecret5", "Secret5"],
        &["postgres.url", "bad percent-escape in the password", "%25"],
    );
}

#[test]
fn an_unescaped_slash_in_the_password_is_named_without_echoing_it() {
    for url in [
        "postgres://relay:Zq/Secret5@127.0.0.1/app",
        "postgres://relay:Zq?Secret5@127.0.0.1/app",
    ] {
        refused_without_secrets(
            &stdout_config_with_url(url),
            &[],
            &["Zq", "Secret5"],
            &[
                "postgres.url",
                "percent-encode the user name and password",
                "%2F",
            ],
        );
    }
}

#[test]
fn a_toml_error_on_the_url_line_gives_line_and_key_without_the_line() {
    // An unterminated string holding the URL's password.
    refused_without_secrets(
        "[postgres]\nurl = \"postgres://relay:Zq-url-Secret5@127.0.0.1:1/app\n",
        &[],
        &["Zq-url-Secret5", "relay:Zq"],
        &["line 2", "key url", "relay.toml"],
    );
}

#[test]
fn a_toml_error_on_a_kafka_secret_line_gives_line_and_key_without_the_line() {
    // A librdkafka secret with garbage after its value.
    refused_without_secrets(
        "[postgres]\nurl = \"postgres://relay@127.0.0.1:1/app\"\n[sink]\ntype = \"kafka\"\n\
         [kafka]\nbrokers = \"127.0.0.1:1\"\n[kafka.properties]\n\"sasl.password\" = \"Zq-sasl-Secret5\" x\n",
        &[],
        &["Zq-sasl-Secret5"],
        &["line 8", "key \"sasl.password\""],
    );
}

#[test]
fn a_string_where_a_table_belongs_is_not_quoted_back() {
    // A well-formed file of the wrong shape: serde's message quotes the string.
    refused_without_secrets(
        "[postgres]\nurl = \"postgres://relay@127.0.0.1:1/app\"\n[sink]\ntype = \"kafka\"\n\
         [kafka]\nbrokers = \"127.0.0.1:1\"\nproperties = \"sasl.password=Zq-shape-Secret5\"\n",
        &[],
        &["Zq-shape-Secret5"],
        &["kafka.properties (line 7", "expected a map"],
    );
}

fn kafka_config_with_properties(url: &str, properties: &str) -> String {
    format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{SLOT}\"\n[outbox]\ntable = \"public.outbox\"\n\
         [sink]\ntype = \"kafka\"\n[kafka]\nbrokers = \"127.0.0.1:1\"\n\
         [kafka.properties]\n{properties}"
    )
}

#[test]
fn librdkafka_configuration_errors_do_not_echo_property_values() {
    // A misspelled secret property (librdkafka knows no such property) and
    // ssl.key.password (a build without OpenSSL refuses it): rdkafka's error text
    // appends the value.
    let typo = "\"sasl.passwrod\" = \"Zq-typo-Secret5\"\n";
    let key = "\"ssl.key.password\" = \"Zq-key-Secret5\"\n";

    // `run` against a real PostgreSQL: the producer is built, and failed with the
    // value in its message, only after connecting.
    let pg = cluster_with_outbox(PgOptions::default());
    let url = pg.url("postgres", None, "app");
    let (status, output) = run_to_exit(
        &kafka_config_with_properties(&url, &format!("{typo}{key}")),
        &[],
        WAIT,
    );
    assert_failed(status, &output);
    assert_hidden(&output, &["Zq-typo-Secret5", "Zq-key-Secret5"]);
    assert_mentions(&output, &["sasl.passwrod"]);

    // `check` refuses the misspelled property before anything connects.
    let (status, stdout, stderr) = ConfigFile::new(&kafka_config_with_properties(
        "postgres://u@127.0.0.1:1/app",
        typo,
    ))
    .check(&[]);
    let output = format!("{stdout}{stderr}");
    assert_failed(status, &output);
    assert_hidden(&output, &["Zq-typo-Secret5"]);
    assert_mentions(
        &output,
        &[
            "kafka.properties.\"sasl.passwrod\"",
            "No such configuration property",
        ],
    );
    // ssl.key.password: refused where librdkafka is built without OpenSSL (with the
    // reason), accepted where it has it; never printed either way.
    let (status, stdout, stderr) = ConfigFile::new(&kafka_config_with_properties(
        "postgres://u@127.0.0.1:1/app",
        key,
    ))
    .check(&[]);
    let output = format!("{stdout}{stderr}");
    assert_hidden(&output, &["Zq-key-Secret5"]);
    if !status.success() {
        assert_mentions(&output, &["kafka.properties.\"ssl.key.password\""]);
    }
}

// ---------------------------------------------------------------------------------
// Overrides from the environment
// ---------------------------------------------------------------------------------

#[test]
fn a_nearly_empty_file_and_the_environment_pass_check() {
    let file = ConfigFile::new("# the rest comes from the environment\n");
    let kafka_secret = file.secret("kafka-password", "Zq-file-Secret5\n");
    let kafka_secret = kafka_secret.to_str().expect("a UTF-8 temp path");
    let env = [
        (
            "OUTBOX_RELAY__POSTGRES__URL",
            "postgres://relay@db.internal/app",
        ),
        ("OUTBOX_RELAY__POSTGRES__PASSWORD", "Zq-env-Secret5"),
        ("OUTBOX_RELAY__SINK__TYPE", "kafka"),
        ("OUTBOX_RELAY__KAFKA__BROKERS", "k1:9092,k2:9092"),
        ("OUTBOX_RELAY__KAFKA__TOPIC_PARTITIONS", "3"),
        ("OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_USERNAME", "relay"),
        (
            "OUTBOX_RELAY__KAFKA__PROPERTY_FILES__SASL_PASSWORD",
            kafka_secret,
        ),
        (
            "OUTBOX_RELAY__OUTBOX__ADDITIONAL",
            "[\"type:header:eventType\"]",
        ),
        ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "5000"),
    ];
    let (status, stdout, stderr) = file.check(&env);
    let output = format!("{stdout}{stderr}");
    assert!(status.success(), "{output}");
    assert_mentions(&output, &["relay.toml: ok", "OUTBOX_RELAY__KAFKA__BROKERS"]);
    assert_hidden(&output, &["Zq-env-Secret5", "Zq-file-Secret5"]);
    // Without the variables, the file alone says what is missing and where it may come from.
    let (status, _, stderr) = file.check(&[]);
    assert_failed(status, &stderr);
    assert_mentions(
        &stderr,
        &["missing field `postgres`", "OUTBOX_RELAY__POSTGRES__"],
    );
}

#[test]
fn environment_variables_that_name_no_key_or_carry_a_bad_value_are_refused_by_name() {
    let file = "[postgres]\nurl = \"postgres://relay@127.0.0.1:1/app\"\n";
    refused_without_secrets(
        file,
        &[
            ("OUTBOX_RELAY__POSTGRES__SLOTT", "x"),
            ("OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT", "lots"),
        ],
        &[],
        &[
            "OUTBOX_RELAY__POSTGRES__SLOTT: [postgres] has no key \"slott\"",
            "slot",
            "OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT (relay.max_in_flight): \"lots\" is not an integer",
        ],
    );
    // A secret set from the environment is as hidden as one from the file, and the
    // message names the variable to fix.
    refused_without_secrets(
        file,
        &[(
            "OUTBOX_RELAY__POSTGRES__URL",
            "postgres://relay:Zq/Secret5@127.0.0.1:1/app",
        )],
        &["Zq", "Secret5"],
        &["postgres.url (set by OUTBOX_RELAY__POSTGRES__URL)", "%2F"],
    );
}

/// A cluster where `alice` logs in with a SCRAM password only.
fn scram_cluster(password: &str) -> support::PgCluster {
    let pg = cluster_with_outbox(PgOptions {
        hba: vec!["host all alice 127.0.0.1/32 scram-sha-256".into()],
        ..PgOptions::default()
    });
    pg.client_db("app")
        .batch_execute(&format!(
            "SET password_encryption = 'scram-sha-256';
             CREATE ROLE alice LOGIN REPLICATION PASSWORD '{password}';
             GRANT SELECT ON outbox TO alice;
             GRANT CREATE ON SCHEMA public TO alice;
             CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert');"
        ))
        .unwrap();
    pg
}

#[test]
fn a_relay_configured_from_the_environment_streams_with_a_password_file() {
    let password = "Zq-right-Secret5";
    let pg = scram_cluster(password);
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = dir.path().join("pg-password");
    // As `echo "$PASSWORD" > file` or a Kubernetes Secret written by hand leaves it.
    std::fs::write(&secret, format!("{password}\n")).expect("writing the password file");
    let url = pg.url("alice", None, "app");
    let env = [
        ("OUTBOX_RELAY__POSTGRES__URL", url.as_str()),
        ("OUTBOX_RELAY__POSTGRES__PASSWORD_FILE", path_str(&secret)),
        ("OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS", "200"),
        ("OUTBOX_RELAY__OUTBOX__TABLE", "public.outbox"),
        // The password file comes before libpq's variable.
        ("PGPASSWORD", "wrong-pgpassword"),
    ];
    let relay = RelayProcess::start_with_env("[sink]\ntype = \"stdout\"\n", &env);
    relay.wait_streaming(&pg.url("postgres", None, "app"), SLOT, WAIT);
    let ids = insert_events(&pg, "order", 2);
    let lines = relay.wait_for_lines(2, WAIT);
    for id in &ids {
        assert!(
            lines.iter().any(|line| line.contains(id.as_str())),
            "{lines:?}"
        );
    }
    relay.sigterm();
    relay.wait_exit(WAIT);
    assert_hidden(&plain(&relay.stderr()), &[password]);
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temp path")
}

/// An override with one underscore after the prefix (`OUTBOX_RELAY_POSTGRES__SLOT`)
/// would be ignored, the relay running on the file's value: `check` and `run` refuse it
/// naming the right spelling. Tooling variables with the prefix (`OUTBOX_RELAY_BIN`,
/// `OUTBOX_RELAY_KAFKA_LIBS`) name no key and stay allowed.
#[test]
fn an_override_with_one_underscore_after_the_prefix_is_refused() {
    let toml = stdout_config_with_url("postgres://relay@127.0.0.1:9/app");
    for (variable, right) in [
        (
            "OUTBOX_RELAY_POSTGRES__SLOT",
            "OUTBOX_RELAY__POSTGRES__SLOT",
        ),
        (
            "OUTBOX_RELAY_RELAY_MAX_IN_FLIGHT",
            "OUTBOX_RELAY__RELAY__MAX_IN_FLIGHT",
        ),
    ] {
        refused_without_secrets(
            &toml,
            &[(variable, "5")],
            &[],
            &[variable, "one underscore", right],
        );
    }
    let file = ConfigFile::new(&toml);
    let (status, stdout, stderr) = file.check(&[
        ("OUTBOX_RELAY_BIN", "/not/an/override"),
        ("OUTBOX_RELAY_KAFKA_LIBS", "/not/an/override"),
    ]);
    assert!(status.success(), "{stdout}{stderr}");
}
