//! outbox-relay: a Change Data Capture relay for the transactional outbox pattern.
//!
//! ```text
//! PostgreSQL ──(replication=database, START_REPLICATION … LOGICAL, pgoutput)──▶
//!   pg::replication   CopyBoth frames: XLogData 'w', keepalive 'k'  ◀── standby status 'r'
//!   pg::pgoutput      pure decoder: bytes → typed message
//!   relay::txn        Begin..Commit assembly, relation cache
//!   relay::router     pure: (relation, row) → OutboxEvent
//!   sink              stdout (embedded default) or Kafka; delivery reports
//!   relay::ack        in-order tracker: highest end_lsn whose whole prefix is delivered
//!         └──────────▶ flush LSN back to pg::replication (timer + on reply request)
//! ```
//!
//! Pure parts (decoder, router, ack tracker) take values and return values; the I/O
//! parts (`pg::conn`, `relay::pipeline`, `sink`) are thin. The operator commands beside
//! `run` (check, init, slot, cleanup, backfill) are [`ops`], which uses the relay and
//! which nothing that streams uses.
#![forbid(unsafe_code)]

pub use lsn::Lsn;

pub mod config;
pub mod event;
pub mod lsn;
pub mod metrics;
pub mod ops;
pub mod pg;
pub mod relay;
pub mod sink;
