//! A throwaway Apache Kafka broker (single-node KRaft, combined broker and controller) as
//! a child JVM, and blocking client helpers (in `client`) to create topics, produce and
//! read back.
//!
//! ```text
//! KafkaBroker::start()        fresh broker: free ports, own temp dir (log dir inside)
//! KafkaBroker::shared()       the test binary's one broker, leased by one test at a
//!                             time, emptied of topics for each lease (no faults on it)
//! KafkaBroker::start_secured() / shared_secured()
//!                             the same with SSL and SASL_SSL client listeners too
//!                             (`security`: CA, certificates, SCRAM and PLAIN users)
//!   .pause() .resume()        SIGSTOP / SIGCONT (sockets stay open, nothing answers)
//!   .kill9() .stop()          SIGKILL / SIGTERM (controlled shutdown), then reaped
//!   .restart()                kills if running, starts again on the same ports and
//!                             log directory: every acknowledged record is still there
//! create_topic / list_topics  admin + metadata (auto-creation is off, as in production)
//! consume(...)                waits until the topics hold `expected` records (high
//!                             watermarks), then reads exactly up to those watermarks
//! produce / produce_records   idempotent producer, waits for the delivery reports
//! ```
//!
//! The broker is Apache Kafka from Maven Central: `deploy/kafka/pom.xml` names the version,
//! and `deploy/dev-deps.sh` copies its jars (with a log4j2 binding) into
//! `$OUTBOX_RELAY_KAFKA_LIBS`, by default `~/.cache/outbox-relay/kafka-<version>/libs`.
//! Starting one is two JVM runs: `kafka.tools.StorageTool format` on the temp dir (first
//! start only), then `kafka.Kafka server.properties`; ready when a metadata request lists
//! the broker. Measured on the 2-core machine: about 4 s to ready, 300–350 MB RSS
//! (`-Xmx512m`, serial GC). See docs/testing.md.
//!
//! Every broker JVM is tied to the test process by a watchdog (`sh` reading a pipe whose
//! write end only the test process holds): when the test binary exits, however it exits,
//! the pipe closes and the watchdog kills the JVM. That is what lets [`KafkaBroker::shared`]
//! live in a `static`, which is never dropped.
//!
//! The broker, its ports, leases, controls and `server.properties` are here; starting
//! one incarnation of its JVM (formatting the log directory, spawning under the
//! watchdog, waiting until it answers, retiring it for a restart) is `kafka/launch.rs`.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tempfile::TempDir;

use super::process::ChildProcess;
use super::wait::tail_lines;

mod client;
mod jvm;
mod launch;
mod security;
pub mod segments;

use super::process::Watchdog;
pub use client::{
    add_partitions, consume, create_topic, delete_all_topics, ids_once_present, list_topics,
    produce, produce_records, read_all, read_committed, try_produce_records, unique_group_id,
    Delivered, OutgoingRecord, Record, PRODUCE_TIMEOUT,
};
use jvm::log4j_config;
pub use jvm::{kafka_libs_dir, kafka_version, KAFKA_LIBS_ENV, KAFKA_TEST_LOG_ENV};
use security::SecureListeners;
pub use security::{BrokerTls, SASL_PASSWORD, SASL_USER};

/// Deadline for a killed broker to be reaped, and for a controlled shutdown.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts at picking free ports (another process can take them before the JVM binds).
const PORT_ATTEMPTS: usize = 5;
/// How many lines `log_tail` returns.
const LOG_TAIL_LINES: usize = 80;

/// Which client listeners a broker has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listeners {
    /// PLAINTEXT only.
    Plain,
    /// PLAINTEXT, SSL and SASL_SSL.
    Secured,
}

pub struct KafkaBroker {
    /// `None` only transiently inside `restart`.
    process: Option<ChildProcess>,
    /// Kills the JVM when the test process exits without dropping the broker.
    watchdog: Option<Watchdog>,
    port: u16,
    controller_port: u16,
    /// Port advertised to clients instead of `port` (a proxy in front of the broker).
    advertised_port: Option<u16>,
    /// Output of earlier incarnations (before `restart`), for `log_tail`.
    earlier_log: String,
    /// The SSL and SASL_SSL listeners of a secured broker.
    secure: Option<SecureListeners>,
    // Last: removed after the broker is killed.
    dir: TempDir,
}

