//! Pure decoder for the `pgoutput` logical replication protocol, versions 1 to 4.
//!
//! Input is the payload of one XLogData message (`&Bytes`); output is a typed
//! [`PgOutputMessage`]. Column values are `Bytes` slices of that payload (a reference
//! count, not a copy per column: the relay's hottest allocation before). No I/O, no panics on any input: every length read off the wire
//! is untrusted and bounds-checked.
//!
//! ```text
//! XLogData payload ──▶ decode(buf, StreamState) ──▶ PgOutputMessage | DecodeError
//!                      Decoder: tracks StreamState from Stream Start / Stream Stop
//! ```
//!
//! - One call decodes exactly one message: too few bytes is [`DecodeError::Truncated`],
//!   bytes left over is [`DecodeError::Invalid`]. Both are fatal for a replication
//!   stream, since the walsender always sends whole messages.
//! - Between Stream Start and Stream Stop, Relation, Type, Insert, Update, Delete,
//!   Truncate and Message carry a leading xid: that of the *subtransaction* that made the
//!   change, which can differ from the Stream Start xid (seen in the PostgreSQL 15
//!   fixtures). A Stream Abort names both.
//! - Stream Abort has two forms told apart only by length: 9 bytes, or 25 with the
//!   protocol v4 `streaming = parallel` abort LSN and timestamp.
//! - Fixtures captured from PostgreSQL 15 (`tests/fixtures/pgoutput/`) pin the decoding of
//!   every message type; `fuzz/` fuzzes [`decode`], the one entry point production uses
//!   too ([`Decoder`] only tracks the stream state around it).
//! - **Versions 2 to 4 are decoded, not used.** The relay asks for `proto_version '1'`
//!   without streaming or two-phase, so Stream Start/Stop/Commit/Abort/Prepare, Begin
//!   Prepare, Prepare, Commit Prepared and Rollback Prepared never come; they are decoded
//!   here for the fuzzers and for a future streaming mode, and the transaction assembler
//!   refuses them (`relay::txn`, `AssemblyError::Unexpected`).
//! - The bounds-checked cursor lives in [`crate::pg::pgoutput_reader`], the values both
//!   share (tuples, timestamps, the stream state, the error) in
//!   [`crate::pg::pgoutput_values`], re-exported here; neither imports this module.

use bytes::Bytes;

use crate::pg::pgoutput_reader::Reader;
pub use crate::pg::pgoutput_values::{
    ColumnValue, DecodeError, PgTimestamp, StreamState, TupleData,
};
use crate::Lsn;

/// Column description of a Relation message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    /// Part of the replica identity key (flag bit 1).
    pub is_key: bool,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationBody {
    pub xid: Option<u32>,
    pub relation_id: u32,
    pub namespace: String,
    pub name: String,
    /// Replica identity setting: b'd' default, b'n' nothing, b'f' full, b'i' index.
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// The old tuple of an Update or Delete: key columns only, or the full old row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// `K`: replica identity key columns.
    Key(TupleData),
    /// `O`: full old row (REPLICA IDENTITY FULL).
    Old(TupleData),
}

/// Every message of pgoutput protocol versions 1–4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PgOutputMessage {
    Begin {
        final_lsn: Lsn,
        commit_ts: PgTimestamp,
        xid: u32,
    },
    Commit {
        flags: u8,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_ts: PgTimestamp,
    },
    Origin {
        commit_lsn: Lsn,
        name: String,
    },
    Relation(RelationBody),
    Type {
        xid: Option<u32>,
        type_oid: u32,
        namespace: String,
        name: String,
    },
    Insert {
        xid: Option<u32>,
        relation_id: u32,
        new_tuple: TupleData,
    },
    Update {
        xid: Option<u32>,
        relation_id: u32,
        old_tuple: Option<OldTuple>,
        new_tuple: TupleData,
    },
    Delete {
        xid: Option<u32>,
        relation_id: u32,
        old_tuple: OldTuple,
    },
    Truncate {
        xid: Option<u32>,
        /// Bit 1: CASCADE, bit 2: RESTART IDENTITY.
        options: u8,
        relation_ids: Vec<u32>,
    },
    /// Logical decoding message (`pg_logical_emit_message`).
    Message {
        xid: Option<u32>,
        /// Bit 1: transactional.
        flags: u8,
        lsn: Lsn,
        prefix: String,
        content: Bytes,
    },
    StreamStart {
        xid: u32,
        first_segment: bool,
    },
    StreamStop,
    StreamCommit {
        xid: u32,
        flags: u8,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_ts: PgTimestamp,
    },
    StreamAbort {
        xid: u32,
        subxid: u32,
        /// Present in protocol v4 with `streaming = parallel`.
        abort_lsn: Option<Lsn>,
        abort_ts: Option<PgTimestamp>,
    },
    BeginPrepare {
        prepare_lsn: Lsn,
        end_lsn: Lsn,
        prepare_ts: PgTimestamp,
        xid: u32,
        gid: String,
    },
    Prepare {
        flags: u8,
        prepare_lsn: Lsn,
        end_lsn: Lsn,
        prepare_ts: PgTimestamp,
        xid: u32,
        gid: String,
    },
    CommitPrepared {
        flags: u8,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_ts: PgTimestamp,
        xid: u32,
        gid: String,
    },
    RollbackPrepared {
        flags: u8,
        prepare_end_lsn: Lsn,
        rollback_end_lsn: Lsn,
        prepare_ts: PgTimestamp,
        rollback_ts: PgTimestamp,
        xid: u32,
        gid: String,
    },
    StreamPrepare {
        flags: u8,
        prepare_lsn: Lsn,
        end_lsn: Lsn,
        prepare_ts: PgTimestamp,
        xid: u32,
        gid: String,
    },
}

