//! Tests for the pgoutput decoder: real PostgreSQL 15 output captured by
//! `tests/fixtures/pgoutput/capture.sh`, hand-built messages for what PostgreSQL 15
//! cannot send, malformed input, and property tests.
//!
//! This file holds what the tests share: the fixtures and their reader, value
//! helpers, the [`Wire`] builder for hand-made messages and the test encoder. The tests
//! are in `pgoutput_tests/`, one file per part of the decoder: `v1.rs` (what the relay
//! streams), `streaming.rs` (version 2 and the stream state), `two_phase.rs` (version
//! 3), `malformed.rs` and `properties.rs`.

use super::*;
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap};

#[path = "pgoutput_tests/malformed.rs"]
mod malformed;
#[path = "pgoutput_tests/properties.rs"]
mod properties;
#[path = "pgoutput_tests/streaming.rs"]
mod streaming;
#[path = "pgoutput_tests/two_phase.rs"]
mod two_phase;
#[path = "pgoutput_tests/v1.rs"]
mod v1;

const V1_TEXT: &str = include_str!("../../tests/fixtures/pgoutput/v1_text.hex");
const V1_BINARY: &str = include_str!("../../tests/fixtures/pgoutput/v1_binary.hex");
const V2_STREAM: &str = include_str!("../../tests/fixtures/pgoutput/v2_stream.hex");
const V3_TWO_PHASE: &str = include_str!("../../tests/fixtures/pgoutput/v3_two_phase.hex");
const ALL_FIXTURES: [(&str, &str); 4] = [
    ("v1_text", V1_TEXT),
    ("v1_binary", V1_BINARY),
    ("v2_stream", V2_STREAM),
    ("v3_two_phase", V3_TWO_PHASE),
];

/// The decoder on a copy of `buf`: the tests build their messages as `Vec<u8>`.
fn decode(buf: &[u8], state: StreamState) -> Result<PgOutputMessage, DecodeError> {
    super::decode(&Bytes::copy_from_slice(buf), state)
}

const INT4_OID: u32 = 23;
const INT8_OID: u32 = 20;
const TEXT_OID: u32 = 25;
const VARCHAR_OID: u32 = 1043;
const JSONB_OID: u32 = 3802;

/// One line of a fixture file: the columns `pg_logical_slot_peek_binary_changes`
/// returned for one message.
#[derive(Debug)]
struct Captured {
    line: usize,
    tag: u8,
    lsn: Lsn,
    xid: u32,
    bytes: Vec<u8>,
}

fn parse_hex(text: &str) -> Vec<u8> {
    text.as_bytes()
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).expect("ascii");
            assert_eq!(pair.len(), 2, "odd hex length");
            u8::from_str_radix(pair, 16).expect("hex digit")
        })
        .collect()
}

fn parse_fixture(text: &str) -> Vec<Captured> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(index, line)| {
            let fields: Vec<&str> = line.split(' ').collect();
            let [tag, lsn, xid, hex] = fields[..] else {
                panic!("line {}: expected 4 fields: {line}", index + 1)
            };
            let bytes = parse_hex(hex);
            assert_eq!(tag.as_bytes(), &bytes[..1], "line {}", index + 1);
            Captured {
                line: index + 1,
                tag: bytes[0],
                lsn: lsn.parse().expect("lsn"),
                xid: xid.parse().expect("xid"),
                bytes,
            }
        })
        .collect()
}

/// Decode a whole fixture in order with a [`Decoder`], which tracks stream state.
fn decode_fixture(text: &str) -> Vec<(Captured, StreamState, PgOutputMessage)> {
    let mut decoder = Decoder::new();
    parse_fixture(text)
        .into_iter()
        .map(|captured| {
            let state = decoder.stream_state();
            let message = decoder
                .decode(&Bytes::from(captured.bytes.clone()))
                .unwrap_or_else(|err| panic!("line {}: {err}", captured.line));
            (captured, state, message)
        })
        .collect()
}

fn messages(text: &str) -> Vec<PgOutputMessage> {
    decode_fixture(text)
        .into_iter()
        .map(|(_, _, m)| m)
        .collect()
}

fn text(value: &str) -> ColumnValue {
    ColumnValue::Text(Bytes::copy_from_slice(value.as_bytes()))
}

fn binary(value: &[u8]) -> ColumnValue {
    ColumnValue::Binary(Bytes::copy_from_slice(value))
}

