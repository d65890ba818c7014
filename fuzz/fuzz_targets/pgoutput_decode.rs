//! Feeds arbitrary bytes to the pgoutput decoder, as one XLogData payload, in both
//! stream states, and through the stateful `Decoder` as a sequence of messages.
//! Any panic is a bug: every length on the wire is untrusted.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outbox_relay::pg::pgoutput::{decode, Decoder, StreamState};

fuzz_target!(|data: &[u8]| {
    // The relay hands the decoder the XLogData payload as `Bytes` (columns are sliced
    // out of it); here a copy of the fuzzer's input.
    let data = Bytes::copy_from_slice(data);
    let _ = decode(&data, StreamState::Outside);
    let _ = decode(&data, StreamState::InsideStream);

    // The same bytes split at 0xFF into several messages, so sequences such as Stream
    // Start, data, Stream Stop reach the stateful decoder.
    let mut decoder = Decoder::new();
    for message in data.split(|&b| b == 0xFF) {
        let _ = decoder.decode(&data.slice_ref(message));
    }
});
