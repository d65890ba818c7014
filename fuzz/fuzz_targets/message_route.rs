//! Feeds arbitrary bytes to the table-less outbox's router as a message's content (the
//! first byte picks the prefix and the envelope mode): the envelope reader and the
//! router see untrusted text written by any role that may emit messages. Any panic is a
//! bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_relay::pg::Lsn;
use outbox_relay::relay::messages::config::{EnvelopeMode, MessagesConfig};
use outbox_relay::relay::messages::{MessageContext, MessageRouter};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, content)) = data.split_first() else {
        return;
    };
    let envelope = [EnvelopeMode::Auto, EnvelopeMode::Always, EnvelopeMode::Never]
        [usize::from(selector % 3)];
    let config = MessagesConfig {
        prefixes: vec!["orders".into()],
        prefix_regex: Some(r"ev\.(?<routedByValue>.+)".into()),
        envelope,
        max_bytes: 2048,
        ..MessagesConfig::default()
    };
    let Ok(router) = MessageRouter::try_new(&config) else {
        return;
    };
    let prefix = if selector & 0x80 == 0 {
        "orders".to_owned()
    } else {
        format!("ev.{}", String::from_utf8_lossy(&content[..content.len().min(8)]))
    };
    let context = MessageContext {
        lsn: Lsn(u64::from(selector)),
        timestamp_ms: 0,
    };
    if let Some(Ok(event)) = router.route(&prefix, &bytes::Bytes::copy_from_slice(content), context) {
        let _ = event.value();
    }
});
