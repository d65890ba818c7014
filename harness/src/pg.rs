//! A throwaway PostgreSQL cluster: `initdb` into a temp dir, `postgres` started directly
//! as a child process on a free port on 127.0.0.1, killed (SIGQUIT) on drop and its
//! directory removed. When the tests run as root, both run as the `postgres` OS user.
//!
//! Server settings are passed with `-c` on the command line, so they win over
//! `ALTER SYSTEM`; settings not given here (e.g. `wal_sender_timeout`) can still be
//! changed with `ALTER SYSTEM` + `pg_reload_conf()`.

use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};
use postgres::{Client, NoTls, SimpleQueryMessage};
use tempfile::TempDir;

use super::wait::{poll_until, tail_lines, wait_child};

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

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://user[:password]@127.0.0.1:port/db`, user and password percent-encoded.
    pub fn url(&self, user: &str, password: Option<&str>, db: &str) -> String {
        let password = password
            .map(|p| format!(":{}", percent_encode(p)))
            .unwrap_or_default();
        format!(
            "postgres://{}{password}@127.0.0.1:{}/{}",
            percent_encode(user),
            self.port,
            percent_encode(db)
        )
    }

    /// URL of the superuser `postgres` on database `postgres` (trust auth, no password).
    pub fn superuser_url(&self) -> String {
        self.url(SUPERUSER, None, "postgres")
    }

    /// A superuser connection to database `postgres`.
    pub fn client(&self) -> Client {
        self.client_db("postgres")
    }

    /// A superuser connection to `db`.
    pub fn client_db(&self, db: &str) -> Client {
        self.connect_config(db)
            .connect(NoTls)
            .unwrap_or_else(|err| {
                panic!(
                    "connecting to database {db:?} on port {}: {err}; log tail:\n{}",
                    self.port,
                    self.log_tail()
                )
            })
    }

    /// Runs `sql` (one or more statements) as the superuser on database `postgres`.
    pub fn batch_execute(&self, sql: &str) {
        self.client()
            .batch_execute(sql)
            .unwrap_or_else(|err| panic!("executing {sql:?}: {err}"));
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

    /// `confirmed_flush_lsn` of a replication slot; `None` if the slot does not exist or
    /// has no confirmed position.
    pub fn slot_confirmed_flush_lsn(&self, slot: &str) -> Option<u64> {
        let row = self
            .client()
            .query_opt(
                "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
                &[&slot],
            )
            .unwrap_or_else(|err| panic!("querying slot {slot:?}: {err}"))?;
        row.get::<_, Option<String>>(0).map(|lsn| lsn_to_u64(&lsn))
    }

    /// `server_version_num`, e.g. 170010 for 17.10: for expectations that differ by
    /// PostgreSQL version.
    /// `initdb` and `postgres` of the given major version, as `deploy/dev-deps.sh`
    /// installs them (`ensure_pg_version` in deploy/lib.sh prints the directory).
    pub fn bindir_of_major(major: u32) -> PathBuf {
        let output = Command::new("bash")
            .arg("-c")
            .arg(format!(". deploy/lib.sh && ensure_pg_version {major}"))
            .current_dir(crate::repo_root())
            .output()
            .unwrap_or_else(|err| panic!("running deploy/lib.sh: {err}"));
        assert!(
            output.status.success(),
            "no PostgreSQL {major} (run ./deploy/dev-deps.sh): {}",
            String::from_utf8_lossy(&output.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
    }

    pub fn server_version_num(&self) -> u32 {
        let text = query_lsn(&mut self.client(), "SHOW server_version_num");
        text.parse()
            .unwrap_or_else(|err| panic!("bad server_version_num {text:?}: {err}"))
    }

    /// The directory of this cluster's server binaries, symbolic links resolved (a
    /// `postgres` on PATH may be a link into `/usr/lib/postgresql/<major>/bin`): the
    /// client tools of the same version (`pg_recvlogical`) are there too.
    pub fn bindir(&self) -> PathBuf {
        let postgres = std::fs::canonicalize(&self.bins.postgres)
            .unwrap_or_else(|_| self.bins.postgres.clone());
        postgres.parent().map(Path::to_path_buf).unwrap_or_default()
    }

    /// `pg_current_wal_lsn()`.
    pub fn current_wal_lsn(&self) -> u64 {
        lsn_to_u64(&query_lsn(
            &mut self.client(),
            "SELECT pg_current_wal_lsn()",
        ))
    }

    /// A libpq key/value connection string for the superuser on `db` through the
    /// server's Unix socket: what reaches a cluster whose TCP lines are all `hostssl`
    /// (`RelayProcess::wait_streaming` takes it).
    pub fn socket_conninfo(&self, db: &str) -> String {
        format!(
            "host={} port={} user={SUPERUSER} dbname={db}",
            self.dir.path().display(),
            self.port
        )
    }

    fn connect_config(&self, db: &str) -> postgres::Config {
        let mut config = postgres::Config::new();
        if self.admin_via_socket {
            config.host_path(self.dir.path());
        } else {
            config.host("127.0.0.1");
        }
        config
            .port(self.port)
            .user(SUPERUSER)
            .dbname(db)
            .connect_timeout(Duration::from_secs(5));
        config
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

/// Runs `sql` and returns the first column of the first row as text (e.g. an LSN
/// `16/B374D848`). Panics if there is no row or the value is NULL.
pub fn query_lsn(client: &mut Client, sql: &str) -> String {
    let messages = client
        .simple_query(sql)
        .unwrap_or_else(|err| panic!("running {sql:?}: {err}"));
    let row = messages
        .iter()
        .find_map(|message| match message {
            SimpleQueryMessage::Row(row) => Some(row),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql:?} returned no row"));
    row.get(0)
        .unwrap_or_else(|| panic!("{sql:?} returned NULL"))
        .to_owned()
}

/// Parses PostgreSQL's `X/Y` LSN text (two hex numbers, high and low 32 bits).
pub fn lsn_to_u64(lsn: &str) -> u64 {
    let parse = |part: &str| {
        u32::from_str_radix(part, 16).unwrap_or_else(|err| panic!("bad LSN {lsn:?}: {err}"))
    };
    let (high, low) = lsn
        .split_once('/')
        .unwrap_or_else(|| panic!("bad LSN {lsn:?}: no '/'"));
    (u64::from(parse(high)) << 32) | u64::from(parse(low))
}

/// Formats an LSN as PostgreSQL does (`X/Y`, uppercase hex).
pub fn u64_to_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

#[derive(Debug, Clone)]
struct PgBinaries {
    initdb: PathBuf,
    postgres: PathBuf,
}

impl PgBinaries {
    fn in_dir(bindir: &Path) -> Self {
        let bins = PgBinaries {
            initdb: bindir.join("initdb"),
            postgres: bindir.join("postgres"),
        };
        assert!(
            is_executable(&bins.initdb) && is_executable(&bins.postgres),
            "{} holds no executable initdb and postgres",
            bindir.display()
        );
        bins
    }
}

/// Finds `initdb` and `postgres`: in `$PG_BINDIR` when it is set (how CI runs tests on
/// each PostgreSQL major version, see `ensure_pg_version` in deploy/lib.sh), else on
/// PATH, else in `pg_config --bindir`, else in the newest `/usr/lib/postgresql/*/bin`.
/// Panics if there are none.
///
/// The npm builds of other versions carry their own shared libraries in `../lib`; their
/// RUNPATH (`$ORIGIN/../lib`) finds them, so no `LD_LIBRARY_PATH` is needed.
fn pg_binaries() -> &'static PgBinaries {
    static BINARIES: OnceLock<PgBinaries> = OnceLock::new();
    BINARIES.get_or_init(|| {
        if let Some(bindir) = std::env::var_os("PG_BINDIR").filter(|dir| !dir.is_empty()) {
            let bins = PgBinaries {
                initdb: Path::new(&bindir).join("initdb"),
                postgres: Path::new(&bindir).join("postgres"),
            };
            assert!(
                is_executable(&bins.initdb) && is_executable(&bins.postgres),
                "PG_BINDIR={} holds no executable initdb and postgres: point it at a \
                 PostgreSQL bindir (deploy/lib.sh: ensure_pg_version MAJOR prints one)",
                Path::new(&bindir).display()
            );
            return bins;
        }
        let on_path = |name: &str| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|dir| dir.join(name))
                .find(|path| is_executable(path))
        };
        if let (Some(initdb), Some(postgres)) = (on_path("initdb"), on_path("postgres")) {
            return PgBinaries { initdb, postgres };
        }
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
            if output.status.success() {
                let bindir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
                candidates.push(PathBuf::from(bindir));
            }
        }
        let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
                Some((version, entry.path().join("bin")))
            })
            .collect();
        versioned.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
        candidates.extend(versioned.into_iter().map(|(_, dir)| dir));
        candidates
            .into_iter()
            .map(|dir| PgBinaries {
                initdb: dir.join("initdb"),
                postgres: dir.join("postgres"),
            })
            .find(|bins| is_executable(&bins.initdb) && is_executable(&bins.postgres))
            .unwrap_or_else(|| {
                panic!(
                    "PostgreSQL server binaries (initdb, postgres) not found on PATH, in \
                     `pg_config --bindir` or /usr/lib/postgresql/*/bin: install PostgreSQL \
                     server binaries, e.g. apt-get install postgresql"
                )
            })
    })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The OS user to run `initdb`/`postgres` as: `postgres` when we are root (PostgreSQL
/// refuses to run as root), else ourselves (`None`).
fn run_as() -> Option<&'static User> {
    static RUN_AS: OnceLock<Option<User>> = OnceLock::new();
    RUN_AS
        .get_or_init(|| {
            if !nix::unistd::geteuid().is_root() {
                return None;
            }
            let user = User::from_name("postgres")
                .unwrap_or_else(|err| panic!("looking up OS user postgres: {err}"))
                .unwrap_or_else(|| {
                    panic!(
                        "tests run as root, and PostgreSQL refuses to run as root, but there is \
                         no `postgres` OS user to run it as: create one (useradd --system \
                         postgres) or install the postgresql package"
                    )
                });
            Some(user)
        })
        .as_ref()
}

