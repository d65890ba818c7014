//! Reaching a running cluster: its port, URLs and connection strings, superuser
//! clients and statements, the positions tests ask for (a slot's confirmed flush, the
//! current WAL), its version and binaries; and PostgreSQL's `X/Y` LSN text.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use postgres::{Client, NoTls, SimpleQueryMessage};

use super::{PgCluster, SUPERUSER};

impl PgCluster {
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

    /// `server_version_num`, e.g. 170010 for 17.10: for expectations that differ by
    /// PostgreSQL version.
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

    pub(super) fn connect_config(&self, db: &str) -> postgres::Config {
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
