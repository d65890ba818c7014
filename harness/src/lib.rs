//! Integration-test harness: real components as child processes, killed on drop, and
//! waits on conditions with deadlines (never fixed sleeps as synchronisation).
//!
//! ```text
//! PgCluster      throwaway PostgreSQL (initdb + postgres on a free port, temp dir)
//! KafkaBroker    throwaway Apache Kafka (KRaft, one JVM, free ports, temp dir)
//! DebeziumConnect Kafka Connect standalone with Debezium's PostgreSQL connector and
//!                outbox router (the benchmark's side-by-side contender)
//! RelayProcess   the outbox-relay binary, stdout lines and stderr captured
//! MemorySink     an in-memory sink for in-process runs of `relay::run`, scripted
//! ChildProcess   any captured child process (RelayProcess derefs to it)
//! TestPki        a CA, server and client certificates as PEM files (rcgen)
//! wait_until     poll a condition every 50 ms until a deadline
//! procstat       CPU time and peak memory of processes, from /proc (the benchmark)
//! stats          percentiles (the benchmark's latency)
//! ```
//!
//! A crate of its own, shared by the integration tests (`use outbox_relay_harness as
//! support;`), the demo (`deploy/demo.sh` runs its `demo` binary) and the benchmark, so
//! PostgreSQL and Kafka are bootstrapped in one place.

pub mod chaos;
pub mod chart;
pub mod debezium;
pub mod kafka;
pub mod memory_sink;
pub mod outbox;
pub mod pg;
pub mod process;
pub mod procstat;
pub mod proxy;
pub mod relay;
pub mod stats;
pub mod tls;
pub mod wait;

pub use kafka::{
    consume, create_topic, list_topics, produce, produce_records, read_all, try_produce_records,
    Delivered, KafkaBroker, OutgoingRecord, Record, SharedBroker,
};
pub use pg::{lsn_to_u64, query_lsn, u64_to_lsn, PgCluster, PgOptions, ServerTls};
pub use process::ChildProcess;
pub use relay::{run_relay_to_exit, RelayProcess};
pub use wait::{wait_for, wait_until};

/// The repository's root directory (`sql/`, `deploy/`).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(
            || std::path::PathBuf::from(".."),
            std::path::Path::to_path_buf,
        )
}

/// The relay binary of the same build as the running executable: `OUTBOX_RELAY_BIN`
/// when set, else `outbox-relay` in the executable's target directory (an integration
/// test runs from `target/<profile>/deps/`, a harness binary from `target/<profile>/`).
pub fn relay_bin() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_RELAY_BIN") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the path of the running executable");
    let mut dir = exe
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    if dir.ends_with("deps") || dir.ends_with("examples") {
        dir.pop();
    }
    dir.join("outbox-relay")
}

/// `GET path` on 127.0.0.1:port (HTTP/1.0, so no chunked body): status code and body,
/// `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}
