//! The embedded default sink: one JSON object per event and line on stdout.
//!
//! ```text
//! {"topic":"outbox.event.order","key":"…","headers":{"id":"…"},"value":<value>,"lsn":"0/16B3748"}
//! ```
//! `value` shows what the Kafka record value would be ([`OutboxEvent::value`]): an
//! envelope object as JSON; a JSON payload (or a text payload that is a JSON object or
//! array) as JSON; other text as a JSON string; bytea as the JSON string `"\\x…"`
//! (PostgreSQL's hex form); a tombstone as `null`. `"partition":n` follows `topic` only
//! when the event has a partition. An event counts as delivered once its line is written
//! and flushed.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;

use crate::event::{OutboxEvent, PayloadFormat};
use crate::metrics::Metrics;
use crate::sink::{NoticeSender, RecordTag, SendError, Sink, SinkError, SinkNotice};

/// Writes JSON lines to any writer (stdout in production, a buffer in tests).
pub struct StdoutSink<W: Write + Send> {
    out: std::io::BufWriter<W>,
    reports: NoticeSender,
    /// Records written since the last flush, in order.
    unflushed: Vec<RecordTag>,
    /// Their count per topic (few topics: a short list).
    unflushed_topics: Vec<(String, u64)>,
    line: Vec<u8>,
    /// Where deliveries are counted per topic, if anywhere.
    metrics: Option<Arc<Metrics>>,
}

impl StdoutSink<std::io::Stdout> {
    pub fn stdout(reports: NoticeSender) -> Self {
        StdoutSink::new(std::io::stdout(), reports)
    }
}

impl<W: Write + Send> StdoutSink<W> {
    pub fn new(out: W, reports: NoticeSender) -> Self {
        StdoutSink {
            out: std::io::BufWriter::with_capacity(256 * 1024, out),
            reports,
            unflushed: Vec::new(),
            unflushed_topics: Vec::new(),
            line: Vec::with_capacity(1024),
            metrics: None,
        }
    }

