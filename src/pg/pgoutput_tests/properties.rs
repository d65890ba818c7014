//! Property tests: arbitrary bytes, arbitrary bodies after a valid tag and mutated
//! fixtures never panic the decoder, and decoding inverts the test encoder for every
//! message it covers.

use super::*;
use proptest::prelude::*;

const TAGS: &[u8] = b"BCORYIUDTMSEcAbPKrp";

fn stream_state() -> impl Strategy<Value = StreamState> {
    prop_oneof![Just(StreamState::Outside), Just(StreamState::InsideStream)]
}

fn column_value() -> impl Strategy<Value = ColumnValue> {
    prop_oneof![
        Just(ColumnValue::Null),
        Just(ColumnValue::UnchangedToast),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(|v| ColumnValue::Text(v.into())),
        proptest::collection::vec(any::<u8>(), 0..16).prop_map(|v| ColumnValue::Binary(v.into())),
    ]
}

fn tuple_data() -> impl Strategy<Value = TupleData> {
    proptest::collection::vec(column_value(), 0..8).prop_map(|columns| TupleData { columns })
}

fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple_data().prop_map(OldTuple::Key),
        tuple_data().prop_map(OldTuple::Old)
    ]
}

fn round_trip_message() -> impl Strategy<Value = PgOutputMessage> {
    let lsn = any::<u64>().prop_map(Lsn);
    let ts = any::<i64>().prop_map(PgTimestamp);
    let xid = proptest::option::of(any::<u32>());
    prop_oneof![
        (lsn.clone(), ts.clone(), any::<u32>()).prop_map(|(final_lsn, commit_ts, xid)| {
            PgOutputMessage::Begin {
                final_lsn,
                commit_ts,
                xid,
            }
        }),
        (any::<u8>(), lsn.clone(), lsn.clone(), ts.clone()).prop_map(
            |(flags, commit_lsn, end_lsn, commit_ts)| PgOutputMessage::Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_ts,
            }
        ),
        (xid.clone(), any::<u32>(), tuple_data()).prop_map(|(xid, relation_id, new_tuple)| {
            PgOutputMessage::Insert {
                xid,
                relation_id,
                new_tuple,
            }
        }),
        (
            xid.clone(),
            any::<u32>(),
            proptest::option::of(old_tuple()),
            tuple_data()
        )
            .prop_map(|(xid, relation_id, old_tuple, new_tuple)| {
                PgOutputMessage::Update {
                    xid,
                    relation_id,
                    old_tuple,
                    new_tuple,
                }
            }),
        (xid.clone(), any::<u32>(), old_tuple()).prop_map(|(xid, relation_id, old_tuple)| {
            PgOutputMessage::Delete {
                xid,
                relation_id,
                old_tuple,
            }
        }),
        (
            xid,
            any::<u8>(),
            lsn.clone(),
            "[^\u{0}]{0,12}",
            proptest::collection::vec(any::<u8>(), 0..32)
        )
            .prop_map(
                |(xid, flags, lsn, prefix, content)| PgOutputMessage::Message {
                    xid,
                    flags,
                    lsn,
                    prefix,
                    content: Bytes::from(content),
                }
            ),
        (any::<u32>(), any::<u32>(), proptest::option::of((lsn, ts))).prop_map(
            |(xid, subxid, abort)| PgOutputMessage::StreamAbort {
                xid,
                subxid,
                abort_lsn: abort.map(|(lsn, _)| lsn),
                abort_ts: abort.map(|(_, ts)| ts),
            }
        ),
    ]
}

fn message_xid(message: &PgOutputMessage) -> Option<u32> {
    match message {
        PgOutputMessage::Insert { xid, .. }
        | PgOutputMessage::Update { xid, .. }
        | PgOutputMessage::Delete { xid, .. }
        | PgOutputMessage::Message { xid, .. } => *xid,
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn arbitrary_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        state in stream_state(),
    ) {
        let _ = decode(&bytes, state);
    }

    #[test]
    fn arbitrary_bodies_after_a_valid_tag_never_panic(
        tag in proptest::sample::select(TAGS),
        body in proptest::collection::vec(any::<u8>(), 0..128),
        state in stream_state(),
    ) {
        let mut bytes = vec![tag];
        bytes.extend_from_slice(&body);
        let _ = decode(&bytes, state);
    }

    #[test]
    fn fixture_mutations_never_panic(
        fixture in 0..ALL_FIXTURES.len(),
        pick in any::<prop::sample::Index>(),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        state in stream_state(),
    ) {
        let captured = parse_fixture(ALL_FIXTURES[fixture].1);
        let mut bytes = pick.get(&captured).bytes.clone();
        for (at, value) in flips {
            let i = at.index(bytes.len());
            bytes[i] = value;
        }
        let _ = decode(&bytes, state);
    }

    #[test]
    fn decode_inverts_encode(message in round_trip_message()) {
        let state = state_for(message_xid(&message));
        prop_assert_eq!(decode(&encode(&message), state), Ok(message));
    }
}