/// A stateful wrapper around [`decode`] that follows Stream Start / Stream Stop, so the
/// caller does not have to track [`StreamState`] itself.
///
/// A Stream Start while already inside a stream, or a Stream Stop outside one, is a
/// protocol violation: it is reported as [`DecodeError::Invalid`] and leaves the state
/// unchanged.
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    stream: StreamState,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the next message is expected between Stream Start and Stream Stop.
    pub fn stream_state(&self) -> StreamState {
        self.stream
    }

    /// Decode one message and update the stream state from it.
    pub fn decode(&mut self, buf: &Bytes) -> Result<PgOutputMessage, DecodeError> {
        let message = decode(buf, self.stream)?;
        self.stream = match (&message, self.stream) {
            (PgOutputMessage::StreamStart { .. }, StreamState::Outside) => {
                StreamState::InsideStream
            }
            (PgOutputMessage::StreamStop, StreamState::InsideStream) => StreamState::Outside,
            (PgOutputMessage::StreamStart { .. }, _) => return Err(out_of_order("Stream Start")),
            (PgOutputMessage::StreamStop, _) => return Err(out_of_order("Stream Stop")),
            _ => self.stream,
        };
        Ok(message)
    }
}

fn out_of_order(message: &'static str) -> DecodeError {
    DecodeError::Invalid {
        message,
        offset: 0,
        reason: "stream start and stream stop must alternate".to_owned(),
    }
}

