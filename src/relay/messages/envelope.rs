//! The message envelope: a small JSON object that carries a table-less event's id,
//! key and headers next to its payload, Debezium-outbox-like.
//!
//! ```json
//! {"id": "5b0c…", "key": "order-42", "headers": {"type": "OrderCreated"}, "payload": {...}}
//! ```
//!
//! Pure: bytes in, [`Envelope`] (or why not) out. `payload` is kept as the exact JSON
//! text written (never re-serialized, so large numbers and key order survive); `id` and
//! `key` are strings or numbers, `key: null` means no key; header values are strings,
//! numbers, booleans (as their JSON text) or `null`. Any other member is refused: a typo
//! (`header`) would otherwise lose the headers silently.

use std::borrow::{Borrow, Cow};
use std::collections::BTreeMap;

use serde_json::value::RawValue;

/// The members an envelope may have.
pub const MEMBERS: [&str; 4] = ["id", "key", "headers", "payload"];

/// What an envelope gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope<'a> {
    pub id: Option<String>,
    /// `None`: no `key` member; `Some(None)`: `"key": null` (no record key).
    pub key: Option<Option<String>>,
    pub headers: Vec<(String, Option<String>)>,
    /// The payload's JSON text, borrowed from the content (the record's value is a slice
    /// of the message, not a copy); `None` for `"payload": null` (a null record value).
    pub payload: Option<&'a str>,
}

/// A member name of the envelope object, borrowed from the content unless it has
/// escapes.
#[derive(Debug, serde::Deserialize, PartialEq, Eq, PartialOrd, Ord)]
struct Member<'a>(#[serde(borrow)] Cow<'a, str>);

impl Borrow<str> for Member<'_> {
    fn borrow(&self) -> &str {
        &self.0
    }
}

type Members<'a> = BTreeMap<Member<'a>, &'a RawValue>;

/// How the content reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading<'a> {
    /// A JSON object with a `payload` member.
    Envelope(Envelope<'a>),
    /// Not an envelope (not a JSON object, or one without `payload`).
    Plain,
    /// A JSON object with a `payload` member that breaks the envelope's rules.
    Malformed(String),
}

/// Read `content` as an envelope.
pub fn read(content: &[u8]) -> Reading<'_> {
    let first = content.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Reading::Plain;
    }
    let Ok(members) = serde_json::from_slice::<Members>(content) else {
        return Reading::Plain;
    };
    let Some(payload) = members.get("payload") else {
        return Reading::Plain;
    };
    match envelope(&members, payload) {
        Ok(envelope) => Reading::Envelope(envelope),
        Err(reason) => Reading::Malformed(reason),
    }
}

fn envelope<'a>(members: &Members<'a>, payload: &'a RawValue) -> Result<Envelope<'a>, String> {
    if let Some(Member(unknown)) = members.keys().find(|m| !MEMBERS.contains(&&*m.0)) {
        return Err(format!(
            "the envelope has a member {unknown:?}; an envelope has only {} (or write the content without a top-level \"payload\" member to send it as it is)",
            MEMBERS.join(", ")
        ));
    }
    let id = match members.get("id") {
        None => None,
        Some(raw) => match scalar(raw) {
            Scalar::Text(text) => Some(text),
            _ => return Err("the envelope's \"id\" must be a string or a number".into()),
        },
    };
    let key = match members.get("key") {
        None => None,
        Some(raw) => match scalar(raw) {
            Scalar::Text(text) => Some(Some(text)),
            Scalar::Null => Some(None),
            Scalar::Other => {
                return Err("the envelope's \"key\" must be a string, a number or null".into())
            }
        },
    };
    let headers = match members.get("headers") {
        None => Vec::new(),
        Some(raw) => headers(raw)?,
    };
    let payload = match payload.get().trim() {
        "null" => None,
        text => Some(text),
    };
    Ok(Envelope {
        id,
        key,
        headers,
        payload,
    })
}

enum Scalar {
    Text(String),
    Null,
    Other,
}

/// A string's text, a number's or boolean's JSON text, or null.
fn scalar(raw: &RawValue) -> Scalar {
    let text = raw.get().trim();
    match text.as_bytes().first() {
        Some(b'"') => match serde_json::from_str::<String>(text) {
            Ok(s) => Scalar::Text(s),
            Err(_) => Scalar::Other,
        },
        Some(b'-' | b'0'..=b'9') => Scalar::Text(text.to_owned()),
        _ if text == "true" || text == "false" => Scalar::Text(text.to_owned()),
        _ if text == "null" => Scalar::Null,
        _ => Scalar::Other,
    }
}

