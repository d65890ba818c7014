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
