//! Feeds arbitrary bytes to the backend message framing, as they would arrive from the
//! socket: every message it takes off the buffer, until it needs more bytes or refuses
//! them. The first untrusted lengths are read here; any panic is a bug.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use outbox_relay::pg::framing::parse;

fuzz_target!(|data: &[u8]| {
    let mut buf = BytesMut::from(data);
    while let Ok(Some(_)) = parse(&mut buf) {}
});
