//! One incarnation of a broker's JVM: formatting the log directory (first start only),
//! spawning `kafka.Kafka` under the watchdog, waiting until a metadata request lists the
//! broker, and retiring the process (its output kept for `log_tail`) before a restart
//! or another try on other ports.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;

use super::client::metadata_client;
use super::jvm::java_command;
use super::security::SecureListeners;
use super::{process_log, KafkaBroker, EXIT_TIMEOUT};
use crate::process::{ChildProcess, Watchdog};
use crate::wait::{poll_until, wait_child};

/// Deadline for a started broker to answer a metadata request listing itself. A JVM on
/// a loaded 2-core machine can take a while.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Deadline for the storage tool to format the log directory.
const FORMAT_TIMEOUT: Duration = Duration::from_secs(60);
/// Cluster id for the storage tool (any 22-character base64url string; each broker has
/// its own temp dir, so one id for all is fine).
const CLUSTER_ID: &str = "b3V0Ym94LXJlbGF5LXRlc3";

impl KafkaBroker {
    /// `kafka.tools.StorageTool format`: writes `meta.properties` and the bootstrap
    /// metadata into the log directory (KRaft refuses to start on an unformatted one).
    pub(super) fn format_storage(&self, libs: &Path) {
        let mut command = java_command(libs, self.dir.path());
        command
            .arg("kafka.tools.StorageTool")
            .args(["format", "--ignore-formatted", "-t", CLUSTER_ID, "-c"])
            .arg(self.dir.path().join("server.properties"))
            .args(if self.secure.is_some() {
                SecureListeners::format_args()
            } else {
                Vec::new()
            })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|err| panic!("spawning Kafka's storage tool ({command:?}): {err}"));
        let status = wait_child(&mut child, FORMAT_TIMEOUT).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("Kafka's storage tool did not finish within {FORMAT_TIMEOUT:?}")
        });
        if !status.success() {
            let output = child
                .wait_with_output()
                .expect("reading storage tool output");
            panic!(
                "formatting the Kafka log directory failed ({status}):\n{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }

    pub(super) fn spawn(&mut self, libs: &Path) {
        let mut command = java_command(libs, self.dir.path());
        command
            .arg("kafka.Kafka")
            .arg(self.dir.path().join("server.properties"));
        let process = ChildProcess::spawn("kafka", command);
        self.watchdog = Some(Watchdog::start(process.pid()));
        self.process = Some(process);
    }

    /// Kills and reaps the current process (if any), keeping its output for `log_tail`.
    pub(super) fn retire_process(&mut self) {
        if let Some(process) = self.process.take() {
            process.resume();
            process.kill9();
            process.wait_exit(EXIT_TIMEOUT);
            self.earlier_log.push_str(&process_log(&process));
            self.earlier_log.push_str("--- (broker restarted) ---\n");
        }
        self.watchdog.take();
    }

    /// Waits until the broker accepts TCP connections and answers a metadata request
    /// that lists a broker (it has registered with its controller). `Err(exit status)`
    /// when the process exits first; panics on timeout.
    pub(super) fn wait_ready(&self) -> Result<(), std::process::ExitStatus> {
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
            Some(Ok(())) => {
                eprintln!(
                    "kafka on {} ready in {:.1?} (pid {})",
                    self.bootstrap(),
                    started.elapsed(),
                    process.pid()
                );
                Ok(())
            }
            Some(Err(status)) => Err(status),
            None => self.panic_not_ready(started),
        }
    }

    fn panic_not_ready(&self, started: Instant) -> ! {
        panic!(
            "kafka on {} did not answer a metadata request within {:?}; log tail:\n{}",
            self.bootstrap(),
            started.elapsed(),
            self.log_tail()
        )
    }
}