impl KafkaBroker {
    /// A fresh broker of its own, for tests that stop, pause or restart it.
    pub fn start() -> Self {
        Self::start_with(None, Listeners::Plain, &mut |_| {}, None)
    }

    /// A fresh broker of its own whose log has Kafka's messages from `level` up (`info`:
    /// the controller's answer to every CreateTopics request, for instance), whatever
    /// `KAFKA_TEST_LOG` says.
    pub fn start_logging(level: &str) -> Self {
        Self::start_with(None, Listeners::Plain, &mut |_| {}, Some(level))
    }

    /// A fresh broker with an SSL and a SASL_SSL listener (SCRAM-SHA-256/512 and PLAIN
    /// for [`SASL_USER`]) besides the plain one: see [`KafkaBroker::ssl_bootstrap`],
    /// [`KafkaBroker::sasl_ssl_bootstrap`] and [`KafkaBroker::tls`].
    pub fn start_secured() -> Self {
        Self::start_with(None, Listeners::Secured, &mut |_| {}, None)
    }

    /// A broker listening on its own free port but advertising
    /// `127.0.0.1:advertised_port`, so clients connect there after bootstrap (a fault
    /// proxy in front of the broker: see `KafkaBroker::start_behind_proxy`).
    /// `on_listen_port` gets the port the broker is about to listen on, before each
    /// spawn attempt (the readiness check goes through the advertised port).
    pub fn start_advertising(advertised_port: u16, mut on_listen_port: impl FnMut(u16)) -> Self {
        Self::start_with(
            Some(advertised_port),
            Listeners::Plain,
            &mut on_listen_port,
            None,
        )
    }

    /// The test binary's shared broker, started on first use, leased to one test at a
    /// time (the lease serialises the tests that use it) and emptied of every topic at
    /// the start of each lease, so a test sees what a fresh broker shows. For tests that
    /// neither stop nor pause the broker; fault tests take [`KafkaBroker::start`].
    pub fn shared() -> SharedBroker {
        static SHARED: OnceLock<Mutex<KafkaBroker>> = OnceLock::new();
        Self::lease(SHARED.get_or_init(|| Mutex::new(KafkaBroker::start())))
    }

    /// The test binary's shared secured broker ([`KafkaBroker::start_secured`]), leased
    /// as [`KafkaBroker::shared`] leases the plain one.
    pub fn shared_secured() -> SharedBroker {
        static SHARED: OnceLock<Mutex<KafkaBroker>> = OnceLock::new();
        Self::lease(SHARED.get_or_init(|| Mutex::new(KafkaBroker::start_secured())))
    }

