//! The values of the `pgoutput` decoder that its cursor ([`crate::pg::pgoutput_reader`])
//! produces too: column values and tuples, timestamps, the stream state and the decode
//! error. A leaf: the decoder ([`crate::pg::pgoutput`], which re-exports them) and the
//! cursor both import it, and it imports neither.

use bytes::Bytes;

/// Microseconds since 2000-01-01 00:00:00 UTC, as PostgreSQL sends timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgTimestamp(pub i64);

impl PgTimestamp {
    /// Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01).
    const UNIX_OFFSET_MICROS: i64 = 946_684_800_000_000;

    /// Milliseconds since the Unix epoch (saturating).
    pub fn unix_millis(self) -> i64 {
        self.0.saturating_add(Self::UNIX_OFFSET_MICROS) / 1000
    }
}

/// Whether the decoder is between Stream Start and Stream Stop: inside a stream, data
/// messages (Relation, Type, Insert, Update, Delete, Truncate, Message) carry an extra
/// leading transaction id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamState {
    #[default]
    Outside,
    InsideStream,
}

/// One column value of a tuple, honouring the per-column kind byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnValue {
    /// `n`: SQL NULL.
    Null,
    /// `u`: unchanged TOASTed value; the value itself is not sent.
    UnchangedToast,
    /// `t`: text format.
    Text(Bytes),
    /// `b`: binary format.
    Binary(Bytes),
}

/// Tuple data: one value per column of the relation, in relation column order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TupleData {
    pub columns: Vec<ColumnValue>,
}

/// Why a pgoutput message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("empty pgoutput message")]
    Empty,
    #[error("unknown pgoutput message tag {tag:#04x}")]
    UnknownTag { tag: u8 },
    #[error("truncated {message} message: needed {needed} more bytes at offset {offset}")]
    Truncated {
        message: &'static str,
        offset: usize,
        needed: usize,
    },
    #[error("invalid {message} message at offset {offset}: {reason}")]
    Invalid {
        message: &'static str,
        offset: usize,
        reason: String,
    },
}
