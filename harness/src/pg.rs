//! A throwaway PostgreSQL cluster: `initdb` into a temp dir, `postgres` started directly
//! as a child process on a free port on 127.0.0.1, killed (SIGQUIT) on drop and its
//! directory removed. When the tests run as root, both run as the `postgres` OS user.
//!
//! Server settings are passed with `-c` on the command line, so they win over
//! `ALTER SYSTEM`; settings not given here (e.g. `wal_sender_timeout`) can still be
//! changed with `ALTER SYSTEM` + `pg_reload_conf()`.
//!
//! The cluster, starting and stopping its server and its log are here; reaching a
//! running cluster (URLs, clients, SQL, slot and WAL positions, its version and
//! binaries) is `pg/access.rs`, and the cluster's place on this machine (finding
//! `initdb` and `postgres`, the OS user they run as, directories, TLS files,
//! `pg_hba.conf`, ports, signals) `pg/host.rs`.

use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use postgres::NoTls;
use tempfile::TempDir;

use super::wait::{poll_until, tail_lines, wait_child};

mod access;
mod host;

pub use access::{lsn_to_u64, query_lsn, u64_to_lsn};
use host::{
    chown_tree, copy_data_dir, free_port, install_server_tls, new_cluster_dir, pg_binaries,
    prepend_hba_lines, run_as, server_command, signal_child, write_hba_without_host_lines,
    PgBinaries,
};

/// Deadline for a started server to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for a fast shutdown. Generous: the walsender waits for its client to
/// confirm everything it was sent before the server exits.
const STOP_FAST_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline for an immediate shutdown (SIGQUIT), used by `stop_immediate` and drop.
const STOP_IMMEDIATE_TIMEOUT: Duration = Duration::from_secs(20);
/// How many lines of the server log `log_tail` returns.
const LOG_TAIL_LINES: usize = 50;
/// Attempts at picking a free port: another process can take the port between our
/// probe and the server's bind.
const PORT_ATTEMPTS: usize = 5;
/// The superuser created by initdb.
pub const SUPERUSER: &str = "postgres";

/// Options for [`PgCluster::start_with`].
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `wal_level`: `logical` (default) or `replica`.
    pub wal_level: &'static str,
    /// Extra server settings, passed as `-c name=value` after the harness defaults
    /// (so they override them).
    pub extra_conf: Vec<(String, String)>,
    /// Extra `pg_hba.conf` lines, placed before initdb's `trust` lines so they match
    /// first (e.g. `host all alice 127.0.0.1/32 scram-sha-256`).
    pub hba: Vec<String>,
    /// The server binaries' directory, when not the default (`PG_BINDIR`, PATH, ...):
    /// a test that needs a given major version (failover slots need 17).
    pub bindir: Option<PathBuf>,
    /// `ssl=on` with these files (copied into the cluster's directory, the key with
    /// mode 0600 and owned by the server's OS user, as PostgreSQL requires).
    pub tls: Option<ServerTls>,
    /// Drop initdb's `host` lines from pg_hba.conf, so TCP clients match only the
    /// `hba` lines (e.g. `hostssl` ones). The `local` lines stay: the harness's own
    /// sessions ([`PgCluster::client`], readiness) then use the Unix socket.
    pub hostssl_only: bool,
}

/// The server side of TLS (`ssl_cert_file`, `ssl_key_file`, `ssl_ca_file`).
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA that client certificates must chain to (pg_hba `cert`, `clientcert=`).
    pub ca_file: Option<PathBuf>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            wal_level: "logical",
            extra_conf: Vec::new(),
            hba: Vec::new(),
            bindir: None,
            tls: None,
            hostssl_only: false,
        }
    }
}

pub struct PgCluster {
    /// The postmaster; `None` while stopped.
    server: Option<Child>,
    /// `initdb` and `postgres` this cluster runs.
    bins: PgBinaries,
    port: u16,
    server_args: Vec<String>,
    data_dir: PathBuf,
    log_path: PathBuf,
    /// The harness's own sessions go through the Unix socket (`hostssl_only`).
    admin_via_socket: bool,
    // Last: removed after the server is stopped.
    dir: TempDir,
}

/// Why a started server did not become ready.
enum NotReady {
    Exited(ExitStatus),
    TimedOut,
}

impl PgCluster {
    /// A cluster with default options (`wal_level=logical`).
    pub fn start() -> Self {
        Self::start_with(PgOptions::default())
    }

