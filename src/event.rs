//! The vocabulary every layer shares, and nothing else: a routed event and its parts,
//! the transaction sequence number, and the ticket a delivery report settles. A leaf:
//! it imports no other module of the crate but the WAL position, so the PostgreSQL side,
//! the relay and the sinks depend on it and not on each other.

use std::borrow::Cow;

use crate::lsn::Lsn;

/// Identifies the transaction an event belongs to, for the ack tracker.
pub type TxnSeq = u64;

/// One undelivered event: handed out by the ack tracker (`relay::ack`) when it is sent,
/// settled by its delivery report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    pub(crate) seq: TxnSeq,
    /// Send order; also the key of its send time.
    pub(crate) serial: u64,
}

impl Ticket {
    /// The transaction the event belongs to.
    pub fn seq(&self) -> TxnSeq {
        self.seq
    }
}

/// What the payload bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// `json` / `jsonb`: the bytes are a JSON document.
    Json,
    /// Any other type, in PostgreSQL's text form (UTF-8).
    Text,
    /// `bytea`, decoded to raw bytes.
    Binary,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Option<String>,
}

/// One field of the JSON envelope (an `envelope` placement).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvelopeField {
    /// The alias (the column name when no alias is given).
    pub name: String,
    /// The column value as JSON text: `null`; json/jsonb embedded as JSON; `true` /
    /// `false` for bool; a number for integer, float and numeric columns (a string for
    /// `NaN` and infinities); a base64 string for bytea; a string for everything else.
    pub json: String,
}

/// One routed event, ready for a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub topic: String,
    /// The record's partition (a `partition` placement); `None` leaves it to the
    /// producer's partitioner.
    pub partition: Option<i32>,
    pub key: Option<String>,
    /// `id` first, then the `header` placements in configuration order.
    pub headers: Vec<Header>,
    /// The payload as stored; `None` for SQL NULL. Sinks write [`OutboxEvent::value`].
    pub payload: Option<bytes::Bytes>,
    pub payload_format: PayloadFormat,
    /// The `envelope` placements; when not empty the value is an envelope object.
    pub envelope: Vec<EnvelopeField>,
    /// The record value is null (a Kafka tombstone).
    pub tombstone: bool,
    /// WAL position of the insert.
    pub lsn: Lsn,
    /// Record timestamp in Unix milliseconds: `outbox.timestamp_column`'s value, or the
    /// transaction's commit time.
    pub timestamp_ms: i64,
    /// Which outbox table the event came from: its index in the configuration's list
    /// (0 with one table; [`OutboxEvent::NOT_A_TABLE`] for a logical decoding message's
    /// record).
    pub outbox: u32,
}

impl OutboxEvent {
    /// [`OutboxEvent::outbox`] of a record made from a logical decoding message.
    pub const NOT_A_TABLE: u32 = u32::MAX;

    /// The exact bytes of the Kafka record value; `None` for a null value (tombstone).
    ///
    /// Without envelope fields, the payload itself: json/jsonb as their JSON text, text
    /// as UTF-8, bytea as the raw bytes. With envelope fields, the JSON object
    /// `{"payload":P,"<alias>":V,...}` in configuration order, where `P` is the payload
    /// as JSON (json/jsonb embedded, text as a JSON string, bytea as a base64 string, as
    /// Kafka Connect's JSON converter writes bytes; NULL as `null`) and each `V` is
    /// [`EnvelopeField::json`].
    pub fn value(&self) -> Option<Cow<'_, [u8]>> {
        if self.tombstone {
            return None;
        }
        if self.envelope.is_empty() {
            return self.payload.as_deref().map(Cow::Borrowed);
        }
        let mut out = Vec::with_capacity(
            32 + self.payload.as_ref().map_or(4, |payload| payload.len())
                + self
                    .envelope
                    .iter()
                    .map(|f| f.name.len() + f.json.len() + 4)
                    .sum::<usize>(),
        );
        out.extend_from_slice(b"{\"payload\":");
        match (&self.payload, self.payload_format) {
            (None, _) => out.extend_from_slice(b"null"),
            (Some(bytes), PayloadFormat::Json) => out.extend_from_slice(bytes),
            (Some(bytes), PayloadFormat::Text) => {
                push_json_string(&mut out, &String::from_utf8_lossy(bytes))
            }
            (Some(bytes), PayloadFormat::Binary) => {
                out.push(b'"');
                push_base64(&mut out, bytes);
                out.push(b'"');
            }
        }
        for field in &self.envelope {
            out.push(b',');
            push_json_string(&mut out, &field.name);
            out.push(b':');
            out.extend_from_slice(field.json.as_bytes());
        }
        out.push(b'}');
        Some(Cow::Owned(out))
    }

    /// The record's size as handed to the sink: key, value and headers (names and
    /// values), in bytes. What the relay's in-flight byte bound counts. With envelope
    /// fields the value is built to be measured (its exact length).
    pub fn record_bytes(&self) -> u64 {
        let value = match (self.tombstone, self.envelope.is_empty()) {
            (true, _) => 0,
            (false, true) => self.payload.as_ref().map_or(0, |p| p.len()),
            (false, false) => self.value().map_or(0, |v| v.len()),
        };
        let headers: usize = self
            .headers
            .iter()
            .map(|h| h.name.len() + h.value.as_ref().map_or(0, String::len))
            .sum();
        let key = self.key.as_ref().map_or(0, String::len);
        u64::try_from(key + value + headers).unwrap_or(u64::MAX)
    }
}

/// Standard base64 (RFC 4648, with padding), appended to `out`.
pub(crate) fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        let sextet = |shift: u32| ALPHABET[((n >> shift) & 0x3f) as usize];
        out.push(sextet(18));
        out.push(sextet(12));
        out.push(if chunk.len() > 1 { sextet(6) } else { b'=' });
        out.push(if chunk.len() > 2 { sextet(0) } else { b'=' });
    }
}

pub(crate) fn push_json_string(out: &mut Vec<u8>, text: &str) {
    // serde_json's string escaping is exact; writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(envelope: Vec<EnvelopeField>, tombstone: bool) -> OutboxEvent {
        OutboxEvent {
            topic: "a-topic-not-counted".into(),
            partition: None,
            key: Some("k1".into()),
            headers: vec![
                Header {
                    name: "id".into(),
                    value: Some("abc".into()),
                },
                Header {
                    name: "h".into(),
                    value: None,
                },
            ],
            payload: Some(bytes::Bytes::from_static(b"{\"n\":1}")),
            payload_format: PayloadFormat::Json,
            envelope,
            tombstone,
            lsn: Lsn(1),
            timestamp_ms: 0,
            outbox: 0,
        }
    }

    #[test]
    fn record_bytes_count_key_value_and_headers() {
        // key 2 + value 7 + headers ("id" 2 + "abc" 3 + "h" 1).
        assert_eq!(event(Vec::new(), false).record_bytes(), 2 + 7 + 6);
        assert_eq!(event(Vec::new(), true).record_bytes(), 2 + 6, "no value");
        let enveloped = event(
            vec![EnvelopeField {
                name: "t".into(),
                json: "1".into(),
            }],
            false,
        );
        let value = enveloped.value().map_or(0, |v| v.len()) as u64;
        assert_eq!(value, br#"{"payload":{"n":1},"t":1}"#.len() as u64);
        assert_eq!(enveloped.record_bytes(), 2 + value + 6);
    }
}
