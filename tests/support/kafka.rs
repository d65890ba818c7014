//! A throwaway Kafka broker (`tansu` 0.6.0, Kafka wire-compatible) as a child process,
//! and blocking client helpers (in `client`) to create topics, produce and read back.
//!
//! ```text
//! TansuBroker::start()          memory storage, free port on 127.0.0.1, own temp dir
//! TansuBroker::start_sqlite()   sqlite://broker.db in the temp dir: survives kill9()
//!   .pause() .resume()          SIGSTOP / SIGCONT (sockets stay open, nothing answers)
//!   .kill9() .restart()         same port, same cwd and storage
//! create_topic / list_topics    admin + metadata (tansu does not auto-create topics)
//! consume(...)                  read from offset 0 until `expected` records + `idle`
//! produce / produce_records     idempotent producer, waits for the delivery reports
//! ```
//!
//! Tansu behaviour this module relies on or works around:
//! - High watermarks and ListOffsets are unreliable, so [`consume`] never asks where the
//!   end is: it assigns every partition by hand at offset 0 (no offset lookup; the
//!   consumer group is never joined, nothing is committed) and reads until it has what
//!   it expects and then nothing new arrives for `idle`, so duplicates are seen too.
//!   Topics that do not exist yet are looked up again every 500 ms.
//! - Topics are not auto-created: [`create_topic`] uses the admin API and waits until
//!   metadata shows every partition with a leader.
//! - The `sqlite://` path is taken relative to the broker's working directory (an
//!   absolute one is mangled), so the broker runs with its cwd in its own temp dir.
//! - Readiness is a metadata request answered with a broker list (the listener is up a
//!   few milliseconds after spawn).
//! - The broker logs (tracing, `RUST_LOG`, FULL span events) to stdout; it gets its own
//!   filter from `TANSU_TEST_LOG` (default `warn`), never the test's `RUST_LOG`.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use tempfile::TempDir;

use super::process::ChildProcess;
use super::wait::{poll_until, tail_lines};

mod client;

use client::metadata_client;
pub use client::{
    consume, create_topic, list_topics, produce, produce_records, try_produce_records,
    unique_group_id, Delivered, OutgoingRecord, Record, PRODUCE_TIMEOUT,
};

/// Env var naming the tansu binary (checked before `PATH` and `~/.cargo/bin`).
pub const TANSU_BIN_ENV: &str = "TANSU_BIN";
/// Env var selecting the broker's `RUST_LOG` in tests (default `warn`).
pub const TANSU_TEST_LOG_ENV: &str = "TANSU_TEST_LOG";
const INSTALL_HINT: &str =
    "install with: cargo install tansu --locked --version 0.6.0 --features dynostore,libsql";
/// Deadline for a started broker to answer a metadata request.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for a killed broker to be reaped.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at picking a free port (another process can take it before tansu binds).
const PORT_ATTEMPTS: usize = 5;
/// How many lines `log_tail` returns.
const LOG_TAIL_LINES: usize = 60;

/// Where the broker keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Storage {
    Memory,
    /// `sqlite://broker.db`, relative to the broker's cwd (its temp dir).
    Sqlite,
}

impl Storage {
    fn url(self) -> &'static str {
        match self {
            Storage::Memory => "memory://tansu/",
            Storage::Sqlite => "sqlite://broker.db",
        }
    }
}

pub struct TansuBroker {
    /// `None` only transiently inside `restart`.
    process: Option<ChildProcess>,
    port: u16,
    /// Port advertised to clients instead of `port` (a proxy in front of the broker).
    advertised_port: Option<u16>,
    storage: Storage,
    binary: PathBuf,
    /// Output of earlier incarnations (before `restart`), for `log_tail`.
    earlier_log: String,
    // Last: removed after the broker is killed.
    dir: TempDir,
}

impl TansuBroker {
    /// A broker with in-memory storage: fast, lost on exit.
    pub fn start() -> Self {
        Self::start_with(Storage::Memory, None, &mut |_| {})
    }

    /// A broker with `sqlite://broker.db` storage in its temp dir: survives `kill9()` +
    /// `restart()`. Slow past ~20k records; use it for small restart tests only.
    pub fn start_sqlite() -> Self {
        Self::start_with(Storage::Sqlite, None, &mut |_| {})
    }

    /// A memory-storage broker listening on its own free port but advertising
    /// `127.0.0.1:advertised_port`, so clients connect there after bootstrap (a fault
    /// proxy in front of the broker: see `TansuBroker::start_behind_proxy`).
    /// `on_listen_port` gets the port the broker is about to listen on, before each
    /// spawn attempt (the readiness check may already go through the advertised port).
    pub fn start_advertising(advertised_port: u16, mut on_listen_port: impl FnMut(u16)) -> Self {
        Self::start_with(Storage::Memory, Some(advertised_port), &mut on_listen_port)
    }

