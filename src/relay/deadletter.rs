//! Dead-letter records: pure. An event that cannot be delivered as it is (a row that
//! cannot be routed, an oversize payload, a topic Kafka refuses) goes to the
//! dead-letter topic with the reason in headers, and is acknowledged only once that
//! record is delivered. Never skipped without a trace.

use crate::pg::Lsn;
use crate::relay::router::{Header, OutboxEvent, PayloadFormat};

/// Header names of dead-letter records.
pub const HEADER_ERROR: &str = "error";
pub const HEADER_SOURCE_TABLE: &str = "source.table";
pub const HEADER_SOURCE_LSN: &str = "source.lsn";
pub const HEADER_ORIGINAL_TOPIC: &str = "source.topic";

/// What is known about the failed event.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub reason: String,
    pub source_table: String,
    pub source_lsn: Lsn,
    /// The topic the event was routed to, when routing got that far.
    pub original_topic: Option<String>,
    pub key: Option<String>,
    /// Headers of the original event (its `id` first), when routing got that far.
    pub headers: Vec<Header>,
    /// The record value: the event's value, or the raw row as JSON when it could not
    /// be routed. `None` when even that cannot be delivered (oversize).
    pub value: Option<Vec<u8>>,
    pub timestamp_ms: i64,
}

impl DeadLetter {
    /// The dead-letter record for `topic`.
    pub fn into_event(self, topic: &str) -> OutboxEvent {
        let mut headers = vec![
            Header {
                name: HEADER_ERROR.into(),
                value: Some(self.reason),
            },
            Header {
                name: HEADER_SOURCE_TABLE.into(),
                value: Some(self.source_table),
            },
            Header {
                name: HEADER_SOURCE_LSN.into(),
                value: Some(self.source_lsn.to_string()),
            },
        ];
        if let Some(original) = self.original_topic {
            headers.push(Header {
                name: HEADER_ORIGINAL_TOPIC.into(),
                value: Some(original),
            });
        }
        headers.extend(self.headers);
        // Text stays readable on the stdout sink; Kafka gets the same bytes either way.
        let payload_format = match &self.value {
            Some(bytes) if std::str::from_utf8(bytes).is_err() => PayloadFormat::Binary,
            _ => PayloadFormat::Text,
        };
        OutboxEvent {
            topic: topic.to_owned(),
            key: self.key,
            headers,
            payload: self.value,
            payload_format,
            envelope: Vec::new(),
            partition: None,
            tombstone: false,
            lsn: self.source_lsn,
            timestamp_ms: self.timestamp_ms,
        }
    }

    /// From an event that was routed but cannot be delivered as it is.
    pub fn from_event(event: &OutboxEvent, reason: String, source_table: &str) -> Self {
        DeadLetter {
            reason,
            source_table: source_table.to_owned(),
            source_lsn: event.lsn,
            original_topic: Some(event.topic.clone()),
            key: event.key.clone(),
            headers: event.headers.clone(),
            value: event.value().map(|v| v.into_owned()),
            timestamp_ms: event.timestamp_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_letter_record_carries_reason_and_source() {
        let record = DeadLetter {
            reason: "column \"id\" is NULL".into(),
            source_table: "public.outbox".into(),
            source_lsn: Lsn(0x1_0000_0020),
            original_topic: None,
            key: None,
            headers: Vec::new(),
            value: Some(b"{\"id\":null}".to_vec()),
            timestamp_ms: 5,
        }
        .into_event("dlq");
        assert_eq!(record.topic, "dlq");
        let header = |name: &str| {
            record
                .headers
                .iter()
                .find(|h| h.name == name)
                .and_then(|h| h.value.clone())
        };
        assert_eq!(
            header(HEADER_ERROR).as_deref(),
            Some("column \"id\" is NULL")
        );
        assert_eq!(
            header(HEADER_SOURCE_TABLE).as_deref(),
            Some("public.outbox")
        );
        assert_eq!(header(HEADER_SOURCE_LSN).as_deref(), Some("1/20"));
        assert_eq!(header(HEADER_ORIGINAL_TOPIC), None);
        assert_eq!(record.value().as_deref(), Some(&b"{\"id\":null}"[..]));
    }
}
