//! The operator commands beside `run`: `check`, `init`, `slot`, `cleanup` and
//! `backfill`. They use the relay's parts (its settings, router, ack tracker, the
//! PostgreSQL side and the sinks); nothing that runs while streaming uses them.

pub mod admin;
pub mod check;
pub mod repair;
