//! Backend message framing, without I/O: the first place an untrusted length is read.
//!
//! ```text
//!  read buffer ─▶ [tag: u8][len: i32 BE, counts itself][body: len - 4 bytes] ─▶ ...
//!                  │
//!                  ├─ 'W' CopyBothResponse ─▶ Backend::CopyBothResponse (postgres-protocol
//!                  │                           0.6 does not know it)
//!                  └─ any other tag ───────▶ postgres-protocol's parser, given exactly
//!                                            one complete frame
//! ```
//!
//! [`parse`] tells "need more bytes" (`Ok(None)`, the buffer untouched) apart from
//! "invalid" (`Err`): a length below 4 or above [`MAX_MESSAGE_LEN`] is refused before
//! anything is allocated for it, so garbage on the wire never becomes a huge buffer.

use bytes::{Buf, BytesMut};
use postgres_protocol::message::backend::Message;

/// Largest backend message accepted. PostgreSQL values are at most 1 GB; anything
/// claiming more is garbage on the wire and must not become an allocation.
pub const MAX_MESSAGE_LEN: usize = 1 << 30 | 1 << 20;

/// One backend message.
pub enum Backend {
    /// `'W'`: the server entered CopyBoth mode (START_REPLICATION accepted).
    CopyBothResponse,
    Message(Message),
}

/// The bytes at the front of the buffer are not a valid backend message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error(
        "message with tag {tag:#04x} declares length {declared}, outside 4..={MAX_MESSAGE_LEN}"
    )]
    BadLength { tag: u8, declared: u64 },
    #[error("incomplete message with tag {tag:#04x}")]
    Incomplete { tag: u8 },
    #[error("could not parse message with tag {tag:#04x}: {reason}")]
    Invalid { tag: u8, reason: String },
}

/// Length of the complete frame at the front of `buf` (tag included), `None` when more
/// bytes are needed.
fn complete_frame_len(buf: &[u8]) -> Result<Option<usize>, FramingError> {
    let Some(header) = buf.get(..5) else {
        return Ok(None);
    };
    let declared = u32::from_be_bytes([header[1], header[2], header[3], header[4]]);
    let refused = FramingError::BadLength {
        tag: header[0],
        declared: u64::from(declared),
    };
    let declared = usize::try_from(declared).map_err(|_| refused.clone())?;
    if !(4..=MAX_MESSAGE_LEN).contains(&declared) {
        return Err(refused);
    }
    let total = declared + 1;
    Ok((buf.len() >= total).then_some(total))
}

/// Takes one complete message off the front of `buf`: `Ok(None)` (buffer untouched)
/// when it does not hold one yet.
pub fn parse(buf: &mut BytesMut) -> Result<Option<Backend>, FramingError> {
    let Some(total) = complete_frame_len(buf)? else {
        return Ok(None);
    };
    let tag = buf[0];
    if tag == b'W' {
        buf.advance(total);
        return Ok(Some(Backend::CopyBothResponse));
    }
    let mut frame = buf.split_to(total);
    match Message::parse(&mut frame) {
        Ok(Some(message)) => Ok(Some(Backend::Message(message))),
        Ok(None) => Err(FramingError::Incomplete { tag }),
        Err(e) => Err(FramingError::Invalid {
            tag,
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        out.extend_from_slice(&(u32::try_from(body.len() + 4).unwrap()).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn needs_more_bytes_until_the_frame_is_complete() {
        // ReadyForQuery, idle.
        let whole = frame(b'Z', b"I");
        for cut in 0..whole.len() {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert!(parse(&mut buf).unwrap().is_none(), "cut at {cut}");
            assert_eq!(buf.len(), cut, "nothing consumed");
        }
        let mut buf = BytesMut::from(&whole[..]);
        assert!(matches!(
            parse(&mut buf).unwrap(),
            Some(Backend::Message(Message::ReadyForQuery(_)))
        ));
        assert!(buf.is_empty());
    }

    #[test]
    fn copy_both_response_is_taken_and_the_next_message_stays() {
        let mut bytes = frame(b'W', &[0, 0, 0]);
        bytes.extend(frame(b'Z', b"I"));
        let mut buf = BytesMut::from(&bytes[..]);
        assert!(matches!(
            parse(&mut buf).unwrap(),
            Some(Backend::CopyBothResponse)
        ));
        assert!(matches!(
            parse(&mut buf).unwrap(),
            Some(Backend::Message(Message::ReadyForQuery(_)))
        ));
    }

    #[test]
    fn lengths_out_of_range_are_refused_before_any_allocation() {
        for declared in [0u32, 3, u32::MAX, (MAX_MESSAGE_LEN + 1) as u32] {
            let mut bytes = vec![b'd'];
            bytes.extend_from_slice(&declared.to_be_bytes());
            let mut buf = BytesMut::from(&bytes[..]);
            assert!(
                matches!(parse(&mut buf), Err(FramingError::BadLength { .. })),
                "{declared}"
            );
        }
    }

    #[test]
    fn a_malformed_body_is_an_error_naming_the_tag() {
        // ReadyForQuery must carry one status byte.
        let mut buf = BytesMut::from(&frame(b'Z', b"")[..]);
        let err = parse(&mut buf).err().expect("refused");
        assert!(err.to_string().contains("0x5a"), "{err}");
    }

    proptest! {
        /// Arbitrary bytes never panic, and a consumed frame is exactly as long as it
        /// said; otherwise nothing is consumed.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut buf = BytesMut::from(&bytes[..]);
            match parse(&mut buf) {
                Ok(None) => prop_assert_eq!(buf.len(), bytes.len()),
                Ok(Some(_)) | Err(FramingError::Incomplete { .. } | FramingError::Invalid { .. }) => {
                    let declared = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
                    prop_assert_eq!(buf.len(), bytes.len() - declared - 1);
                }
                Err(FramingError::BadLength { .. }) => prop_assert_eq!(buf.len(), bytes.len()),
            }
        }

        /// Any sequence of well-formed frames comes back one by one, whatever the tag.
        #[test]
        fn well_formed_frames_are_split_exactly(
            bodies in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..8)
        ) {
            let mut bytes = Vec::new();
            for body in &bodies {
                // CopyData: any body is valid.
                bytes.extend(frame(b'd', body));
            }
            let mut buf = BytesMut::from(&bytes[..]);
            for body in &bodies {
                match parse(&mut buf) {
                    Ok(Some(Backend::Message(Message::CopyData(data)))) => {
                        prop_assert_eq!(data.data(), &body[..]);
                    }
                    _ => prop_assert!(false, "expected CopyData"),
                }
            }
            prop_assert!(buf.is_empty());
        }
    }
}
