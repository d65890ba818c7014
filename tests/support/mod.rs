//! Integration-test harness: real components as child processes, killed on drop, and
//! waits on conditions with deadlines (never fixed sleeps as synchronisation).
//!
//! ```text
//! PgCluster      throwaway PostgreSQL (initdb + postgres on a free port, temp dir)
//! KafkaBroker    throwaway Apache Kafka (KRaft, one JVM, free ports, temp dir)
//! RelayProcess   the outbox-relay binary, stdout lines and stderr captured
//! MemorySink     an in-memory sink for in-process runs of `relay::run`, scripted
//! ChildProcess   any captured child process (RelayProcess derefs to it)
//! wait_until     poll a condition every 50 ms until a deadline
//! ```
//!
//! Each `tests/*.rs` does `mod support;` and uses a subset, hence the `allow`s.
#![allow(dead_code, unused_imports)]

pub mod chaos;
pub mod kafka;
pub mod memory_sink;
pub mod outbox;
pub mod pg;
pub mod process;
pub mod proxy;
pub mod relay;
pub mod wait;

pub use kafka::{
    consume, create_topic, list_topics, produce, produce_records, read_all, try_produce_records,
    Delivered, KafkaBroker, OutgoingRecord, Record, SharedBroker,
};
pub use pg::{lsn_to_u64, query_lsn, u64_to_lsn, PgCluster, PgOptions};
pub use process::ChildProcess;
pub use relay::{run_relay_to_exit, RelayProcess};
pub use wait::{wait_for, wait_until};
