//! Debezium side by side (issue 11, 2d): Kafka Connect in standalone mode with Debezium's
//! PostgreSQL connector and its Outbox Event Router, as a child JVM on the same database,
//! WAL and broker as the relay, so the benchmark can measure what users would run instead.
//!
//! ```text
//! prepare_slot(client, opts)        publication FOR TABLE public.outbox + pgoutput slot,
//!                                   before the WAL to stream is written (a connector
//!                                   without offsets starts at its slot's position)
//! DebeziumConnect::start(pg, bootstrap, opts)
//!   java ... org.apache.kafka.connect.cli.ConnectStandalone worker.properties connector.properties
//!   worker:    REST on a free 127.0.0.1 port, offsets in <temp dir>/offsets.dat
//!   connector: pgoutput, its own slot and publication (autocreate disabled),
//!              snapshot.mode=no_data, table.include.list=public.outbox,
//!              transforms=outbox (io.debezium.transforms.outbox.EventRouter)
//!   .wait_running(t)                 GET /connectors/<name>/status: connector and task RUNNING
//!   .wait_streaming(pg, t)           the slot is active (a walsender streams to Connect)
//!   .pid()                           the JVM, for CPU (/proc/<pid>/stat) and RSS
//!   .stop() / .kill9()               SIGTERM (Connect flushes offsets) / SIGKILL
//! ```
//!
//! The jars come from Maven Central: `deploy/debezium/pom.xml` names the versions and
//! `deploy/dev-deps.sh` (`ensure_debezium_libs` in `deploy/lib.sh`) copies them into
//! `$OUTBOX_RELAY_DEBEZIUM_LIBS`, by default
//! `~/.cache/outbox-relay/debezium-<version>/libs`. Connect and the connector share one
//! class path (no `plugin.path`), which the standalone worker accepts.
//!
//! **Configured as Debezium documents it for an outbox** (the "Outbox Event Router" page):
//! the connector captures only the outbox table, the router's defaults match
//! `sql/outbox.sql` (event id `id` into header `id`, key `aggregateid`, topic
//! `outbox.event.<aggregatetype>`, value `payload`), and by default
//! ([`PayloadFormat::ExpandedJson`]) `table.expand.json.payload=true` with the
//! `JsonConverter` without schemas, the documented way to get the payload into Kafka as
//! JSON rather than as an escaped string; the relay writes the payload as JSON too. Keys
//! go through the `StringConverter` (the relay's keys are the column's text). The JVM
//! runs with the options `connect-standalone.sh` gives it (`-Xms256M -Xmx2G`, G1), so
//! its memory is what a user's Connect shows; everything else is Connect's and
//! Debezium's defaults unless [`DebeziumOptions`] overrides it.
//!
//! **No snapshot, only new WAL.** `snapshot.mode=no_data` (3.x's name for `never`) and a
//! publication made beforehand with `publication.autocreate.mode=disabled`. With no
//! offsets stored, the connector streams from its slot's `confirmed_flush_lsn`: create
//! the slot with [`prepare_slot`] before writing the WAL it should stream (the benchmark's
//! preloaded events); a slot the connector creates itself starts at the connector's start.
//!
//! As with the Kafka broker, a watchdog (`sh` reading a pipe only the test process holds)
//! kills the JVM when the test process exits however it exits; drop kills it too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::process::{ChildProcess, Watchdog};
use super::wait::{poll_until, tail_lines};

mod config;

pub use config::{
    connect_version, debezium_libs_dir, debezium_version, find_debezium_libs, DebeziumOptions,
    PayloadFormat, PgEndpoint, CONNECTOR_NAME, CONNECT_JVM_OPTIONS, DEBEZIUM_LIBS_ENV,
    DEBEZIUM_TEST_LOG_ENV, DEFAULT_PUBLICATION, DEFAULT_SLOT,
};
use config::{connector_properties, log4j_config, properties, worker_properties};

/// Deadline for Connect's REST API to answer after the JVM starts (class loading on a
/// loaded 2-core machine).
const REST_TIMEOUT: Duration = Duration::from_secs(120);
/// Deadline for a SIGTERM'd worker to exit (it stops the task and flushes offsets).
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at picking a free REST port (another process can take it first).
const PORT_ATTEMPTS: usize = 3;
const LOG_TAIL_LINES: usize = 80;

/// Creates `options.publication` (`FOR TABLE public.outbox`) and `options.slot` (pgoutput)
/// when they do not exist yet, on the database `client` is connected to. The slot starts
/// at the current WAL position: everything written after this call is what the connector
/// will stream.
pub fn prepare_slot(client: &mut postgres::Client, options: &DebeziumOptions) {
    let publication_exists = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&options.publication],
        )
        .unwrap_or_else(|err| panic!("looking up publication {:?}: {err}", options.publication))
        .is_some();
    if !publication_exists {
        client
            .batch_execute(&format!(
                "CREATE PUBLICATION {} FOR TABLE public.outbox",
                quote_ident(&options.publication)
            ))
            .unwrap_or_else(|err| panic!("creating publication {:?}: {err}", options.publication));
    }
    client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')
             WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)",
            &[&options.slot],
        )
        .unwrap_or_else(|err| panic!("creating slot {:?}: {err}", options.slot));
}