    pub fn start_with(opts: PgOptions) -> Self {
        let bins = match &opts.bindir {
            Some(bindir) => PgBinaries::in_dir(bindir),
            None => pg_binaries().clone(),
        };
        let dir = new_cluster_dir();
        let data_dir = dir.path().join("data");
        let output = server_command(&bins.initdb, dir.path())
            .arg("-D")
            .arg(&data_dir)
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .output()
            .unwrap_or_else(|err| panic!("running {}: {err}", bins.initdb.display()));
        if !output.status.success() {
            panic!(
                "initdb failed ({}):\n{}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        if opts.hostssl_only {
            write_hba_without_host_lines(&data_dir.join("pg_hba.conf"), &opts.hba);
        } else if !opts.hba.is_empty() {
            prepend_hba_lines(&data_dir.join("pg_hba.conf"), &opts.hba);
        }
        Self::launch(dir, bins, &opts)
    }

    /// A physical standby of this cluster (same binaries), streaming from it through
    /// the physical slot `slot_name` (created here): a base backup taken with
    /// `pg_backup_start`/`pg_backup_stop` and a file copy (the npm builds of other
    /// versions have no `pg_basebackup`), `standby.signal`, `primary_conninfo` on
    /// database `dbname` (slot synchronisation needs one). `extra_conf` is added to the
    /// standby's settings (e.g. `hot_standby_feedback`). Logical slots are not copied:
    /// on PostgreSQL 17 the standby gets them by synchronisation, or not at all.
    pub fn start_standby(
        &self,
        slot_name: &str,
        dbname: &str,
        extra_conf: &[(&str, &str)],
    ) -> PgCluster {
        let mut client = self.client();
        client
            .execute(
                "SELECT pg_create_physical_replication_slot($1, true)",
                &[&slot_name],
            )
            .unwrap_or_else(|err| panic!("creating physical slot {slot_name}: {err}"));
        client
            .batch_execute("SELECT pg_backup_start('outbox-relay standby', true)")
            .unwrap_or_else(|err| panic!("pg_backup_start: {err}"));
        let dir = new_cluster_dir();
        let data_dir = dir.path().join("data");
        copy_data_dir(&self.data_dir, &data_dir);
        let row = client
            .query_one("SELECT labelfile FROM pg_backup_stop(true)", &[])
            .unwrap_or_else(|err| panic!("pg_backup_stop: {err}"));
        let label: String = row.get(0);
        std::fs::write(data_dir.join("backup_label"), label).expect("writing backup_label");
        std::fs::write(data_dir.join("standby.signal"), "").expect("writing standby.signal");
        std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o700))
            .expect("data dir mode 0700");
        if let Some(user) = run_as() {
            chown_tree(&data_dir, user);
        }
        let conninfo = format!(
            "host=127.0.0.1 port={} user={SUPERUSER} dbname={dbname} application_name=standby",
            self.port
        );
        let mut extra: Vec<(String, String)> = vec![
            ("primary_conninfo".into(), conninfo),
            ("primary_slot_name".into(), slot_name.into()),
            ("hot_standby".into(), "on".into()),
        ];
        extra.extend(
            extra_conf
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let opts = PgOptions {
            extra_conf: extra,
            ..PgOptions::default()
        };
        Self::launch(dir, self.bins.clone(), &opts)
    }

