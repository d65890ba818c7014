//! The cluster's place on this machine: finding `initdb` and `postgres`, the OS user
//! they run as (`postgres` when the tests run as root), the cluster's temp directory and
//! a standby's copied data directory, the server's TLS files, `pg_hba.conf`, a free
//! port, and signals to the server.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};
use tempfile::TempDir;

use super::ServerTls;

#[derive(Debug, Clone)]
pub(super) struct PgBinaries {
    pub(super) initdb: PathBuf,
    pub(super) postgres: PathBuf,
}

impl PgBinaries {
    pub(super) fn in_dir(bindir: &Path) -> Self {
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
pub(super) fn pg_binaries() -> &'static PgBinaries {
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
pub(super) fn run_as() -> Option<&'static User> {
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
pub(super) fn server_command(program: &Path, dir: &Path) -> Command {
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

/// A fresh temp dir for a cluster, owned by the server's OS user.
pub(super) fn new_cluster_dir() -> TempDir {
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
pub(super) fn copy_data_dir(from: &Path, to: &Path) {
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

pub(super) fn chown_tree(path: &Path, user: &User) {
    std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw()))
        .unwrap_or_else(|err| panic!("chown {}: {err}", path.display()));
    if path.is_dir() {
        for entry in std::fs::read_dir(path).expect("reading dir") {
            chown_tree(&entry.expect("dir entry").path(), user);
        }
    }
}

/// Where to create cluster dirs. When running as root the dir must be reachable by the
/// `postgres` user: if some ancestor of `$TMPDIR` is not world-searchable, use /tmp.
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
pub(super) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// Copies the server's TLS files into the cluster dir (readable by the server's OS
/// user; the key 0600, as PostgreSQL requires) and returns the settings naming them.
pub(super) fn install_server_tls(dir: &Path, tls: &ServerTls) -> Vec<(&'static str, String)> {
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
pub(super) fn write_hba_without_host_lines(hba_path: &Path, lines: &[String]) {
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

pub(super) fn prepend_hba_lines(hba_path: &Path, lines: &[String]) {
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
pub(super) fn signal_child(child: &mut Child, signal: Signal) {
    if let Ok(None) = child.try_wait() {
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits in i32"));
        let _ = kill(pid, signal);
    }
}
