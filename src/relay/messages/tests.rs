use super::config::*;
use super::*;

fn bytes_of(content: &[u8]) -> bytes::Bytes {
    bytes::Bytes::copy_from_slice(content)
}

fn router(text: &str) -> Result<MessageRouter, Vec<String>> {
    let config: MessagesConfig = toml::from_str(text).map_err(|e| vec![e.to_string()])?;
    MessageRouter::try_new(&config)
}

fn context() -> MessageContext {
    MessageContext {
        lsn: Lsn(0x16B_3748),
        timestamp_ms: 7,
    }
}

fn routed(router: &MessageRouter, prefix: &str, content: &str) -> OutboxEvent {
    router
        .route(prefix, &bytes_of(content.as_bytes()), context())
        .expect("relayed")
        .expect("routed")
}

#[test]
fn exact_prefixes_fixed_topics_and_a_pattern_route_by_prefix() {
    let r = router(
        r#"
        prefixes = ["orders"]
        topics = ["payments=payments.v1", "a=b=c"]
        prefix_regex = 'outbox\.(?<routedByValue>[a-z]+)'
        "#,
    )
    .unwrap();
    assert_eq!(r.topic("orders").as_deref(), Some("outbox.event.orders"));
    assert_eq!(r.topic("payments").as_deref(), Some("payments.v1"));
    assert_eq!(
        r.topic("a=b").as_deref(),
        Some("c"),
        "split at the last '='"
    );
    assert_eq!(r.topic("outbox.user").as_deref(), Some("outbox.event.user"));
    assert_eq!(
        r.topic("outbox.User"),
        None,
        "the regex matches the whole prefix"
    );
    assert_eq!(r.topic("other"), None);
    assert_eq!(r.topic("order"), None);
    assert!(r.route("other", &bytes_of(b"{}"), context()).is_none());
}

#[test]
fn a_plain_message_gets_an_lsn_id_and_its_content_as_value() {
    let r = router(r#"prefixes = ["orders"]"#).unwrap();
    let e = routed(&r, "orders", r#"{"order": 3}"#);
    assert_eq!(e.topic, "outbox.event.orders");
    assert_eq!(e.key.as_deref(), Some("0/16B3748"));
    assert_eq!(e.headers[0].name, "id");
    assert_eq!(e.headers[0].value.as_deref(), Some("0/16B3748"));
    assert_eq!(e.value().as_deref(), Some(&br#"{"order": 3}"#[..]));
    assert_eq!(e.payload_format, PayloadFormat::Json);
    assert_eq!(e.timestamp_ms, 7);
    assert_eq!(
        routed(&r, "orders", "hi").payload_format,
        PayloadFormat::Text
    );
    let binary = r
        .route("orders", &bytes_of(&[0xff, 0]), context())
        .unwrap()
        .unwrap();
    assert_eq!(binary.payload_format, PayloadFormat::Binary);
}

#[test]
fn an_envelope_gives_id_key_headers_and_payload() {
    let r = router(r#"prefixes = ["orders"]"#).unwrap();
    let e = routed(
        &r,
        "orders",
        r#"{"id":"e1","key":"order-7","headers":{"type":"Created"},"payload":{"total":1}}"#,
    );
    assert_eq!(e.key.as_deref(), Some("order-7"));
    let headers: Vec<_> = e
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_deref()))
        .collect();
    assert_eq!(headers, [("id", Some("e1")), ("type", Some("Created"))]);
    assert_eq!(e.value().as_deref(), Some(&br#"{"total":1}"#[..]));
    // No key in the envelope: the id, or what messages.key says.
    let e = routed(&r, "orders", r#"{"id":"e2","payload":1}"#);
    assert_eq!(e.key.as_deref(), Some("e2"));
    let r = router("prefixes = [\"orders\"]\nkey = \"prefix\"").unwrap();
    assert_eq!(
        routed(&r, "orders", r#"{"payload":1}"#).key.as_deref(),
        Some("orders")
    );
    let r = router("prefixes = [\"orders\"]\nkey = \"none\"").unwrap();
    assert_eq!(routed(&r, "orders", r#"{"payload":1}"#).key, None);
    assert_eq!(
        routed(&r, "orders", r#"{"key":"k","payload":null}"#).value(),
        None,
        "a null payload is a null value"
    );
}

#[test]
fn envelope_modes() {
    let r = router("prefixes = [\"p\"]\nenvelope = \"never\"").unwrap();
    let e = routed(&r, "p", r#"{"id":"x","payload":1}"#);
    assert_eq!(e.headers[0].value.as_deref(), Some("0/16B3748"));
    assert_eq!(
        e.value().as_deref(),
        Some(&br#"{"id":"x","payload":1}"#[..])
    );
    let r = router("prefixes = [\"p\"]\nenvelope = \"always\"").unwrap();
    let err = r
        .route("p", &bytes_of(b"plain"), context())
        .unwrap()
        .unwrap_err();
    assert!(err.reason.contains("not an envelope"), "{err}");
    assert_eq!(err.content.as_deref(), Some(&b"plain"[..]));
}

#[test]
fn malformed_and_oversize_messages_are_errors_with_their_reason() {
    let r = router("prefixes = [\"p\"]\nmax_bytes = 10").unwrap();
    let err = r
        .route("p", &bytes_of(br#"{"payload":1,"x":2}"#), context())
        .unwrap()
        .unwrap_err();
    assert!(err.reason.contains("max_bytes"), "{err}");
    assert_eq!(err.content, None, "too large to carry");
    let r = router("prefixes = [\"p\"]").unwrap();
    let err = r
        .route("p", &bytes_of(br#"{"payload":1,"x":2}"#), context())
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("\"x\""), "{err}");
    assert!(err.to_string().contains("0/16B3748"), "{err}");
    assert_eq!(err.topic, "outbox.event.p");
    assert!(
        !format!("{err:?}").contains("\"x\":2"),
        "no content in Debug"
    );
}

#[test]
fn problems_are_reported_with_their_path() {
    let all = router("").unwrap_err().join("\n");
    assert!(all.contains("messages: no prefix is relayed"), "{all}");
    let all = router(
        r#"
        prefixes = [""]
        topics = ["nope", "=x"]
        prefix_regex = "("
        topic = ""
        max_bytes = 0
        "#,
    )
    .unwrap_err()
    .join("\n");
    for needle in [
        "messages.prefixes[0]",
        "messages.topics[0]",
        "messages.topics[1]",
        "messages.prefix_regex",
        "messages.topic:",
        "messages.max_bytes",
    ] {
        assert!(all.contains(needle), "missing {needle} in {all}");
    }
    let all = router("prefixes = [\"p\"]\ntopic = \"t.${name}\"")
        .unwrap_err()
        .join("\n");
    assert!(all.contains("messages.topic"), "{all}");
    // A pattern's own groups are fine when only the pattern uses the template.
    let r = router("prefix_regex = 'ev\\.(?<name>.+)'\ntopic = \"t.${name}\"").unwrap();
    assert_eq!(r.topic("ev.x").as_deref(), Some("t.x"));
    let err = toml::from_str::<MessagesConfig>("prefixes = []\nprefixs = []").unwrap_err();
    assert!(err.to_string().contains("prefixs"), "{err}");
    let err = toml::from_str::<MessagesConfig>("non_transactional = \"maybe\"").unwrap_err();
    assert!(err.to_string().contains("refuse"), "{err}");
}

#[test]
fn disabled_builds_no_router() {
    let config: MessagesConfig = toml::from_str("enabled = false").unwrap();
    assert!(config.build().unwrap().is_none());
}
