//! The relay binary as a child process: `outbox-relay run --config <file>`, stdout
//! (one JSON event per line) and stderr captured, killed on drop.
//!
//! `RelayProcess` derefs to [`ChildProcess`] for `lines()`, `wait_for_lines()`,
//! `stderr()`, `wait_for_stderr()`, `sigterm()`, `sigint()`, `kill9()`, `wait_exit()`,
//! `pid()` and friends.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use tempfile::TempDir;

use super::process::ChildProcess;

/// The binary under test, built by Cargo for integration tests.
pub const RELAY_BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// Env var selecting the relay's `RUST_LOG` in tests (default `info`).
pub const RELAY_TEST_LOG_ENV: &str = "RELAY_TEST_LOG";

pub struct RelayProcess {
    // Declared first so it is killed before its directory is removed.
    process: ChildProcess,
    config_path: PathBuf,
    dir: TempDir,
}

impl RelayProcess {
    /// Writes `config_toml` into a fresh temp dir and starts the relay on it.
    pub fn start(config_toml: &str) -> Self {
        Self::start_with_env(config_toml, &[])
    }

    /// Like [`RelayProcess::start`] with extra environment variables for the relay.
    pub fn start_with_env(config_toml: &str, env: &[(&str, &str)]) -> Self {
        let (dir, config_path) = write_config(config_toml);
        let mut command = Command::new(RELAY_BIN);
        command
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .current_dir(dir.path())
            .env("RUST_LOG", relay_log_filter())
            .envs(env.iter().copied());
        let process = ChildProcess::spawn("relay", command);
        RelayProcess {
            process,
            config_path,
            dir,
        }
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The relay's working directory (holds the config file; removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Deref for RelayProcess {
    type Target = ChildProcess;

    fn deref(&self) -> &ChildProcess {
        &self.process
    }
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
    let mut command = Command::new(RELAY_BIN);
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