    /// Count deliveries per topic in `metrics`.
    pub fn counting_into(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    #[cfg(test)]
    fn into_inner(self) -> W {
        match self.out.into_inner() {
            Ok(inner) => inner,
            Err(e) => panic!("flush failed: {}", e.error()),
        }
    }
}

/// Render one event as a JSON line (with the trailing newline).
pub fn render_line(event: &OutboxEvent, line: &mut Vec<u8>) {
    line.clear();
    line.extend_from_slice(b"{\"topic\":");
    push_json_string(line, &event.topic);
    if let Some(partition) = event.partition {
        line.extend_from_slice(b",\"partition\":");
        line.extend_from_slice(partition.to_string().as_bytes());
    }
    line.extend_from_slice(b",\"key\":");
    match &event.key {
        Some(key) => push_json_string(line, key),
        None => line.extend_from_slice(b"null"),
    }
    line.extend_from_slice(b",\"headers\":{");
    for (i, header) in event.headers.iter().enumerate() {
        if i > 0 {
            line.push(b',');
        }
        push_json_string(line, &header.name);
        line.push(b':');
        match &header.value {
            Some(value) => push_json_string(line, value),
            None => line.extend_from_slice(b"null"),
        }
    }
    line.extend_from_slice(b"},\"value\":");
    let value = event.value();
    match (value.as_deref(), event.payload_format) {
        (None, _) => line.extend_from_slice(b"null"),
        // An envelope is a JSON object, whatever the payload's type.
        (Some(bytes), _) if !event.envelope.is_empty() => push_compact_json(line, bytes),
        // PostgreSQL's json is never empty; guard anyway so the line stays JSON.
        (Some(bytes), PayloadFormat::Json) if !bytes.trim_ascii().is_empty() => {
            push_compact_json(line, bytes)
        }
        (Some(bytes), PayloadFormat::Text) if is_json_document(bytes) => {
            push_compact_json(line, bytes)
        }
        (Some(bytes), PayloadFormat::Json | PayloadFormat::Text) => {
            push_json_string(line, &String::from_utf8_lossy(bytes))
        }
        (Some(bytes), PayloadFormat::Binary) => {
            let mut hex = String::with_capacity(2 + bytes.len() * 2);
            hex.push_str("\\x");
            for b in bytes {
                let _ = write!(hex, "{b:02x}");
            }
            push_json_string(line, &hex)
        }
    }
    line.extend_from_slice(b",\"lsn\":\"");
    line.extend_from_slice(event.lsn.to_string().as_bytes());
    line.extend_from_slice(b"\"}\n");
}

/// A text payload that is itself a JSON object or array is written as JSON.
fn is_json_document(bytes: &[u8]) -> bool {
    let trimmed = bytes.trim_ascii_start();
    matches!(trimmed.first(), Some(b'{') | Some(b'['))
        && serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_ok()
}

/// Appends a valid JSON text on one line: line breaks in valid JSON can only be
/// whitespace between tokens (inside strings they must be escaped), so dropping them
/// keeps the value and the one-event-a-line contract (a `json` column keeps its input's
/// formatting, pretty-printed documents included).
fn push_compact_json(line: &mut Vec<u8>, json: &[u8]) {
    line.extend(json.iter().copied().filter(|b| !matches!(b, b'\n' | b'\r')));
}

fn push_json_string(line: &mut Vec<u8>, text: &str) {
    // serde_json's string escaping is exact and fast; writing into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *line, text);
}

/// Stdout cannot take what the relay writes (a closed pipe, a full disk): definite.
fn write_failed(error: std::io::Error) -> SinkError {
    SinkError::Stop(format!("writing to stdout failed: {error}"))
}

impl<W: Write + Send> Sink for StdoutSink<W> {
    fn send(&mut self, event: OutboxEvent, tag: RecordTag) -> Result<(), SendError> {
        render_line(&event, &mut self.line);
        self.out.write_all(&self.line).map_err(write_failed)?;
        self.unflushed.push(tag);
        if self.metrics.is_some() {
            match self
                .unflushed_topics
                .iter_mut()
                .find(|(topic, _)| *topic == event.topic)
            {
                Some((_, count)) => *count += 1,
                None => self.unflushed_topics.push((event.topic, 1)),
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        if self.unflushed.is_empty() {
            return Ok(());
        }
        self.out.flush().map_err(write_failed)?;
        for tag in self.unflushed.drain(..) {
            // A closed channel means the pipeline is gone; nothing is left to tell.
            let _ = self.reports.send(SinkNotice::Delivered { tag });
        }
        if let Some(metrics) = &self.metrics {
            for (topic, count) in self.unflushed_topics.drain(..) {
                metrics.delivered_by_topic.add(&topic, count);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{EnvelopeField, Header, Ticket};
    use crate::Lsn;

    fn event(payload: Option<&str>, format: PayloadFormat) -> OutboxEvent {
        OutboxEvent {
            topic: "outbox.event.order".into(),
            key: Some("k\"1".into()),
            headers: vec![Header {
                name: "id".into(),
                value: Some("k\"1".into()),
            }],
            payload: payload.map(|p| bytes::Bytes::copy_from_slice(p.as_bytes())),
            payload_format: format,
            envelope: Vec::new(),
            tombstone: payload.is_none(),
            partition: None,
            lsn: Lsn(0x1_0000_00AB),
            timestamp_ms: 0,
            outbox: 0,
        }
    }

    fn line_of(event: &OutboxEvent) -> serde_json::Value {
        let mut line = Vec::new();
        render_line(event, &mut line);
        assert_eq!(line.last(), Some(&b'\n'));
        serde_json::from_slice(&line).unwrap()
    }

    #[test]
    fn json_payload_is_written_as_json() {
        let v = line_of(&event(Some("{\"a\": [1, \"ü\"]}"), PayloadFormat::Json));
        assert_eq!(v["value"], serde_json::json!({"a": [1, "ü"]}));
        assert_eq!(v["topic"], "outbox.event.order");
        assert_eq!(v["key"], "k\"1");
        assert_eq!(v["headers"], serde_json::json!({"id": "k\"1"}));
        assert_eq!(v["lsn"], "1/AB");
    }

    #[test]
    fn text_null_and_binary_payloads() {
        assert_eq!(
            line_of(&event(Some("plain \"text\""), PayloadFormat::Text))["value"],
            "plain \"text\""
        );
        assert_eq!(
            line_of(&event(Some("[1,2]"), PayloadFormat::Text))["value"],
            serde_json::json!([1, 2])
        );
        assert_eq!(
            line_of(&event(Some("{broken"), PayloadFormat::Text))["value"],
            "{broken"
        );
        assert_eq!(
            line_of(&event(None, PayloadFormat::Json))["value"],
            serde_json::Value::Null
        );
        assert_eq!(
            line_of(&event(Some("AB"), PayloadFormat::Binary))["value"],
            "\\x4142"
        );
    }

    #[test]
    fn default_line_has_exactly_five_keys_and_partition_only_when_set() {
        let keys = |v: &serde_json::Value| {
            let mut keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
            keys.sort();
            keys
        };
        let plain = event(Some("{}"), PayloadFormat::Json);
        assert_eq!(
            keys(&line_of(&plain)),
            ["headers", "key", "lsn", "topic", "value"]
        );
        let partitioned = OutboxEvent {
            partition: Some(7),
            ..plain
        };
        let v = line_of(&partitioned);
        assert_eq!(v["partition"], 7);
        assert_eq!(
            keys(&v),
            ["headers", "key", "lsn", "partition", "topic", "value"]
        );
    }

    #[test]
    fn pretty_printed_json_payloads_stay_on_one_line() {
        let pretty = "{\n  \"a\": [\n    1,\n    \"two\\nlines\"\r\n  ]\n}\n";
        for format in [PayloadFormat::Json, PayloadFormat::Text] {
            let mut line = Vec::new();
            render_line(&event(Some(pretty), format), &mut line);
            assert_eq!(
                line.iter().filter(|&&b| b == b'\n').count(),
                1,
                "one line: {}",
                String::from_utf8_lossy(&line)
            );
            let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(v["value"], serde_json::json!({"a": [1, "two\nlines"]}));
        }
    }

    #[test]
    fn value_is_what_the_kafka_record_value_would_be() {
        // An envelope is written as its JSON object, even around a text payload.
        let enveloped = OutboxEvent {
            envelope: vec![
                EnvelopeField {
                    name: "eventType".into(),
                    json: "\"Created\"".into(),
                },
                EnvelopeField {
                    name: "shard".into(),
                    json: "3".into(),
                },
            ],
            ..event(Some("plain"), PayloadFormat::Text)
        };
        assert_eq!(
            line_of(&enveloped)["value"],
            serde_json::json!({"payload": "plain", "eventType": "Created", "shard": 3})
        );
        // A tombstone is null even when a payload is stored (an empty one, here).
        let tombstone = OutboxEvent {
            tombstone: true,
            ..event(Some(""), PayloadFormat::Json)
        };
        assert_eq!(line_of(&tombstone)["value"], serde_json::Value::Null);
        // An empty text payload that is not a tombstone is an empty string.
        assert_eq!(line_of(&event(Some(""), PayloadFormat::Text))["value"], "");
        let mut line = Vec::new();
        render_line(&enveloped, &mut line);
        assert!(
            line.starts_with(b"{\"topic\":\"outbox.event.order\",\"key\":"),
            "{}",
            String::from_utf8_lossy(&line)
        );
    }

    #[test]
    fn deliveries_are_reported_only_after_flush() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut sink = StdoutSink::new(Vec::new(), tx);
        let tag = |seq| RecordTag {
            ticket: Ticket { seq, serial: seq },
            dead_letter: false,
        };
        let (first, second) = (tag(7), tag(8));
        sink.send(event(Some("{}"), PayloadFormat::Json), first)
            .unwrap();
        sink.send(event(Some("{}"), PayloadFormat::Json), second)
            .unwrap();
        assert!(
            rx.try_recv().is_err(),
            "nothing is delivered before the flush"
        );
        sink.flush().unwrap();
        assert!(matches!(
            rx.try_recv(),
            Ok(SinkNotice::Delivered { tag }) if tag == first
        ));
        assert!(matches!(
            rx.try_recv(),
            Ok(SinkNotice::Delivered { tag }) if tag == second
        ));
        let written = sink.into_inner();
        assert_eq!(written.iter().filter(|b| **b == b'\n').count(), 2);
    }
}
