//! Streaming replication frames carried in CopyData during CopyBoth mode.
//!
//! Server → client: XLogData (`'w'`) and primary keepalive (`'k'`).
//! Client → server: standby status update (`'r'`).
//!
//! Pure: bytes in, typed values out, and the reverse for the status update.

use bytes::{BufMut, Bytes, BytesMut};

use crate::pg::pgoutput::PgTimestamp;
use crate::Lsn;

/// One server → client replication frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationFrame {
    XLogData(XLogData),
    Keepalive(PrimaryKeepalive),
}

/// `'w'`: a chunk of logical decoding output (one pgoutput message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    /// Start of the WAL data in this message. Zero for messages that are not the last
    /// of a WAL record (Relation, Begin followed by Origin): not a progress marker.
    pub wal_start: Lsn,
    /// Current end of WAL on the server. Not a progress marker either.
    pub wal_end: Lsn,
    pub send_time: PgTimestamp,
    pub data: Bytes,
}

/// `'k'`: primary keepalive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrimaryKeepalive {
    /// The walsender's last sent position: everything before it has been sent.
    pub wal_end: Lsn,
    pub send_time: PgTimestamp,
    /// The server asks for a status update at once (it is about to time us out).
    pub reply_requested: bool,
}

/// Why a replication frame could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("empty replication frame")]
    Empty,
    #[error("unknown replication frame tag {tag:#04x}")]
    UnknownTag { tag: u8 },
    #[error("truncated {kind} frame: {len} bytes, at least {min} expected")]
    Truncated {
        kind: &'static str,
        len: usize,
        min: usize,
    },
    #[error("keepalive frame has {extra} trailing bytes")]
    TrailingBytes { extra: usize },
}

const XLOG_HEADER_LEN: usize = 1 + 8 + 8 + 8;
const KEEPALIVE_LEN: usize = 1 + 8 + 8 + 1;

fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

impl ReplicationFrame {
    /// Parse the payload of one CopyData message received in CopyBoth mode.
    pub fn parse(payload: Bytes) -> Result<Self, FrameError> {
        let tag = *payload.first().ok_or(FrameError::Empty)?;
        match tag {
            b'w' => {
                if payload.len() < XLOG_HEADER_LEN {
                    return Err(FrameError::Truncated {
                        kind: "XLogData",
                        len: payload.len(),
                        min: XLOG_HEADER_LEN,
                    });
                }
                Ok(ReplicationFrame::XLogData(XLogData {
                    wal_start: Lsn(be_u64(&payload, 1)),
                    wal_end: Lsn(be_u64(&payload, 9)),
                    send_time: PgTimestamp(be_u64(&payload, 17) as i64),
                    data: payload.slice(XLOG_HEADER_LEN..),
                }))
            }
            b'k' => {
                if payload.len() < KEEPALIVE_LEN {
                    return Err(FrameError::Truncated {
                        kind: "keepalive",
                        len: payload.len(),
                        min: KEEPALIVE_LEN,
                    });
                }
                if payload.len() > KEEPALIVE_LEN {
                    return Err(FrameError::TrailingBytes {
                        extra: payload.len() - KEEPALIVE_LEN,
                    });
                }
                Ok(ReplicationFrame::Keepalive(PrimaryKeepalive {
                    wal_end: Lsn(be_u64(&payload, 1)),
                    send_time: PgTimestamp(be_u64(&payload, 9) as i64),
                    reply_requested: payload[17] != 0,
                }))
            }
            tag => Err(FrameError::UnknownTag { tag }),
        }
    }
}

/// `'r'`: standby status update. Positions are "last byte + 1"; only `flush` moves a
/// logical slot's `confirmed_flush_lsn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandbyStatusUpdate {
    pub write: Lsn,
    pub flush: Lsn,
    pub apply: Lsn,
    pub client_time: PgTimestamp,
    pub reply_requested: bool,
}

impl StandbyStatusUpdate {
    pub const LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;

    /// The CopyData payload for this update.
    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(Self::LEN);
        out.put_u8(b'r');
        out.put_u64(self.write.0);
        out.put_u64(self.flush.0);
        out.put_u64(self.apply.0);
        out.put_i64(self.client_time.0);
        out.put_u8(u8::from(self.reply_requested));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keepalive_bytes(wal_end: u64, reply: u8) -> Vec<u8> {
        let mut v = vec![b'k'];
        v.extend_from_slice(&wal_end.to_be_bytes());
        v.extend_from_slice(&42i64.to_be_bytes());
        v.push(reply);
        v
    }

    #[test]
    fn parses_xlogdata_and_keeps_payload() {
        let mut v = vec![b'w'];
        v.extend_from_slice(&0x10u64.to_be_bytes());
        v.extend_from_slice(&0x20u64.to_be_bytes());
        v.extend_from_slice(&7i64.to_be_bytes());
        v.extend_from_slice(b"Bpayload");
        let frame = ReplicationFrame::parse(Bytes::from(v)).unwrap();
        let ReplicationFrame::XLogData(x) = frame else {
            panic!("expected XLogData, got {frame:?}")
        };
        assert_eq!(x.wal_start, Lsn(0x10));
        assert_eq!(x.wal_end, Lsn(0x20));
        assert_eq!(x.send_time, PgTimestamp(7));
        assert_eq!(&x.data[..], b"Bpayload");
    }

    #[test]
    fn parses_keepalive_reply_flag() {
        for (flag, expected) in [(0u8, false), (1, true)] {
            let frame = ReplicationFrame::parse(Bytes::from(keepalive_bytes(99, flag))).unwrap();
            assert_eq!(
                frame,
                ReplicationFrame::Keepalive(PrimaryKeepalive {
                    wal_end: Lsn(99),
                    send_time: PgTimestamp(42),
                    reply_requested: expected,
                })
            );
        }
    }

    #[test]
    fn truncated_and_garbage_frames_are_errors() {
        let ka = keepalive_bytes(5, 1);
        for len in 0..ka.len() {
            assert!(ReplicationFrame::parse(Bytes::copy_from_slice(&ka[..len])).is_err());
        }
        let mut long = ka.clone();
        long.push(0);
        assert_eq!(
            ReplicationFrame::parse(Bytes::from(long)),
            Err(FrameError::TrailingBytes { extra: 1 })
        );
        for len in 0..XLOG_HEADER_LEN {
            let mut v = vec![b'w'];
            v.resize(len.max(1), 0);
            assert!(ReplicationFrame::parse(Bytes::from(v)).is_err());
        }
        assert_eq!(
            ReplicationFrame::parse(Bytes::from_static(b"zzz")),
            Err(FrameError::UnknownTag { tag: b'z' })
        );
    }

    #[test]
    fn status_update_layout() {
        let mut out = BytesMut::new();
        StandbyStatusUpdate {
            write: Lsn(1),
            flush: Lsn(2),
            apply: Lsn(3),
            client_time: PgTimestamp(4),
            reply_requested: false,
        }
        .encode(&mut out);
        assert_eq!(out.len(), StandbyStatusUpdate::LEN);
        assert_eq!(out[0], b'r');
        assert_eq!(&out[1..9], &1u64.to_be_bytes());
        assert_eq!(&out[9..17], &2u64.to_be_bytes());
        assert_eq!(&out[17..25], &3u64.to_be_bytes());
        assert_eq!(&out[25..33], &4i64.to_be_bytes());
        assert_eq!(out[33], 0);
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = ReplicationFrame::parse(Bytes::from(bytes));
        }
    }
}
