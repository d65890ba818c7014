//! Malformed input: every truncation of every captured message, trailing bytes, empty
//! and unknown tags, negative and huge lengths and counts, invalid UTF-8, unknown
//! markers and flags, each an error (never a panic, never a large allocation) whose
//! offset points at the bad byte. Untrusted input, tested case by case here and at
//! random in `properties.rs`.

use super::*;

fn both_states() -> [StreamState; 2] {
    [StreamState::Outside, StreamState::InsideStream]
}

#[test]
fn every_truncation_of_every_fixture_is_an_error() {
    for (name, text) in ALL_FIXTURES {
        for (captured, state, _) in decode_fixture(text) {
            for len in 0..captured.bytes.len() {
                let prefix = &captured.bytes[..len];
                assert!(
                    decode(prefix, state).is_err(),
                    "{name} line {}: prefix of {len} bytes decoded",
                    captured.line
                );
                // The other state must not panic either.
                let other = both_states().into_iter().find(|s| *s != state);
                let _ = decode(prefix, other.expect("two states"));
            }
        }
    }
}

#[test]
fn trailing_bytes_are_invalid() {
    for (name, text) in ALL_FIXTURES {
        for (captured, state, _) in decode_fixture(text) {
            let mut bytes = captured.bytes.clone();
            bytes.push(0);
            assert!(
                matches!(decode(&bytes, state), Err(DecodeError::Invalid { .. })),
                "{name} line {}",
                captured.line
            );
        }
    }
}

#[test]
fn empty_and_unknown_tags() {
    for state in both_states() {
        assert_eq!(decode(&[], state), Err(DecodeError::Empty));
        for tag in [0u8, b'a', b'X', b'w', b'k', 0xff] {
            assert_eq!(
                decode(&[tag, 0, 0, 0, 0], state),
                Err(DecodeError::UnknownTag { tag })
            );
        }
    }
}

#[test]
fn negative_lengths_and_counts_are_invalid() {
    let insert_with = |count: i16, column: Wire| {
        Wire::tag(b'I')
            .u32(16384)
            .u8(b'N')
            .i16(count)
            .bytes(&column.0)
            .0
    };
    let cases = [
        (
            "negative column length",
            insert_with(1, Wire::default().u8(b't').i32(-1)),
        ),
        (
            "negative binary length",
            insert_with(1, Wire::default().u8(b'b').i32(i32::MIN)),
        ),
        ("negative column count", insert_with(-1, Wire::default())),
        (
            "negative message length",
            Wire::tag(b'M').u8(1).u64(1).cstr(b"p").i32(-5).0,
        ),
        ("negative relation count", Wire::tag(b'T').i32(-1).u8(0).0),
        (
            "negative relation column count",
            Wire::tag(b'R')
                .u32(1)
                .cstr(b"s")
                .cstr(b"t")
                .u8(b'd')
                .i16(-3)
                .0,
        ),
    ];
    for (what, bytes) in cases {
        let result = decode(&bytes, StreamState::Outside);
        assert!(
            matches!(result, Err(DecodeError::Invalid { .. })),
            "{what}: {result:?}"
        );
    }
}

#[test]
fn huge_lengths_and_counts_are_truncated_not_allocated() {
    let cases = [
        Wire::tag(b'I')
            .u32(1)
            .u8(b'N')
            .i16(1)
            .u8(b't')
            .i32(i32::MAX)
            .0,
        Wire::tag(b'I').u32(1).u8(b'N').i16(i16::MAX).0,
        Wire::tag(b'M')
            .u8(1)
            .u64(1)
            .cstr(b"p")
            .i32(i32::MAX)
            .bytes(b"abc")
            .0,
        Wire::tag(b'T').i32(i32::MAX).u8(0).u32(1).0,
        Wire::tag(b'R')
            .u32(1)
            .cstr(b"s")
            .cstr(b"t")
            .u8(b'd')
            .i16(i16::MAX)
            .0,
    ];
    for bytes in cases {
        let result = decode(&bytes, StreamState::Outside);
        assert!(
            matches!(result, Err(DecodeError::Truncated { .. })),
            "{result:?}"
        );
    }
}

#[test]
fn invalid_utf8_and_missing_nul_in_strings() {
    let invalid = [
        Wire::tag(b'O').u64(1).cstr(&[0xff, 0xfe]).0,
        Wire::tag(b'R')
            .u32(1)
            .cstr(b"app")
            .cstr(&[b'o', 0xc3])
            .u8(b'd')
            .i16(0)
            .0,
        Wire::tag(b'b')
            .u64(1)
            .u64(2)
            .i64(3)
            .u32(4)
            .cstr(&[0xed, 0xa0, 0x80])
            .0,
    ];
    for bytes in invalid {
        let result = decode(&bytes, StreamState::Outside);
        assert!(
            matches!(result, Err(DecodeError::Invalid { .. })),
            "{result:?}"
        );
    }
    let unterminated = Wire::tag(b'O').u64(1).bytes(b"upstream").0;
    assert!(matches!(
        decode(&unterminated, StreamState::Outside),
        Err(DecodeError::Truncated { needed: 1, .. })
    ));
}

#[test]
fn unknown_markers_and_flags_are_invalid() {
    let cases = [
        (
            "insert without 'N'",
            Wire::tag(b'I').u32(1).u8(b'K').i16(0).0,
        ),
        ("update marker", Wire::tag(b'U').u32(1).u8(b'X').i16(0).0),
        (
            "update old tuple without 'N'",
            Wire::tag(b'U').u32(1).u8(b'K').i16(0).u8(b'K').i16(0).0,
        ),
        ("delete with 'N'", Wire::tag(b'D').u32(1).u8(b'N').i16(0).0),
        (
            "column kind",
            Wire::tag(b'I').u32(1).u8(b'N').i16(1).u8(b'x').0,
        ),
        ("first segment flag", Wire::tag(b'S').u32(1).u8(2).0),
    ];
    for (what, bytes) in cases {
        let result = decode(&bytes, StreamState::Outside);
        assert!(
            matches!(result, Err(DecodeError::Invalid { .. })),
            "{what}: {result:?}"
        );
    }
}

#[test]
fn error_offsets_point_at_the_bad_byte() {
    let bytes = Wire::tag(b'I').u32(1).u8(b'N').i16(2).u8(b'n').u8(b'?').0;
    assert_eq!(
        decode(&bytes, StreamState::Outside),
        Err(DecodeError::Invalid {
            message: "Insert",
            offset: 9,
            reason: "found 0x3f, expected column kind 'n', 'u', 't' or 'b'".into(),
        })
    );
    assert_eq!(
        decode(&[b'B', 0, 0], StreamState::Outside),
        Err(DecodeError::Truncated {
            message: "Begin",
            offset: 1,
            needed: 6,
        })
    );
}