fn headers(raw: &RawValue) -> Result<Vec<(String, Option<String>)>, String> {
    // Order as written: pairs, not a map (serde_json's map sorts its keys).
    let OrderedPairs(object) = serde_json::from_str(raw.get())
        .map_err(|_| "the envelope's \"headers\" must be an object".to_string())?;
    let mut headers = Vec::with_capacity(object.len());
    for (name, value) in object {
        if name == "id" {
            return Err(
                "the envelope's \"headers\" has \"id\": the id header is the event id, give it as the envelope's \"id\""
                    .into(),
            );
        }
        let value = match value {
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Null => None,
            serde_json::Value::Number(n) => Some(n.to_string()),
            serde_json::Value::Bool(b) => Some(b.to_string()),
            _ => {
                return Err(format!(
                    "the envelope's header {name:?} must be a string, a number, a boolean or null"
                ))
            }
        };
        headers.push((name, value));
    }
    Ok(headers)
}

/// A JSON object's members in the order written.
struct OrderedPairs(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for OrderedPairs {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> serde::de::Visitor<'de> for Pairs {
            type Value = OrderedPairs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<OrderedPairs, A::Error> {
                let mut pairs = Vec::new();
                while let Some(pair) = map.next_entry::<String, serde_json::Value>()? {
                    pairs.push(pair);
                }
                Ok(OrderedPairs(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope_of(text: &str) -> Envelope<'_> {
        match read(text.as_bytes()) {
            Reading::Envelope(e) => e,
            other => panic!("not an envelope: {other:?}"),
        }
    }

    #[test]
    fn a_full_envelope_keeps_the_payload_text_as_written() {
        let e = envelope_of(
            r#"{"id": 42, "key": "order-7", "headers": {"type": "Created", "v": 2, "n": null}, "payload": {"b": 1, "a": 123456789012345678901234567890}}"#,
        );
        assert_eq!(e.id.as_deref(), Some("42"));
        assert_eq!(e.key, Some(Some("order-7".into())));
        assert_eq!(
            e.headers,
            vec![
                ("type".into(), Some("Created".into())),
                ("v".into(), Some("2".into())),
                ("n".into(), None)
            ]
        );
        assert_eq!(
            e.payload,
            Some(r#"{"b": 1, "a": 123456789012345678901234567890}"#)
        );
    }

    #[test]
    fn minimal_envelopes_and_null_payload_and_key() {
        let e = envelope_of(r#"{"payload": "hi"}"#);
        assert_eq!(e.id, None);
        assert_eq!(e.key, None);
        assert_eq!(e.payload, Some("\"hi\""));
        let e = envelope_of(r#"{"key": null, "payload": null}"#);
        assert_eq!(e.key, Some(None));
        assert_eq!(e.payload, None);
    }

    #[test]
    fn plain_content_is_not_an_envelope() {
        for text in [
            "",
            "hello",
            "[1,2]",
            r#"{"order": 3}"#,
            "{broken",
            "  \n",
            "\u{0}\u{1}",
        ] {
            assert_eq!(read(text.as_bytes()), Reading::Plain, "{text:?}");
        }
        assert_eq!(read(&[0xff, 0xfe, b'{']), Reading::Plain);
    }

    #[test]
    fn malformed_envelopes_say_what_is_wrong() {
        for (text, needle) in [
            (r#"{"payload": 1, "header": {}}"#, "\"header\""),
            (r#"{"payload": 1, "id": {"x": 1}}"#, "\"id\" must be"),
            (r#"{"payload": 1, "id": null}"#, "\"id\" must be"),
            (r#"{"payload": 1, "key": [1]}"#, "\"key\" must be"),
            (r#"{"payload": 1, "headers": [1]}"#, "must be an object"),
            (
                r#"{"payload": 1, "headers": {"a": {"b": 1}}}"#,
                "header \"a\"",
            ),
            (r#"{"payload": 1, "headers": {"id": "x"}}"#, "event id"),
        ] {
            match read(text.as_bytes()) {
                Reading::Malformed(reason) => assert!(reason.contains(needle), "{reason}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_read_without_panicking(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = read(&bytes);
        }

        #[test]
        fn any_json_envelope_keeps_its_payload(id in "[a-z0-9]{0,8}", payload in "[a-z0-9 ]{0,16}") {
            let text = serde_json::json!({"id": id, "payload": {"p": payload}}).to_string();
            let e = envelope_of(&text);
            proptest::prop_assert_eq!(e.id, Some(id));
            let back: serde_json::Value = serde_json::from_str(e.payload.unwrap()).unwrap();
            proptest::prop_assert_eq!(back, serde_json::json!({"p": payload}));
        }
    }
}
