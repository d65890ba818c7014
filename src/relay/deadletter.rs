//! Dead-letter records: pure. An event that cannot be delivered as it is (a row that
//! cannot be routed, an oversize payload, a topic Kafka refuses) goes to the
//! dead-letter topic with the reason in headers, and is acknowledged only once that
//! record is delivered. Never skipped without a trace.
//!
//! A dead-letter record keeps the event's value. Only when the record itself is too
//! large for Kafka is it sent again without the value, and then with a
//! [`HEADER_VALUE_DROPPED`] header saying why ([`DeadLetter::without_value`]); any other
//! failure of a dead-letter record is retried or stops the relay.

use crate::pg::Lsn;
use crate::relay::router::{Header, OutboxEvent, PayloadFormat};

/// Header names of dead-letter records.
pub const HEADER_ERROR: &str = "error";
pub const HEADER_SOURCE_TABLE: &str = "source.table";
pub const HEADER_SOURCE_LSN: &str = "source.lsn";
pub const HEADER_ORIGINAL_TOPIC: &str = "source.topic";
/// Present only on a dead-letter record sent without its value because even that
/// record was too large; its value says why.
pub const HEADER_VALUE_DROPPED: &str = "value.dropped";

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
            payload: self.value.map(bytes::Bytes::from),
            payload_format,
            envelope: Vec::new(),
            partition: None,
            tombstone: false,
            lsn: self.source_lsn,
            timestamp_ms: self.timestamp_ms,
            outbox: 0,
        }
    }

    /// A dead-letter record that Kafka refused for its size, without its value and
    /// with a [`HEADER_VALUE_DROPPED`] header carrying `reason`. `None` when it has no
    /// value to drop (then nothing smaller can be sent).
    pub fn without_value(record: &OutboxEvent, reason: &str) -> Option<OutboxEvent> {
        record.value()?;
        let mut bare = record.clone();
        bare.payload = None;
        bare.envelope.clear();
        bare.tombstone = false;
        bare.headers.push(Header {
            name: HEADER_VALUE_DROPPED.into(),
            value: Some(reason.to_owned()),
        });
        Some(bare)
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

/// What to do about a record the sink refused for a reason of its own (too large,
/// malformed, a topic Kafka refuses): the dead-letter policy, pure.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// Settle the event through a dead-letter record for it.
    DeadLetter(OutboxEvent),
    /// The dead-letter record itself was too large: send it again without its value
    /// (same ticket: it still settles its event).
    ResendWithoutValue(OutboxEvent),
    /// Stop without acknowledging: the dead-letter topic refused its record.
    StopDeadLetterRefused,
    /// Stop without acknowledging: no dead-letter topic is configured to take the event.
    StopNoDeadLetterTopic(Option<OutboxEvent>),
}

/// The policy: an event goes to the dead-letter topic when one is configured; a
/// dead-letter record is retried once without its value when it was too large, and
/// otherwise stops the relay (a dead letter is never dropped).
pub fn on_refusal(
    record_is_dead_letter: bool,
    record: Option<OutboxEvent>,
    reason: &str,
    too_large: bool,
    dead_letter_configured: bool,
) -> Refusal {
    if record_is_dead_letter {
        return match record {
            Some(record) if too_large => DeadLetter::without_value(&record, reason)
                .map_or(Refusal::StopDeadLetterRefused, Refusal::ResendWithoutValue),
            _ => Refusal::StopDeadLetterRefused,
        };
    }
    match record {
        Some(event) if dead_letter_configured => Refusal::DeadLetter(event),
        other => Refusal::StopNoDeadLetterTopic(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(value: Option<&str>) -> OutboxEvent {
        DeadLetter {
            reason: "r".into(),
            source_table: "public.outbox".into(),
            source_lsn: Lsn(7),
            original_topic: None,
            key: Some("k".into()),
            headers: Vec::new(),
            value: value.map(|v| v.as_bytes().to_vec()),
            timestamp_ms: 0,
        }
        .into_event("t")
    }

    #[test]
    fn a_refused_event_goes_to_the_dead_letter_topic_or_stops_the_relay() {
        assert_eq!(
            on_refusal(false, Some(event(Some("v"))), "bad", false, true),
            Refusal::DeadLetter(event(Some("v")))
        );
        assert_eq!(
            on_refusal(false, Some(event(Some("v"))), "bad", true, false),
            Refusal::StopNoDeadLetterTopic(Some(event(Some("v"))))
        );
        assert_eq!(
            on_refusal(false, None, "bad", false, true),
            Refusal::StopNoDeadLetterTopic(None)
        );
    }

    #[test]
    fn a_refused_dead_letter_is_resent_bare_only_when_too_large() {
        let Refusal::ResendWithoutValue(bare) =
            on_refusal(true, Some(event(Some("v"))), "too big", true, true)
        else {
            panic!("a too-large dead letter goes again without its value");
        };
        assert_eq!(bare.value(), None);
        assert!(bare
            .headers
            .iter()
            .any(|h| h.name == HEADER_VALUE_DROPPED && h.value.as_deref() == Some("too big")));
        // Refused for another reason, or with no value left to drop: stop, never drop it.
        assert_eq!(
            on_refusal(true, Some(event(Some("v"))), "invalid", false, true),
            Refusal::StopDeadLetterRefused
        );
        assert_eq!(
            on_refusal(true, Some(event(None)), "too big", true, true),
            Refusal::StopDeadLetterRefused
        );
        assert_eq!(
            on_refusal(true, None, "too big", true, true),
            Refusal::StopDeadLetterRefused
        );
    }

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
        assert_eq!(header(HEADER_VALUE_DROPPED), None, "the value is there");
    }

    #[test]
    fn only_a_record_with_a_value_can_drop_it_and_says_so() {
        let record = DeadLetter {
            reason: "topic \"x\": illegal".into(),
            source_table: "public.outbox".into(),
            source_lsn: Lsn(1),
            original_topic: Some("x".into()),
            key: Some("k".into()),
            headers: Vec::new(),
            value: Some(vec![b'v'; 10]),
            timestamp_ms: 5,
        }
        .into_event("dlq");
        let bare = DeadLetter::without_value(&record, "too large: 2000000 bytes").unwrap();
        assert_eq!(bare.value(), None);
        assert_eq!(bare.key.as_deref(), Some("k"));
        let dropped = bare
            .headers
            .iter()
            .find(|h| h.name == HEADER_VALUE_DROPPED)
            .and_then(|h| h.value.as_deref());
        assert_eq!(dropped, Some("too large: 2000000 bytes"));
        assert!(
            bare.headers.iter().any(|h| h.name == HEADER_ERROR),
            "the original reason stays"
        );
        assert!(
            DeadLetter::without_value(&bare, "again").is_none(),
            "nothing smaller to send"
        );
    }
}