    fn start_with(
        storage: Storage,
        advertised_port: Option<u16>,
        on_listen_port: &mut dyn FnMut(u16),
    ) -> Self {
        let binary = tansu_binary();
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-tansu-")
            .tempdir()
            .expect("creating tansu temp dir");
        let mut broker = TansuBroker {
            process: None,
            port: 0,
            advertised_port,
            storage,
            binary,
            earlier_log: String::new(),
            dir,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            broker.port = free_port();
            on_listen_port(broker.port);
            broker.spawn();
            match broker.wait_ready() {
                Ok(()) => return broker,
                Err(status) if attempt < PORT_ATTEMPTS => {
                    eprintln!(
                        "tansu exited during startup ({status}) on port {}, retrying with \
                         another port",
                        broker.port
                    );
                    broker.retire_process();
                }
                Err(status) => panic!(
                    "tansu exited during startup ({status}); log tail:\n{}",
                    broker.log_tail()
                ),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The broker's working directory (holds `broker.db` for sqlite storage).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.process().pid()
    }

    /// SIGSTOP: the broker keeps its sockets open but answers nothing.
    pub fn pause(&self) {
        self.process().pause();
    }

    /// SIGCONT after [`TansuBroker::pause`].
    pub fn resume(&self) {
        self.process().resume();
    }

    /// SIGKILL, and waits until the process is reaped. With memory storage everything
    /// is lost; with sqlite storage `restart()` brings the data back.
    pub fn kill9(&self) {
        let process = self.process();
        process.kill9();
        process.wait_exit(EXIT_TIMEOUT);
    }

    pub fn is_running(&self) -> bool {
        self.process
            .as_ref()
            .is_some_and(|p| p.exit_status().is_none())
    }

    /// Kills the broker if it still runs (SIGCONT first, in case it is paused), then
    /// starts it again on the same port, with the same working directory and storage,
    /// and waits until it answers.
    pub fn restart(&mut self) {
        if self.is_running() {
            self.resume();
            self.kill9();
        }
        self.retire_process();
        self.spawn();
        if let Err(status) = self.wait_ready() {
            panic!(
                "restarted tansu exited during startup ({status}) on port {}; log tail:\n{}",
                self.port,
                self.log_tail()
            );
        }
    }

    /// The last lines the broker printed (stdout and stderr, earlier incarnations
    /// included), for panic messages.
    pub fn log_tail(&self) -> String {
        let mut log = self.earlier_log.clone();
        if let Some(process) = &self.process {
            log.push_str(&process_log(process));
        }
        tail_lines(&log, LOG_TAIL_LINES)
    }

    fn process(&self) -> &ChildProcess {
        self.process.as_ref().expect("tansu process is running")
    }

    fn spawn(&mut self) {
        let listener = format!("tcp://127.0.0.1:{}", self.port);
        let advertised = format!(
            "tcp://127.0.0.1:{}",
            self.advertised_port.unwrap_or(self.port)
        );
        let mut command = Command::new(&self.binary);
        command
            .arg("broker")
            .args(["--listener-url", &listener])
            .args(["--advertised-listener-url", &advertised])
            .args(["--storage-engine", self.storage.url()])
            .current_dir(self.dir.path())
            .env("RUST_LOG", broker_log_filter());
        self.process = Some(ChildProcess::spawn("tansu", command));
    }

    /// Kills and reaps the current process (if any), keeping its output for `log_tail`.
    fn retire_process(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill9();
            process.wait_exit(EXIT_TIMEOUT);
            self.earlier_log.push_str(&process_log(&process));
            self.earlier_log.push_str("--- (broker restarted) ---\n");
        }
    }

    /// Waits until the broker accepts TCP connections and answers a metadata request.
    /// `Err(exit status)` when the process exits first; panics on timeout.
    fn wait_ready(&self) -> Result<(), std::process::ExitStatus> {
        let started = Instant::now();
        let process = self.process();
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        // Plain TCP first: a librdkafka client created before the port is open would
        // back off between reconnects.
        let listening = poll_until(READY_TIMEOUT, || {
            if let Some(status) = process.exit_status() {
                return Some(Err(status));
            }
            TcpStream::connect_timeout(&addr, Duration::from_millis(200))
                .ok()
                .map(|_| Ok(()))
        });
        match listening {
            Some(Ok(())) => {}
            Some(Err(status)) => return Err(status),
            None => self.panic_not_ready(started),
        }
        let client = metadata_client(&self.bootstrap());
        let remaining = READY_TIMEOUT.saturating_sub(started.elapsed());
        let answered = poll_until(remaining, || {
            if let Some(status) = process.exit_status() {
                return Some(Err(status));
            }
            match client.fetch_metadata(None, Duration::from_secs(2)) {
                Ok(metadata) if !metadata.brokers().is_empty() => Some(Ok(())),
                _ => None,
            }
        });
        match answered {
            Some(result) => result,
            None => self.panic_not_ready(started),
        }
    }

    fn panic_not_ready(&self, started: Instant) -> ! {
        panic!(
            "tansu on {} did not answer a metadata request within {:?}; log tail:\n{}",
            self.bootstrap(),
            started.elapsed(),
            self.log_tail()
        )
    }
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        // A paused process still dies on SIGKILL; ChildProcess kills and reaps it.
        self.process.take();
    }
}

fn process_log(process: &ChildProcess) -> String {
    let mut log = process.stdout();
    if !log.is_empty() {
        log.push('\n');
    }
    log.push_str(&process.stderr());
    log
}

fn broker_log_filter() -> String {
    std::env::var(TANSU_TEST_LOG_ENV).unwrap_or_else(|_| "warn".to_owned())
}

/// The tansu binary: `$TANSU_BIN`, else `tansu` on `PATH`, else `$CARGO_HOME/bin` or
/// `~/.cargo/bin`. Panics with the install command when there is none.
pub fn tansu_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os(TANSU_BIN_ENV) {
        let bin = PathBuf::from(bin);
        assert!(
            is_executable(&bin),
            "{TANSU_BIN_ENV}={} is not an executable file; {INSTALL_HINT}",
            bin.display()
        );
        return bin;
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let cargo_bins = [
        std::env::var_os("CARGO_HOME").map(|home| PathBuf::from(home).join("bin")),
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo/bin")),
    ];
    on_path
        .into_iter()
        .chain(cargo_bins.into_iter().flatten())
        .map(|dir| dir.join("tansu"))
        .find(|bin| is_executable(bin))
        .unwrap_or_else(|| panic!("the tansu broker is not installed; {INSTALL_HINT}"))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}