    /// Starts `postgres` on `dir/data` with the harness settings plus `opts.extra_conf`,
    /// on a free port.
    fn launch(dir: TempDir, bins: PgBinaries, opts: &PgOptions) -> PgCluster {
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("postgres.log");
        let tls_conf = opts
            .tls
            .as_ref()
            .map(|tls| install_server_tls(dir.path(), tls))
            .unwrap_or_default();
        let mut server_args: Vec<String> = [
            ("listen_addresses", "127.0.0.1".to_owned()),
            (
                "unix_socket_directories",
                dir.path().to_str().expect("UTF-8 temp dir").to_owned(),
            ),
            ("wal_level", opts.wal_level.to_owned()),
            ("max_wal_senders", "10".to_owned()),
            ("max_replication_slots", "10".to_owned()),
            // Throwaway data: no durability against OS crashes needed. A server crash
            // (SIGQUIT, `stop_immediate`) still recovers from WAL in the page cache.
            ("fsync", "off".to_owned()),
            ("log_replication_commands", "on".to_owned()),
        ]
        .into_iter()
        .chain(tls_conf.iter().map(|(k, v)| (*k, v.clone())))
        .chain(opts.extra_conf.iter().map(|(k, v)| (k.as_str(), v.clone())))
        .flat_map(|(name, value)| ["-c".to_owned(), format!("{name}={value}")])
        .collect();
        server_args.splice(
            0..0,
            [
                "-D".to_owned(),
                data_dir.to_str().expect("UTF-8 data dir").to_owned(),
            ],
        );

        let mut cluster = PgCluster {
            server: None,
            bins,
            port: 0,
            server_args,
            data_dir,
            log_path,
            admin_via_socket: opts.hostssl_only,
            dir,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            cluster.port = free_port();
            let log_start = cluster.log_len();
            match cluster.spawn_and_wait_ready() {
                Ok(()) => return cluster,
                Err(NotReady::Exited(_))
                    if attempt < PORT_ATTEMPTS && cluster.log_since(log_start).contains("bind") =>
                {
                    continue
                }
                Err(NotReady::Exited(status)) => panic!(
                    "postgres exited during startup ({status}); log tail:\n{}",
                    cluster.log_tail()
                ),
                Err(NotReady::TimedOut) => cluster.panic_not_ready(),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last lines of the server log, for panic messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read(&self.log_path).unwrap_or_default();
        tail_lines(&String::from_utf8_lossy(&log), LOG_TAIL_LINES)
    }

    /// The postmaster's pid. Panics while the cluster is stopped.
    pub fn pid(&self) -> u32 {
        self.server
            .as_ref()
            .expect("the PostgreSQL cluster is stopped")
            .id()
    }

    pub fn is_running(&self) -> bool {
        self.server.is_some()
    }

    /// Fast shutdown (SIGINT): disconnects clients, checkpoints, exits. Waits for exit.
    /// (SIGTERM would be a *smart* shutdown, which waits for every session to end.)
    pub fn stop_fast(&mut self) -> ExitStatus {
        self.stop(Signal::SIGINT, STOP_FAST_TIMEOUT)
    }

    /// Immediate shutdown (SIGQUIT): no checkpoint, crash recovery at next start. Waits
    /// for exit.
    pub fn stop_immediate(&mut self) -> ExitStatus {
        self.stop(Signal::SIGQUIT, STOP_IMMEDIATE_TIMEOUT)
    }

    /// Starts the stopped cluster again on the same data dir and port, and waits until
    /// it accepts connections.
    pub fn start_again(&mut self) {
        assert!(self.server.is_none(), "start_again: the cluster is running");
        match self.spawn_and_wait_ready() {
            Ok(()) => {}
            Err(NotReady::Exited(status)) => panic!(
                "postgres exited during restart ({status}); log tail:\n{}",
                self.log_tail()
            ),
            Err(NotReady::TimedOut) => self.panic_not_ready(),
        }
    }

    fn spawn_and_wait_ready(&mut self) -> Result<(), NotReady> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|err| panic!("opening {}: {err}", self.log_path.display()));
        let stderr = log.try_clone().expect("cloning log file handle");
        let child = server_command(&self.bins.postgres, self.dir.path())
            .args(&self.server_args)
            .arg("-p")
            .arg(self.port.to_string())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|err| panic!("spawning postgres: {err}"));
        let mut config = self.connect_config("postgres");
        config.connect_timeout(Duration::from_secs(1));
        let server = self.server.insert(child);
        let ready = poll_until(READY_TIMEOUT, || {
            match server.try_wait() {
                Ok(Some(status)) => return Some(Err(NotReady::Exited(status))),
                Ok(None) => {}
                Err(err) => panic!("waiting for postgres: {err}"),
            }
            config.connect(NoTls).ok().map(|_client| Ok(()))
        });
        let result = ready.unwrap_or(Err(NotReady::TimedOut));
        if let Err(NotReady::Exited(_)) = result {
            self.server = None;
        }
        result
    }

    fn panic_not_ready(&mut self) -> ! {
        let tail = self.log_tail();
        self.kill_server();
        panic!("postgres did not accept connections within {READY_TIMEOUT:?}; log tail:\n{tail}")
    }

    fn stop(&mut self, signal: Signal, timeout: Duration) -> ExitStatus {
        let mut server = self
            .server
            .take()
            .expect("stop: the PostgreSQL cluster is already stopped");
        signal_child(&mut server, signal);
        match wait_child(&mut server, timeout) {
            Some(status) => status,
            None => {
                self.server = Some(server);
                panic!(
                    "postgres did not exit within {timeout:?} after {signal}; log tail:\n{}",
                    self.log_tail()
                )
            }
        }
    }

    /// SIGQUIT (immediate shutdown, which also ends the backends), then SIGKILL if that
    /// does not work in time. Never panics.
    fn kill_server(&mut self) {
        if let Some(mut server) = self.server.take() {
            signal_child(&mut server, Signal::SIGQUIT);
            if wait_child(&mut server, STOP_IMMEDIATE_TIMEOUT).is_none() {
                let _ = server.kill();
                let _ = server.wait();
            }
        }
    }

    fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log_path)
            .map(|m| m.len())
            .unwrap_or(0)
    }

    fn log_since(&self, offset: u64) -> String {
        let log = std::fs::read(&self.log_path).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(log.len());
        String::from_utf8_lossy(&log[start..]).into_owned()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.kill_server();
    }
}
