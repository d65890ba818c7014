//! Streamed transactions (protocol version 2, and version 4's parallel abort fields):
//! the captured `v2_stream.hex` fixture, the leading xid of data messages inside a
//! stream, and the stream state the [`Decoder`] tracks (Stream Start and Stop must
//! balance). The relay asks for version 1, so none of this reaches it; the decoder
//! still reads it right, or refuses it.

use super::*;

#[test]
fn v2_streamed_transactions() {
    let decoded = decode_fixture(V2_STREAM);
    let mut current: Option<u32> = None;
    let mut segments: HashMap<u32, usize> = HashMap::new();
    let mut subxids_seen: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut aborted: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut committed = Vec::new();
    let mut tags_in_stream = BTreeSet::new();
    for (captured, state, message) in &decoded {
        let streamed_xid = match message {
            PgOutputMessage::Relation(body) => Some(body.xid),
            PgOutputMessage::Type { xid, .. }
            | PgOutputMessage::Insert { xid, .. }
            | PgOutputMessage::Update { xid, .. }
            | PgOutputMessage::Delete { xid, .. }
            | PgOutputMessage::Truncate { xid, .. }
            | PgOutputMessage::Message { xid, .. } => Some(*xid),
            _ => None,
        };
        if let Some(xid) = streamed_xid {
            assert_eq!(*state, StreamState::InsideStream, "line {}", captured.line);
            let top = current.expect("inside a stream");
            let xid = xid.expect("streamed changes carry an xid");
            // The peek's xid column is the top-level transaction; the xid in the
            // message is that of the (sub)transaction that made the change.
            assert_eq!(captured.xid, top);
            if xid != top {
                subxids_seen.insert((top, xid));
            }
            tags_in_stream.insert(captured.tag);
        }
        match message {
            PgOutputMessage::StreamStart { xid, first_segment } => {
                assert_eq!(*state, StreamState::Outside);
                assert_eq!(*xid, captured.xid);
                let count = segments.entry(*xid).or_default();
                assert_eq!(*first_segment, *count == 0, "line {}", captured.line);
                *count += 1;
                current = Some(*xid);
            }
            PgOutputMessage::StreamStop => {
                assert_eq!(*state, StreamState::InsideStream);
                current = None;
            }
            PgOutputMessage::StreamCommit {
                xid,
                flags,
                commit_lsn,
                end_lsn,
                commit_ts,
            } => {
                assert_eq!(*state, StreamState::Outside);
                assert_eq!((*xid, *flags), (captured.xid, 0));
                assert!(end_lsn > commit_lsn);
                assert_eq!(*end_lsn, captured.lsn);
                assert!(commit_ts.unix_millis() > 1_700_000_000_000);
                committed.push(*xid);
            }
            PgOutputMessage::StreamAbort {
                xid,
                subxid,
                abort_lsn,
                abort_ts,
            } => {
                assert_eq!(*state, StreamState::Outside);
                // The peek's xid column is the aborted (sub)transaction here.
                assert_eq!(*subxid, captured.xid);
                assert_eq!((abort_lsn, abort_ts), (&None, &None), "v4 parallel only");
                aborted.insert((*xid, *subxid));
            }
            _ => {}
        }
    }
    assert_eq!(
        tags_in_stream,
        b"MYRIUDT".iter().copied().collect::<BTreeSet<u8>>()
    );
    let xids: Vec<u32> = segments
        .keys()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let [a, b, c] = xids[..] else {
        panic!("three streamed transactions: {xids:?}")
    };
    assert!(
        segments.values().all(|&n| n > 1),
        "each spans several segments"
    );
    assert_eq!(committed, [a, b]);
    // B rolled back a subtransaction whose changes had been streamed; C rolled back whole.
    let &(b_top, b_sub) = aborted
        .iter()
        .find(|(x, _)| *x == b)
        .expect("abort of B's subxact");
    assert!(b_sub > b_top);
    assert!(aborted.contains(&(c, c)));
    assert_eq!(subxids_seen, BTreeSet::from([(b_top, b_sub)]));
}

#[test]
fn stream_abort_v4_parallel_fields() {
    let base = Wire::tag(b'A').u32(700).u32(701);
    assert_eq!(
        decode(&base.0, StreamState::Outside),
        Ok(PgOutputMessage::StreamAbort {
            xid: 700,
            subxid: 701,
            abort_lsn: None,
            abort_ts: None,
        })
    );
    let parallel = Wire::tag(b'A')
        .u32(700)
        .u32(701)
        .u64(0x16_B374_D848)
        .i64(757_479_845_000_000);
    assert_eq!(
        decode(&parallel.0, StreamState::Outside),
        Ok(PgOutputMessage::StreamAbort {
            xid: 700,
            subxid: 701,
            abort_lsn: Some(Lsn(0x16_B374_D848)),
            abort_ts: Some(PgTimestamp(757_479_845_000_000)),
        })
    );
    for extra in [1, 8, 15, 17, 24] {
        let buf = Wire::tag(b'A').u32(700).u32(701).bytes(&vec![0; extra]).0;
        assert!(
            matches!(
                decode(&buf, StreamState::Outside),
                Err(DecodeError::Invalid { .. })
            ),
            "{extra} extra bytes"
        );
    }
}

#[test]
fn streamed_data_messages_carry_a_leading_xid() {
    let new_tuple = tuple(vec![text("1"), ColumnValue::Null]);
    let insert = PgOutputMessage::Insert {
        xid: Some(9),
        relation_id: 16384,
        new_tuple: new_tuple.clone(),
    };
    let bytes = encode(&insert);
    assert_eq!(decode(&bytes, StreamState::InsideStream), Ok(insert));
    // Read as if outside a stream, the xid is taken for the relation id and the rest
    // no longer parses.
    assert!(decode(&bytes, StreamState::Outside).is_err());

    let relation = Wire::tag(b'R')
        .u32(9)
        .u32(16384)
        .cstr(b"")
        .cstr(b"t")
        .u8(b'd')
        .i16(1)
        .u8(1)
        .cstr(b"id")
        .u32(INT4_OID)
        .i32(-1);
    let Ok(PgOutputMessage::Relation(body)) = decode(&relation.0, StreamState::InsideStream) else {
        panic!("relation")
    };
    assert_eq!(
        (body.xid, body.namespace.as_str()),
        (Some(9), ""),
        "pg_catalog is ''"
    );
}

#[test]
fn decoder_rejects_unbalanced_stream_markers() {
    let mut decoder = Decoder::new();
    let stop = [b'E'];
    let start = Wire::tag(b'S').u32(5).u8(1).0;
    assert!(matches!(
        decoder.decode(&Bytes::copy_from_slice(&stop)),
        Err(DecodeError::Invalid { .. })
    ));
    assert_eq!(decoder.stream_state(), StreamState::Outside);
    assert_eq!(
        decoder.decode(&Bytes::copy_from_slice(&start)),
        Ok(PgOutputMessage::StreamStart {
            xid: 5,
            first_segment: true
        })
    );
    assert_eq!(decoder.stream_state(), StreamState::InsideStream);
    assert!(matches!(
        decoder.decode(&Bytes::copy_from_slice(&start)),
        Err(DecodeError::Invalid { .. })
    ));
    assert_eq!(decoder.stream_state(), StreamState::InsideStream);
    assert_eq!(
        decoder.decode(&Bytes::copy_from_slice(&stop)),
        Ok(PgOutputMessage::StreamStop)
    );
    assert_eq!(decoder.stream_state(), StreamState::Outside);
}