/// A command for a PostgreSQL binary: runs as the `postgres` user when we are root,
/// with its working directory in the cluster's temp dir (ours may not be readable).
fn server_command(program: &Path, dir: &Path) -> Command {
    let mut command = Command::new(program);
    command.current_dir(dir).env("LC_ALL", "C");
    for var in [
        "PGDATA",
        "PGPORT",
        "PGHOST",
        "PGUSER",
        "PGDATABASE",
        "PGOPTIONS",
    ] {
        command.env_remove(var);
    }
    if let Some(user) = run_as() {
        command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        if let Some(home) = user.dir.to_str() {
            command.env("HOME", home);
        }
    }
    command
}

/// Where to create cluster dirs. When running as root the dir must be reachable by the
/// `postgres` user: if some ancestor of `$TMPDIR` is not world-searchable, use /tmp.
/// A fresh temp dir for a cluster, owned by the server's OS user.
fn new_cluster_dir() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("outbox-relay-pg-")
        .tempdir_in(temp_base())
        .expect("creating PostgreSQL temp dir");
    if let Some(user) = run_as() {
        std::os::unix::fs::chown(dir.path(), Some(user.uid.as_raw()), Some(user.gid.as_raw()))
            .unwrap_or_else(|err| panic!("chown {} to postgres: {err}", dir.path().display()));
    }
    dir
}