    fn lease(broker: &'static Mutex<KafkaBroker>) -> SharedBroker {
        // A test that panicked while holding the lease leaves the broker as it was;
        // the next lease empties it anyway.
        let guard = broker.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            guard.is_running(),
            "the shared Kafka broker has exited; log tail:\n{}",
            guard.log_tail()
        );
        delete_all_topics(&guard.bootstrap());
        SharedBroker(guard)
    }

    fn start_with(
        advertised_port: Option<u16>,
        listeners: Listeners,
        on_listen_port: &mut dyn FnMut(u16),
        log_level: Option<&str>,
    ) -> Self {
        let libs = kafka_libs_dir();
        let dir = tempfile::Builder::new()
            .prefix("outbox-relay-kafka-")
            .tempdir()
            .expect("creating the Kafka broker's temp dir");
        let mut broker = KafkaBroker {
            process: None,
            watchdog: None,
            port: 0,
            controller_port: 0,
            advertised_port,
            earlier_log: String::new(),
            secure: None,
            dir,
        };
        if listeners == Listeners::Secured {
            broker.secure = Some(SecureListeners::generate(broker.dir.path()));
        }
        std::fs::write(
            broker.dir.path().join("log4j2.properties"),
            log4j_config(log_level),
        )
        .expect("writing log4j2.properties");
        for attempt in 1..=PORT_ATTEMPTS {
            // Four distinct ports: asked one at a time, the kernel may hand out the same
            // port twice once the first listener is closed, and Kafka refuses two listeners
            // on one port (a CI run's exactly_once.rs failed so).
            let [port, controller_port, ssl_port, sasl_ssl_port] = free_ports();
            broker.port = port;
            broker.controller_port = controller_port;
            if let Some(secure) = &mut broker.secure {
                secure.ssl_port = ssl_port;
                secure.sasl_ssl_port = sasl_ssl_port;
            }
            on_listen_port(broker.port);
            broker.write_server_properties();
            if attempt == 1 {
                broker.format_storage(&libs);
            }
            broker.spawn(&libs);
            match broker.wait_ready() {
                Ok(()) => return broker,
                Err(status) if attempt < PORT_ATTEMPTS => {
                    eprintln!(
                        "kafka exited during startup ({status}) on port {}, retrying with \
                         other ports",
                        broker.port
                    );
                    broker.retire_process();
                }
                Err(status) => panic!(
                    "kafka exited during startup ({status}); log tail:\n{}",
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

    /// `127.0.0.1:PORT` of the SSL listener (`security.protocol=SSL`). Panics unless the
    /// broker was started secured.
    pub fn ssl_bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.secure().ssl_port)
    }

    /// `127.0.0.1:PORT` of the SASL_SSL listener (`security.protocol=SASL_SSL`,
    /// `sasl.mechanism` SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN). Panics unless the broker
    /// was started secured.
    pub fn sasl_ssl_bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.secure().sasl_ssl_port)
    }

    /// The secured broker's CA (and an unrelated one), as PEM files.
    pub fn tls(&self) -> &BrokerTls {
        &self.secure().tls
    }

    fn secure(&self) -> &SecureListeners {
        self.secure
            .as_ref()
            .expect("the broker was started with KafkaBroker::start_secured")
    }

    /// The broker's temp dir (`data/` is its log directory).
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

    /// SIGCONT after [`KafkaBroker::pause`].
    pub fn resume(&self) {
        self.process().resume();
    }

    /// SIGKILL, and waits until the process is reaped. The log directory stays:
    /// `restart()` brings back everything the broker acknowledged.
    pub fn kill9(&self) {
        let process = self.process();
        process.resume();
        process.kill9();
        process.wait_exit(EXIT_TIMEOUT);
    }

    /// SIGTERM (a controlled shutdown: the broker flushes and closes its logs), and
    /// waits until it has exited.
    pub fn stop(&self) {
        let process = self.process();
        process.resume();
        process.sigterm();
        process.wait_exit(EXIT_TIMEOUT);
    }

    pub fn is_running(&self) -> bool {
        self.process
            .as_ref()
            .is_some_and(|p| p.exit_status().is_none())
    }

    /// Kills the broker if it still runs (SIGCONT first, in case it is paused), then
    /// starts it again on the same ports with the same log directory, and waits until
    /// it answers.
    pub fn restart(&mut self) {
        if self.is_running() {
            self.kill9();
        }
        self.retire_process();
        self.spawn(&kafka_libs_dir());
        if let Err(status) = self.wait_ready() {
            panic!(
                "restarted kafka exited during startup ({status}) on port {}; log tail:\n{}",
                self.port,
                self.log_tail()
            );
        }
    }

    /// Every partition of `topic` as the broker wrote it, batch by batch (producer,
    /// epoch, transactional data, commit and abort markers; see [`segments`]), read
    /// from its log directory, for failure messages. Empty when the topic has none.
    pub fn topic_log_summary(&self, topic: &str) -> String {
        let data = self.dir.path().join("data");
        let mut partitions: Vec<(i32, std::path::PathBuf)> = std::fs::read_dir(&data)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let partition = name.strip_prefix(topic)?.strip_prefix('-')?.parse().ok()?;
                Some((partition, entry.path()))
            })
            .collect();
        partitions.sort();
        let mut out = String::new();
        for (partition, dir) in partitions {
            out.push_str(&format!("{topic}-{partition}: "));
            match segments::partition_batches(&dir) {
                Ok(batches) => out.push_str(&segments::summarize(&batches)),
                Err(err) => out.push_str(&format!("reading {}: {err}\n", dir.display())),
            }
        }
        out
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

    /// Everything the broker printed (stdout and stderr, earlier incarnations included).
    pub fn log(&self) -> String {
        let mut log = self.earlier_log.clone();
        if let Some(process) = &self.process {
            log.push_str(&process_log(process));
        }
        log
    }

    fn process(&self) -> &ChildProcess {
        self.process.as_ref().expect("kafka process is running")
    }

    fn write_server_properties(&self) {
        let advertised = self.advertised_port.unwrap_or(self.port);
        let log_dir = self.dir.path().join("data");
        let (secure_listeners, secure_properties) = match &self.secure {
            Some(secure) => (
                format!(",{}", secure.listeners()),
                secure.server_properties(),
            ),
            None => (String::new(), String::new()),
        };
        let properties = format!(
            "# Generated by harness/src/kafka.rs: one combined broker and controller.\n\
             process.roles=broker,controller\n\
             node.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{controller}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}{secure_listeners}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{advertised}{secure_listeners}\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL\n\
             log.dirs={log_dir}\n\
             # As in production: topics exist only when someone creates them.\n\
             auto.create.topics.enable=false\n\
             num.partitions=1\n\
             default.replication.factor=1\n\
             min.insync.replicas=1\n\
             offsets.topic.replication.factor=1\n\
             offsets.topic.num.partitions=1\n\
             transaction.state.log.replication.factor=1\n\
             transaction.state.log.min.isr=1\n\
             transaction.state.log.num.partitions=1\n\
             share.coordinator.state.topic.replication.factor=1\n\
             share.coordinator.state.topic.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\n\
             # A restarted broker re-registers once the controller has fenced the old\n\
             # incarnation: a short session makes a kill -9 + restart take seconds, not 12.\n\
             broker.session.timeout.ms=2000\n\
             broker.heartbeat.interval.ms=500\n\
             # Small segments and indexes: tests write little, and many brokers share a disk.\n\
             log.segment.bytes=16777216\n\
             log.index.size.max.bytes=1048576\n\
             {append_time}\
             {secure_properties}",
            port = self.port,
            controller = self.controller_port,
            // Behind a fault proxy (the fault tests): records carry the time the broker
            // appended them, so a test can tell after which fault a second copy came.
            append_time = if self.advertised_port.is_some() {
                "log.message.timestamp.type=LogAppendTime\n"
            } else {
                ""
            },
            log_dir = log_dir.display(),
        );
        std::fs::write(self.dir.path().join("server.properties"), properties)
            .expect("writing server.properties");
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        // A paused process still dies on SIGKILL; ChildProcess kills and reaps it.
        self.process.take();
        self.watchdog.take();
    }
}

/// A lease on the shared broker (see [`KafkaBroker::shared`]); derefs to the broker.
pub struct SharedBroker(MutexGuard<'static, KafkaBroker>);

impl std::ops::Deref for SharedBroker {
    type Target = KafkaBroker;

    fn deref(&self) -> &KafkaBroker {
        &self.0
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

/// `N` distinct TCP ports on 127.0.0.1 that were free a moment ago: all `N` listeners are
/// held open together, so no two of them can be the same port.
fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [std::net::TcpListener; N] = std::array::from_fn(|_| {
        std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0")
    });
    listeners.map(|listener| listener.local_addr().expect("local address").port())
}

#[cfg(test)]
mod tests {
    use super::free_ports;

    /// Asked one at a time (bind port 0, close, bind again), the kernel returns the port
    /// just closed about once in 7,000 pairs here: 5,000 sets of four, six pairs each,
    /// see several such collisions. Held together, no two can be equal.
    #[test]
    fn a_brokers_ports_are_distinct() {
        for _ in 0..5_000 {
            let ports: [u16; 4] = free_ports();
            let distinct: std::collections::HashSet<u16> = ports.into_iter().collect();
            assert_eq!(distinct.len(), 4, "ports {ports:?}");
        }
    }
}