fn tuple(columns: Vec<ColumnValue>) -> TupleData {
    TupleData { columns }
}

fn relations(messages: &[PgOutputMessage]) -> HashMap<String, RelationBody> {
    messages
        .iter()
        .filter_map(|m| match m {
            PgOutputMessage::Relation(body) => Some((body.name.clone(), body.clone())),
            _ => None,
        })
        .collect()
}

/// `(name, type OID, type modifier, is_key)` of each column.
fn column_summary(body: &RelationBody) -> Vec<(&str, u32, i32, bool)> {
    body.columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_oid, c.type_modifier, c.is_key))
        .collect()
}

// ------------------------------------------------------------------- hand-built messages

/// A little builder for hand-made messages in tests.
#[derive(Default)]
struct Wire(Vec<u8>);

impl Wire {
    fn tag(tag: u8) -> Self {
        Wire(vec![tag])
    }
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(v);
        self
    }
    fn cstr(self, v: &[u8]) -> Self {
        self.bytes(v).u8(0)
    }
    fn tuple(mut self, t: &TupleData) -> Self {
        let count = i16::try_from(t.columns.len()).expect("test tuple too wide");
        self = self.i16(count);
        for column in &t.columns {
            self = match column {
                ColumnValue::Null => self.u8(b'n'),
                ColumnValue::UnchangedToast => self.u8(b'u'),
                ColumnValue::Text(v) => self.u8(b't').i32(v.len() as i32).bytes(v),
                ColumnValue::Binary(v) => self.u8(b'b').i32(v.len() as i32).bytes(v),
            };
        }
        self
    }
    fn xid(self, xid: Option<u32>) -> Self {
        match xid {
            Some(xid) => self.u32(xid),
            None => self,
        }
    }
}

fn state_for(xid: Option<u32>) -> StreamState {
    match xid {
        Some(_) => StreamState::InsideStream,
        None => StreamState::Outside,
    }
}

/// Encoder for the messages the round-trip property covers.
fn encode(message: &PgOutputMessage) -> Vec<u8> {
    let old = |w: Wire, old: &OldTuple| match old {
        OldTuple::Key(t) => w.u8(b'K').tuple(t),
        OldTuple::Old(t) => w.u8(b'O').tuple(t),
    };
    match message {
        PgOutputMessage::Begin {
            final_lsn,
            commit_ts,
            xid,
        } => Wire::tag(b'B').u64(final_lsn.0).i64(commit_ts.0).u32(*xid),
        PgOutputMessage::Commit {
            flags,
            commit_lsn,
            end_lsn,
            commit_ts,
        } => Wire::tag(b'C')
            .u8(*flags)
            .u64(commit_lsn.0)
            .u64(end_lsn.0)
            .i64(commit_ts.0),
        PgOutputMessage::Insert {
            xid,
            relation_id,
            new_tuple,
        } => Wire::tag(b'I')
            .xid(*xid)
            .u32(*relation_id)
            .u8(b'N')
            .tuple(new_tuple),
        PgOutputMessage::Update {
            xid,
            relation_id,
            old_tuple,
            new_tuple,
        } => {
            let w = Wire::tag(b'U').xid(*xid).u32(*relation_id);
            let w = match old_tuple {
                Some(t) => old(w, t),
                None => w,
            };
            w.u8(b'N').tuple(new_tuple)
        }
        PgOutputMessage::Delete {
            xid,
            relation_id,
            old_tuple,
        } => old(Wire::tag(b'D').xid(*xid).u32(*relation_id), old_tuple),
        PgOutputMessage::Message {
            xid,
            flags,
            lsn,
            prefix,
            content,
        } => Wire::tag(b'M')
            .xid(*xid)
            .u8(*flags)
            .u64(lsn.0)
            .cstr(prefix.as_bytes())
            .i32(content.len() as i32)
            .bytes(content),
        PgOutputMessage::StreamAbort {
            xid,
            subxid,
            abort_lsn,
            abort_ts,
        } => {
            let w = Wire::tag(b'A').u32(*xid).u32(*subxid);
            match (abort_lsn, abort_ts) {
                (Some(lsn), Some(ts)) => w.u64(lsn.0).i64(ts.0),
                _ => w,
            }
        }
        other => unimplemented!("test encoder: {other:?}"),
    }
    .0
}
