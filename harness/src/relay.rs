//! The relay binary as a child process: `outbox-relay run --config <file>`, stdout
//! (one JSON event per line) and stderr captured, killed on drop.
//!
//! `RelayProcess` derefs to [`ChildProcess`] for `lines()`, `wait_for_lines()`,
//! `stderr()`, `wait_for_stderr()`, `sigterm()`, `sigint()`, `kill9()`, `wait_exit()`,
//! `pid()` and friends.
//!
//! Tests synchronise on what the relay does, not on what it logs: [`RelayProcess::wait_streaming`]
//! waits until PostgreSQL shows the relay's walsender streaming from the slot, and
//! [`RelayProcess::wait_metric`] until one of the relay's Prometheus metrics reaches a value. Log text is
//! asserted only where it is the product (the message an operator reads).

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};
use tempfile::TempDir;

use super::process::ChildProcess;
use super::wait::poll_until;

/// The binary under test, built by Cargo for integration tests.
pub fn relay_bin() -> std::path::PathBuf {
    crate::relay_bin()
}

/// Env var selecting the relay's `RUST_LOG` in tests (default `info`).
pub const RELAY_TEST_LOG_ENV: &str = "RELAY_TEST_LOG";

pub struct RelayProcess {
    // Declared first so it is killed before its directory is removed.
    process: ChildProcess,
    config_path: PathBuf,
    dir: TempDir,
    /// Taken just before the spawn: a walsender that started later serves this relay.
    spawned_at: SystemTime,
}

impl RelayProcess {
    /// Writes `config_toml` into a fresh temp dir and starts the relay on it.
    pub fn start(config_toml: &str) -> Self {
        Self::start_with_env(config_toml, &[])
    }

    /// Like [`RelayProcess::start`] with extra environment variables for the relay.
    pub fn start_with_env(config_toml: &str, env: &[(&str, &str)]) -> Self {
        Self::start_with_args(config_toml, &[], env)
    }

    /// Like [`RelayProcess::start_with_env`] with global options (`--log-format json`)
    /// before the `run` command.
    pub fn start_with_args(config_toml: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let (dir, config_path) = write_config(config_toml);
        let mut command = Command::new(relay_bin());
        command
            .args(args)
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .env("RUST_LOG", relay_log_filter())
            .envs(env.iter().copied());
        let spawned_at = SystemTime::now();
        let process = ChildProcess::spawn("relay", command);
        RelayProcess {
            process,
            config_path,
            dir,
            spawned_at,
        }
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The relay's working directory (holds the config file; removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until PostgreSQL (reached at `url`) shows this relay streaming from `slot`:
    /// the slot is held by a walsender that started after the relay did, and that
    /// walsender has run `START_REPLICATION` (state `catchup` or `streaming`). From then
    /// on every committed row is in the relay's stream. Panics on timeout, or as soon as
    /// the relay has exited.
    ///
    /// "After the relay started" tells this relay's walsender from one left behind by an
    /// earlier relay on the same slot; it also works when the relay reaches PostgreSQL
    /// through a proxy (the walsender's client is then the proxy, not the relay).
    pub fn wait_streaming(&self, url: &str, slot: &str, timeout: Duration) {
        let spawned_at = self
            .spawned_at
            .duration_since(UNIX_EPOCH)
            .expect("the clock is past 1970")
            .as_secs_f64();
        let mut client: Option<Client> = None;
        let mut last_seen = String::from("nothing yet");
        let streaming = poll_until(timeout, || {
            if let Some(status) = self.exit_status() {
                return Some(Err(status));
            }
            let connection = match client.as_mut() {
                Some(connection) => connection,
                None => match Client::connect(url, NoTls) {
                    Ok(connection) => client.insert(connection),
                    Err(err) => {
                        last_seen = format!("cannot connect to {url}: {err}");
                        return None;
                    }
                },
            };
            match connection.query_opt(
                "SELECT s.active_pid, r.state, r.backend_start >= to_timestamp($2::float8)
                 FROM pg_replication_slots s
                 LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
                 WHERE s.slot_name = $1",
                &[&slot, &spawned_at],
            ) {
                Ok(None) => last_seen = format!("no slot {slot:?}"),
                Ok(Some(row)) => {
                    let pid: Option<i32> = row.get(0);
                    let state: Option<String> = row.get(1);
                    let since_spawn: Option<bool> = row.get(2);
                    let streaming = matches!(state.as_deref(), Some("catchup" | "streaming"));
                    if streaming && since_spawn == Some(true) {
                        return Some(Ok(()));
                    }
                    last_seen = format!(
                        "slot {slot:?} held by pid {pid:?}, walsender state {state:?}, \
                         started after the relay: {since_spawn:?}"
                    );
                }
                Err(err) => {
                    last_seen = format!("querying the slot: {err}");
                    client = None;
                }
            }
            None
        });
        match streaming {
            Some(Ok(())) => {}
            Some(Err(status)) => panic!(
                "the relay exited ({status}) before streaming from slot {slot:?}; stderr tail:\n{}",
                self.stderr_tail()
            ),
            None => panic!(
                "timed out after {timeout:?} waiting for the relay to stream from slot \
                 {slot:?} ({last_seen}); stderr tail:\n{}",
                self.stderr_tail()
            ),
        }
    }

    /// Waits until the relay's metric `name` (a constant of `outbox_relay::metrics`),
    /// served on `127.0.0.1:port` (`[metrics] listen`, see
    /// [`with_metrics`](super::outbox::with_metrics)), satisfies `holds`; returns its
    /// value. Panics on timeout, or as soon as the relay has exited.
    pub fn wait_metric(
        &self,
        port: u16,
        name: &str,
        what: &str,
        timeout: Duration,
        holds: impl Fn(u64) -> bool,
    ) -> u64 {
        let mut last = None;
        let outcome = poll_until(timeout, || {
            if let Some(status) = self.exit_status() {
                return Some(Err(status));
            }
            last = metric(port, name);
            last.filter(|&value| holds(value)).map(Ok)
        });
        match outcome {
            Some(Ok(value)) => value,
            Some(Err(status)) => panic!(
                "the relay exited ({status}) before {name} showed {what}; stderr tail:\n{}",
                self.stderr_tail()
            ),
            None => panic!(
                "timed out after {timeout:?} waiting for {name} to show {what} (last value \
                 {last:?}); stderr tail:\n{}",
                self.stderr_tail()
            ),
        }
    }
}

impl Deref for RelayProcess {
    type Target = ChildProcess;