/// Decode one pgoutput message from the payload of an XLogData frame.
///
/// `stream` says whether the message was sent between Stream Start and Stream Stop (see
/// [`Decoder`] for a wrapper that tracks it). The whole of `buf` must be one message:
/// missing bytes give [`DecodeError::Truncated`], bytes left over give
/// [`DecodeError::Invalid`].
pub fn decode(bytes: &Bytes, stream: StreamState) -> Result<PgOutputMessage, DecodeError> {
    let buf: &[u8] = bytes;
    let (&tag, _) = buf.split_first().ok_or(DecodeError::Empty)?;
    let name = tag_name(tag).ok_or(DecodeError::UnknownTag { tag })?;
    let mut r = Reader {
        buf,
        bytes,
        pos: 1,
        message: name,
    };
    let message = match tag {
        b'B' => PgOutputMessage::Begin {
            final_lsn: r.lsn()?,
            commit_ts: r.timestamp()?,
            xid: r.u32()?,
        },
        b'C' => PgOutputMessage::Commit {
            flags: r.u8()?,
            commit_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            commit_ts: r.timestamp()?,
        },
        b'O' => PgOutputMessage::Origin {
            commit_lsn: r.lsn()?,
            name: r.string()?,
        },
        b'R' => PgOutputMessage::Relation(relation(&mut r, stream)?),
        b'Y' => PgOutputMessage::Type {
            xid: r.stream_xid(stream)?,
            type_oid: r.u32()?,
            namespace: r.string()?,
            name: r.string()?,
        },
        b'I' => {
            let xid = r.stream_xid(stream)?;
            let relation_id = r.u32()?;
            r.marker(b"N", "new tuple marker 'N'")?;
            let new_tuple = r.tuple()?;
            PgOutputMessage::Insert {
                xid,
                relation_id,
                new_tuple,
            }
        }
        b'U' => {
            let xid = r.stream_xid(stream)?;
            let relation_id = r.u32()?;
            let old_tuple = match r.marker(b"KON", "tuple marker 'K', 'O' or 'N'")? {
                b'K' => Some(OldTuple::Key(r.tuple()?)),
                b'O' => Some(OldTuple::Old(r.tuple()?)),
                _ => None,
            };
            if old_tuple.is_some() {
                r.marker(b"N", "new tuple marker 'N'")?;
            }
            let new_tuple = r.tuple()?;
            PgOutputMessage::Update {
                xid,
                relation_id,
                old_tuple,
                new_tuple,
            }
        }
        b'D' => {
            let xid = r.stream_xid(stream)?;
            let relation_id = r.u32()?;
            let old_tuple = match r.marker(b"KO", "old tuple marker 'K' or 'O'")? {
                b'K' => OldTuple::Key(r.tuple()?),
                _ => OldTuple::Old(r.tuple()?),
            };
            PgOutputMessage::Delete {
                xid,
                relation_id,
                old_tuple,
            }
        }
        b'T' => {
            let xid = r.stream_xid(stream)?;
            let count = r.count_i32("relation count")?;
            let options = r.u8()?;
            let mut relation_ids = Vec::with_capacity(count.min(r.remaining() / 4));
            for _ in 0..count {
                relation_ids.push(r.u32()?);
            }
            PgOutputMessage::Truncate {
                xid,
                options,
                relation_ids,
            }
        }
        b'M' => {
            let xid = r.stream_xid(stream)?;
            let flags = r.u8()?;
            let lsn = r.lsn()?;
            let prefix = r.string()?;
            let length = r.count_i32("content length")?;
            PgOutputMessage::Message {
                xid,
                flags,
                lsn,
                prefix,
                content: r.take_bytes(length)?,
            }
        }
        b'S' => PgOutputMessage::StreamStart {
            xid: r.u32()?,
            first_segment: r.marker(&[0, 1], "first segment flag 0 or 1")? == 1,
        },
        b'E' => PgOutputMessage::StreamStop,
        b'c' => PgOutputMessage::StreamCommit {
            xid: r.u32()?,
            flags: r.u8()?,
            commit_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            commit_ts: r.timestamp()?,
        },
        b'A' => {
            let xid = r.u32()?;
            let subxid = r.u32()?;
            // Protocol v4 with streaming = parallel appends the abort LSN and timestamp;
            // nothing in the message says which form it is, only its length.
            let (abort_lsn, abort_ts) = match r.remaining() {
                0 => (None, None),
                16 => (Some(r.lsn()?), Some(r.timestamp()?)),
                other => {
                    return Err(r.invalid(format!(
                        "{other} bytes after subxid, expected 0 or 16 (abort LSN and timestamp)"
                    )));
                }
            };
            PgOutputMessage::StreamAbort {
                xid,
                subxid,
                abort_lsn,
                abort_ts,
            }
        }
        b'b' => PgOutputMessage::BeginPrepare {
            prepare_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            prepare_ts: r.timestamp()?,
            xid: r.u32()?,
            gid: r.string()?,
        },
        b'P' => PgOutputMessage::Prepare {
            flags: r.u8()?,
            prepare_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            prepare_ts: r.timestamp()?,
            xid: r.u32()?,
            gid: r.string()?,
        },
        b'K' => PgOutputMessage::CommitPrepared {
            flags: r.u8()?,
            commit_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            commit_ts: r.timestamp()?,
            xid: r.u32()?,
            gid: r.string()?,
        },
        b'r' => PgOutputMessage::RollbackPrepared {
            flags: r.u8()?,
            prepare_end_lsn: r.lsn()?,
            rollback_end_lsn: r.lsn()?,
            prepare_ts: r.timestamp()?,
            rollback_ts: r.timestamp()?,
            xid: r.u32()?,
            gid: r.string()?,
        },
        b'p' => PgOutputMessage::StreamPrepare {
            flags: r.u8()?,
            prepare_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            prepare_ts: r.timestamp()?,
            xid: r.u32()?,
            gid: r.string()?,
        },
        _ => return Err(DecodeError::UnknownTag { tag }),
    };
    r.finish()?;
    Ok(message)
}

/// The documented name of the message with this tag, `None` for an unknown tag.
fn tag_name(tag: u8) -> Option<&'static str> {
    Some(match tag {
        b'B' => "Begin",
        b'C' => "Commit",
        b'O' => "Origin",
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        b'S' => "Stream Start",
        b'E' => "Stream Stop",
        b'c' => "Stream Commit",
        b'A' => "Stream Abort",
        b'b' => "Begin Prepare",
        b'P' => "Prepare",
        b'K' => "Commit Prepared",
        b'r' => "Rollback Prepared",
        b'p' => "Stream Prepare",
        _ => return None,
    })
}

fn relation(r: &mut Reader<'_>, stream: StreamState) -> Result<RelationBody, DecodeError> {
    let xid = r.stream_xid(stream)?;
    let relation_id = r.u32()?;
    let namespace = r.string()?;
    let name = r.string()?;
    let replica_identity = r.u8()?;
    let count = r.count_i16("column count")?;
    // A column takes at least 10 bytes: flags, an empty name's NUL, type OID, modifier.
    let mut columns = Vec::with_capacity(count.min(r.remaining() / 10));
    for _ in 0..count {
        let flags = r.u8()?;
        columns.push(RelationColumn {
            is_key: flags & 1 != 0,
            name: r.string()?,
            type_oid: r.u32()?,
            type_modifier: r.i32()?,
        });
    }
    Ok(RelationBody {
        xid,
        relation_id,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

#[cfg(test)]
#[path = "pgoutput_tests.rs"]
mod tests;