/// Copies a running cluster's data directory for a base backup: everything but the
/// postmaster's own files and the replication slots (which a base backup leaves out).
fn copy_data_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creating the standby's data dir");
    for entry in std::fs::read_dir(from).expect("reading the data dir") {
        let entry = entry.expect("data dir entry");
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if matches!(name.as_ref(), "postmaster.pid" | "postmaster.opts") {
            continue;
        }
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            if matches!(name.as_ref(), "pg_replslot" | "pg_stat_tmp") {
                std::fs::create_dir_all(&target).expect("creating an emptied dir");
                continue;
            }
            copy_data_dir(&entry.path(), &target);
        } else {
            // Files may change or vanish while the server runs: the backup's WAL repairs
            // torn pages, and a vanished file was not needed.
            let _ = std::fs::copy(entry.path(), &target);
        }
    }
}

fn chown_tree(path: &Path, user: &User) {
    std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
        .unwrap_or_else(|err| panic!("chown {}: {err}", path.display()));
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("reading dir") {
            chown_tree(&entry.expect("dir entry").path(), user);
        }
    }
}

fn temp_base() -> PathBuf {
    let base = std::env::temp_dir();
    if run_as().is_none() {
        return base;
    }
    let reachable = base
        .ancestors()
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if reachable {
        base
    } else {
        PathBuf::from("/tmp")
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// Copies the server's TLS files into the cluster dir (readable by the server's OS
/// user; the key 0600, as PostgreSQL requires) and returns the settings naming them.
fn install_server_tls(dir: &Path, tls: &ServerTls) -> Vec<(&'static str, String)> {
    let tls_dir = dir.join("tls");
    std::fs::create_dir_all(&tls_dir).expect("creating the cluster's tls dir");
    let copy = |from: &Path, name: &str, mode: u32| {
        let to = tls_dir.join(name);
        std::fs::copy(from, &to)
            .unwrap_or_else(|err| panic!("copying {} to {}: {err}", from.display(), to.display()));
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
            .unwrap_or_else(|err| panic!("chmod {}: {err}", to.display()));
        to.to_str().expect("UTF-8 tls path").to_owned()
    };
    let mut settings = vec![
        ("ssl", "on".to_owned()),
        ("ssl_cert_file", copy(&tls.cert_file, "server.crt", 0o644)),
        ("ssl_key_file", copy(&tls.key_file, "server.key", 0o600)),
    ];
    if let Some(ca) = &tls.ca_file {
        settings.push(("ssl_ca_file", copy(ca, "ca.crt", 0o644)));
    }
    if let Some(user) = run_as() {
        chown_tree(&tls_dir, user);
    }
    settings
}

/// pg_hba.conf with `lines` and initdb's `local` lines only: TCP clients match `lines`
/// or nothing.
fn write_hba_without_host_lines(hba_path: &Path, lines: &[String]) {
    let mut text = String::from("# test harness (PgOptions::hba, hostssl_only)\n");
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("\n# the harness's own sessions, over the Unix socket\n");
    text.push_str("local all all trust\nlocal replication all trust\n");
    std::fs::write(hba_path, text)
        .unwrap_or_else(|err| panic!("writing {}: {err}", hba_path.display()));
}

fn prepend_hba_lines(hba_path: &Path, lines: &[String]) {
    let defaults = std::fs::read_to_string(hba_path)
        .unwrap_or_else(|err| panic!("reading {}: {err}", hba_path.display()));
    let mut text = String::from("# test harness (PgOptions::hba), matched first\n");
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("\n# initdb defaults\n");
    text.push_str(&defaults);
    std::fs::write(hba_path, text)
        .unwrap_or_else(|err| panic!("writing {}: {err}", hba_path.display()));
}

/// Sends `signal` to a child that has not been reaped (so its pid is still ours).
fn signal_child(child: &mut Child, signal: Signal) {
    if let Ok(None) = child.try_wait() {
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits in i32"));
        let _ = kill(pid, signal);
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}