    fn deref(&self) -> &ChildProcess {
        &self.process
    }
}

/// One value of the relay's Prometheus metrics on `127.0.0.1:port`, `None` while the
/// endpoint does not answer or lacks the metric.
pub fn metric(port: u16, name: &str) -> Option<u64> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
}

/// Runs `outbox-relay <args> --config <file with config_toml>` to its end (a one-shot
/// command such as `slot create` or `backfill`); returns its exit status, stdout and
/// stderr. Panics if it is still running after `timeout`.
pub fn run_command(
    args: &[&str],
    config_toml: &str,
    timeout: Duration,
) -> (ExitStatus, String, String) {
    let (dir, config_path) = write_config(config_toml);
    let mut command = Command::new(relay_bin());
    command
        .args(args)
        .arg("--config")
        .arg(&config_path)
        .current_dir(dir.path())
        .env("RUST_LOG", relay_log_filter());
    let process = ChildProcess::spawn(&format!("relay {}", args.join(" ")), command);
    let status = process.wait_exit(timeout);
    (status, process.stdout(), process.stderr())
}

/// Runs the relay on `config_toml` until it exits by itself; returns its exit status,
/// stdout and stderr. Panics (with the stderr tail) if it is still running after
/// `timeout`. For tests that expect a startup error.
pub fn run_relay_to_exit(config_toml: &str, timeout: Duration) -> (ExitStatus, String, String) {
    let relay = RelayProcess::start(config_toml);
    let status = relay.wait_exit(timeout);
    (status, relay.stdout(), relay.stderr())
}

/// A fresh temp dir holding `relay.toml` with `config_toml`.
fn write_config(config_toml: &str) -> (TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix("outbox-relay-test-")
        .tempdir()
        .expect("creating relay temp dir");
    let config_path = dir.path().join("relay.toml");
    std::fs::write(&config_path, config_toml)
        .unwrap_or_else(|err| panic!("writing {}: {err}", config_path.display()));
    (dir, config_path)
}

fn relay_log_filter() -> String {
    std::env::var(RELAY_TEST_LOG_ENV).unwrap_or_else(|_| "info".to_owned())
}
