//! PostgreSQL side: the replication connection, WAL positions, replication frames, the
//! pgoutput decoder and slot/publication management.

pub mod auth;
pub mod config;
pub mod conn;
pub mod diagnose;
pub mod framing;
pub mod pgoutput;
pub mod pgoutput_reader;
pub mod pgoutput_values;
pub mod publication;
pub mod replication;
pub mod slot;
pub mod source;
pub mod sql;
pub mod state;
pub mod tls;
pub mod url;

pub use crate::lsn::Lsn;
