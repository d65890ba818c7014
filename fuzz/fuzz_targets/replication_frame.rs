//! Feeds arbitrary bytes to the replication frame parser as the payload of one CopyData
//! message, and the payload of every XLogData frame it accepts on to the pgoutput
//! decoder in both stream states: the path bytes take from the socket to a typed
//! message. Any panic is a bug: the frame comes straight off the network.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outbox_relay::pg::pgoutput::{decode, StreamState};
use outbox_relay::pg::replication::ReplicationFrame;

fuzz_target!(|data: &[u8]| {
    if let Ok(ReplicationFrame::XLogData(xlog)) =
        ReplicationFrame::parse(Bytes::copy_from_slice(data))
    {
        let _ = decode(&xlog.data, StreamState::Outside);
        let _ = decode(&xlog.data, StreamState::InsideStream);
    }
});