/// A running Kafka Connect standalone worker with the Debezium connector; killed on drop.
pub struct DebeziumConnect {
    process: Option<ChildProcess>,
    watchdog: Option<Watchdog>,
    rest_port: u16,
    slot: String,
    spawned_at: Instant,
    // Last: removed after the JVM is killed.
    dir: TempDir,
}

impl DebeziumConnect {
    /// Writes the worker and connector properties into a temp dir and starts Connect.
    /// Returns once the JVM runs; [`DebeziumConnect::wait_running`] waits for the
    /// connector. The slot and publication should exist ([`prepare_slot`]).
    pub fn start(pg: &PgEndpoint, bootstrap: &str, options: &DebeziumOptions) -> Self {
        let libs = debezium_libs_dir();
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-debezium-")
            .tempdir()
            .expect("creating the Debezium temp dir");
        std::fs::write(dir.path().join("log4j2.properties"), log4j_config())
            .expect("writing log4j2.properties");
        std::fs::write(
            dir.path().join("connector.properties"),
            properties(&connector_properties(pg, options)),
        )
        .expect("writing connector.properties");
        let mut connect = DebeziumConnect {
            process: None,
            watchdog: None,
            rest_port: 0,
            slot: options.slot.clone(),
            spawned_at: Instant::now(),
            dir,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            connect.rest_port = free_port();
            let worker = worker_properties(bootstrap, connect.rest_port, connect.dir(), options);
            std::fs::write(connect.dir().join("worker.properties"), properties(&worker))
                .expect("writing worker.properties");
            connect.spawn(&libs, options);
            match connect.wait_rest() {
                Ok(()) => return connect,
                Err(status) if attempt < PORT_ATTEMPTS => {
                    eprintln!(
                        "kafka connect exited during startup ({status}) with REST port {}, \
                         retrying with another port; log tail:\n{}",
                        connect.rest_port,
                        connect.log_tail()
                    );
                    connect.process.take();
                    connect.watchdog.take();
                }
                Err(status) => panic!(
                    "kafka connect exited during startup ({status}); log tail:\n{}",
                    connect.log_tail()
                ),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The Connect JVM's process id (CPU time and RSS from `/proc/<pid>`).
    pub fn pid(&self) -> u32 {
        self.process().pid()
    }

    /// `http://127.0.0.1:PORT`, Connect's REST API.
    pub fn rest_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.rest_port)
    }

    /// The worker's temp dir: `worker.properties`, `connector.properties`,
    /// `offsets.dat`, `log4j2.properties`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// When [`DebeziumConnect::start`] spawned the JVM (for start-up timings).
    pub fn spawned_at(&self) -> Instant {
        self.spawned_at
    }

    /// `GET /connectors/<name>/status` as JSON; `None` while the API does not answer or
    /// the connector is not registered yet.
    pub fn status(&self) -> Option<serde_json::Value> {
        let (code, body) = crate::http_get(
            self.rest_port,
            &format!("/connectors/{CONNECTOR_NAME}/status"),
        )?;
        if code != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// Waits until the connector and its task are `RUNNING`; panics (with the failure's
    /// trace and the log tail) when one is `FAILED`, the JVM exits, or `timeout` passes.
    pub fn wait_running(&self, timeout: Duration) {
        let mut last = String::from("no answer yet");
        let outcome = poll_until(timeout, || {
            if let Some(status) = self.process().exit_status() {
                return Some(Err(format!("kafka connect exited ({status})")));
            }
            let status = self.status()?;
            last = status.to_string();
            let connector = status["connector"]["state"].as_str().unwrap_or("");
            let tasks = status["tasks"].as_array().cloned().unwrap_or_default();
            let failed = std::iter::once(&status["connector"])
                .chain(tasks.iter())
                .find(|state| state["state"] == "FAILED");
            if let Some(failed) = failed {
                return Some(Err(format!(
                    "the connector failed: {}",
                    failed["trace"].as_str().unwrap_or("(no trace)")
                )));
            }
            let running = connector == "RUNNING"
                && !tasks.is_empty()
                && tasks.iter().all(|task| task["state"] == "RUNNING");
            running.then_some(Ok(()))
        });
        match outcome {
            Some(Ok(())) => {}
            Some(Err(why)) => panic!("{why}; log tail:\n{}", self.log_tail()),
            None => panic!(
                "the Debezium connector was not RUNNING within {timeout:?} (last status: \
                 {last}); log tail:\n{}",
                self.log_tail()
            ),
        }
    }

    /// Waits until [`DebeziumConnect::wait_running`] holds and PostgreSQL shows the
    /// connector's slot active (a walsender streams to Connect). Debezium's task reports
    /// `RUNNING` before its streaming thread has opened the replication connection.
    pub fn wait_streaming(&self, pg: &PgEndpoint, timeout: Duration) {
        let started = Instant::now();
        self.wait_running(timeout);
        let mut client: Option<postgres::Client> = None;
        let mut last = String::from("nothing yet");
        let remaining = timeout.saturating_sub(started.elapsed());
        let active = poll_until(remaining, || {
            if let Some(status) = self.process().exit_status() {
                return Some(Err(status));
            }
            let connection = match client.as_mut() {
                Some(connection) => connection,
                None => match pg.connect() {
                    Ok(connection) => client.insert(connection),
                    Err(err) => {
                        last = format!("cannot connect: {err}");
                        return None;
                    }
                },
            };
            match connection.query_opt(
                "SELECT active FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            ) {
                Ok(Some(row)) if row.get::<_, bool>(0) => Some(Ok(())),
                Ok(Some(_)) => {
                    last = format!("slot {:?} inactive", self.slot);
                    None
                }
                Ok(None) => {
                    last = format!("no slot {:?}", self.slot);
                    None
                }
                Err(err) => {
                    last = format!("query failed: {err}");
                    client = None;
                    None
                }
            }
        });
        match active {
            Some(Ok(())) => eprintln!(
                "debezium streaming from slot {:?} {:.1?} after spawn (pid {})",
                self.slot,
                self.spawned_at.elapsed(),
                self.pid()
            ),
            Some(Err(status)) => panic!(
                "kafka connect exited ({status}) before streaming; log tail:\n{}",
                self.log_tail()
            ),
            None => panic!(
                "debezium did not stream from slot {:?} within {timeout:?} ({last}); log \
                 tail:\n{}",
                self.slot,
                self.log_tail()
            ),
        }
    }

    /// SIGTERM: Connect stops the task, flushes its offsets (Debezium then confirms the
    /// flushed LSN to the slot) and exits; waits for the exit.
    pub fn stop(&self) {
        let process = self.process();
        process.resume();
        process.sigterm();
        process.wait_exit(EXIT_TIMEOUT);
    }

    /// SIGKILL, and waits until the JVM is reaped.
    pub fn kill9(&self) {
        let process = self.process();
        process.resume();
        process.kill9();
        process.wait_exit(EXIT_TIMEOUT);
    }

    pub fn is_running(&self) -> bool {
        self.process
            .as_ref()
            .is_some_and(|p| p.exit_status().is_none())
    }

    /// The last lines Connect logged (stdout, where log4j2 writes, then stderr).
    pub fn log_tail(&self) -> String {
        let Some(process) = &self.process else {
            return String::new();
        };
        let mut log = process.lines().join("\n");
        log.push('\n');
        log.push_str(&process.stderr());
        tail_lines(&log, LOG_TAIL_LINES)
    }

    fn process(&self) -> &ChildProcess {
        self.process.as_ref().expect("kafka connect was spawned")
    }

    fn spawn(&mut self, libs: &Path, options: &DebeziumOptions) {
        let java = std::env::var_os("JAVA_HOME")
            .map(|home| PathBuf::from(home).join("bin/java"))
            .filter(|java| java.is_file())
            .unwrap_or_else(|| PathBuf::from("java"));
        let dir = self.dir().to_path_buf();
        let mut command = Command::new(java);
        command
            .args(&options.jvm_options)
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                dir.join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg("org.apache.kafka.connect.cli.ConnectStandalone")
            .arg(dir.join("worker.properties"))
            .arg(dir.join("connector.properties"))
            .current_dir(&dir);
        self.spawned_at = Instant::now();
        let process = ChildProcess::spawn("debezium", command);
        self.watchdog = Some(Watchdog::start(process.pid()));
        self.process = Some(process);
    }

    /// Waits until the REST API answers `GET /`; `Err` when the JVM exits first (a REST
    /// port taken meanwhile), panics on timeout.
    fn wait_rest(&self) -> Result<(), std::process::ExitStatus> {
        let answered = poll_until(REST_TIMEOUT, || {
            if let Some(status) = self.process().exit_status() {
                return Some(Err(status));
            }
            crate::http_get(self.rest_port, "/").map(|_| Ok(()))
        });
        match answered {
            Some(result) => result,
            None => panic!(
                "kafka connect's REST API on {} did not answer within {REST_TIMEOUT:?}; log \
                 tail:\n{}",
                self.rest_url(),
                self.log_tail()
            ),
        }
    }
}

impl Drop for DebeziumConnect {
    fn drop(&mut self) {
        // ChildProcess kills (SIGKILL) and reaps the JVM.
        self.process.take();
        self.watchdog.take();
    }
}

/// `"name"` with embedded quotes doubled, for SQL identifiers.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding 127.0.0.1:0")
}
