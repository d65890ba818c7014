//! Tests of `kafka_config` (beside it, to keep that file about one thing).

use super::*;

fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn kafka(properties: &[(&str, &str)]) -> KafkaConfig {
    KafkaConfig {
        brokers: "b:1".into(),
        create_topics: true,
        topic_partitions: 1,
        topic_replication_factor: -1,
        properties: props(properties),
        property_files: BTreeMap::new(),
        from_files: BTreeSet::new(),
        exactly_once: false,
        transactional_id: None,
        offsets_topic: DEFAULT_OFFSETS_TOPIC.into(),
        transaction_ms: DEFAULT_TRANSACTION_MS,
        transaction_max_events: None,
        transaction_max_bytes: None,
    }
}

#[test]
fn librdkafkas_refusals_are_problems_without_the_value() {
    let config = kafka(&[
        ("ssl.key.passwd", "Zq-secret-1"),
        ("linger.ms", "Zq-secret-3"),
        ("batch.size", "12"),
    ]);
    let problems = config.problems();
    let all = problems.join("\n");
    assert_eq!(problems.len(), 2, "{all}");
    assert!(!all.contains("Zq-secret"), "{all}");
    for key in ["ssl.key.passwd", "linger.ms"] {
        assert!(
            all.contains(&format!(
                "kafka.properties.\"{key}\": librdkafka refuses it"
            )),
            "{all}"
        );
    }
    assert!(all.contains("librdkafka has no such property"), "{all}");
}

#[test]
fn configuration_errors_leave_out_the_value_rdkafka_appends() {
    // rdkafka's Display: "Client config error: <reason> <key> <value>".
    let error = KafkaError::ClientConfig(
        rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
        "Configuration property \"ssl.key.password\" not supported in this build: OpenSSL not available at build time".into(),
        "ssl.key.password".into(),
        "Zq-secret-4".into(),
    );
    assert!(error.to_string().contains("Zq-secret-4"));
    let config = kafka(&[("ssl.key.password", "Zq-secret-4")]);
    let text = config.client_error(&error);
    assert!(!text.contains("Zq-secret-4"), "{text}");
    assert!(text.contains("ssl.key.password"), "{text}");
    assert!(text.contains("does not support the property"), "{text}");
    // librdkafka's reason quotes the value of some properties: for a secret one the
    // message is built from the property's name, so no part of the value is left.
    let error = KafkaError::ClientConfig(
        rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
        "Invalid value \"Zq-secret-4\" for configuration property \"sasl.oauthbearer.config\""
            .into(),
        "sasl.oauthbearer.config".into(),
        "Zq-secret-4".into(),
    );
    let config = kafka(&[("sasl.oauthbearer.config", "Zq-secret-4x")]);
    let text = config.client_error(&error);
    assert!(!text.contains("Zq-secret"), "{text}");
    assert!(text.contains("sasl.oauthbearer.config"), "{text}");
    let config = kafka(&[("ssl.key.password", "Zq-secret-4")]);
    // A text about a secret property says which one, nothing more of librdkafka's words.
    let error = KafkaError::ClientCreation("sasl.password Zq-secret-4 rejected".into());
    let text = config.client_error(&error);
    assert!(!text.contains("Zq-secret-4"), "{text}");
    assert!(text.contains("sasl.password"), "{text}");
    assert!(!format!("{config:?}").contains("Zq-secret-4"));
}

#[test]
fn a_secret_equal_to_a_word_of_librdkafkas_text_leaves_the_text_whole() {
    // The secret's value is never searched for in the text: a password that is also a
    // word of it ("refused", a host's "127") neither blanks the word out nor shows, by
    // the blanks, what the password is.
    for password in ["refused", "127", "Connection"] {
        let config = kafka(&[("sasl.password", password)]);
        let reason =
            "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused";
        let error = KafkaError::ClientCreation(reason.into());
        assert_eq!(
            config.client_error(&error),
            format!("Client creation error: {reason}"),
            "password {password:?}"
        );
    }
}

#[test]
fn secret_files_become_properties_without_their_newline_and_stay_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kafka");
    std::fs::write(&file, "Zq-secret-5\n").unwrap();
    let mut config = kafka(&[("sasl.username", "relay")]);
    config.property_files = [
        ("sasl.password".to_owned(), file.clone()),
        ("sasl.oauthbearer.client.id".to_owned(), file.clone()),
    ]
    .into();
    assert!(config.read_property_files().is_empty());
    assert_eq!(config.properties["sasl.password"], "Zq-secret-5");
    assert!(config.is_secret("sasl.oauthbearer.client.id"));
    assert!(!format!("{config:?}").contains("Zq-secret-5"));
    // Missing, empty, or set twice: each a problem with its key, never the content.
    std::fs::write(&file, "\n").unwrap();
    let mut config = kafka(&[("sasl.password", "Zq-secret-6")]);
    config.property_files = [
        ("sasl.password".to_owned(), file.clone()),
        ("ssl.key.password".to_owned(), file.clone()),
        (
            "sasl.oauthbearer.client.secret".to_owned(),
            dir.path().join("absent"),
        ),
    ]
    .into();
    let all = config.read_property_files().join("\n");
    assert!(all.contains("kafka.property_files.\"sasl.password\": kafka.properties.\"sasl.password\" sets the same property"), "{all}");
    assert!(
        all.contains("kafka.property_files.\"ssl.key.password\"") && all.contains("is empty"),
        "{all}"
    );
    assert!(
        all.contains("kafka.property_files.\"sasl.oauthbearer.client.secret\": cannot read"),
        "{all}"
    );
    assert!(!all.contains("Zq-secret-6"), "{all}");
}

#[test]
fn secret_property_names() {
    for key in [
        "sasl.password",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.config",
        "SASL.PASSWORD",
    ] {
        assert!(is_secret_property(key), "{key}");
    }
    for key in [
        "sasl.username",
        "sasl.mechanism",
        "linger.ms",
        "ssl.ca.location",
    ] {
        assert!(!is_secret_property(key), "{key}");
    }
}

#[test]
fn aliases_and_topic_prefixes_name_one_property() {
    assert_eq!(canonical_property("acks"), "request.required.acks");
    assert_eq!(canonical_property("topic.acks"), "request.required.acks");
    assert_eq!(
        canonical_property("topic.request.required.acks"),
        "request.required.acks"
    );
    assert_eq!(
        canonical_property("delivery.timeout.ms"),
        "message.timeout.ms"
    );
    assert_eq!(
        canonical_property("topic.delivery.timeout.ms"),
        "message.timeout.ms"
    );
    assert_eq!(canonical_property("retries"), "message.send.max.retries");
    assert_eq!(canonical_property("linger.ms"), "queue.buffering.max.ms");
    // A global property that merely starts with "topic." keeps its name.
    assert_eq!(
        canonical_property("topic.metadata.refresh.interval.ms"),
        "topic.metadata.refresh.interval.ms"
    );
}

#[test]
fn settings_that_let_librdkafka_give_up_are_refused_under_every_name() {
    for (key, value, needle) in [
        ("message.timeout.ms", "3000", "gives up"),
        ("delivery.timeout.ms", "3000", "gives up"),
        ("topic.message.timeout.ms", "1", "gives up"),
        ("topic.delivery.timeout.ms", "300000", "gives up"),
        ("acks", "1", "must stay \"all\""),
        ("request.required.acks", "1", "must stay \"all\""),
        ("topic.acks", "0", "must stay \"all\""),
        ("topic.request.required.acks", "1", "must stay \"all\""),
        ("enable.idempotence", "false", "idempotent"),
        ("retries", "3", "unlimited"),
        ("message.send.max.retries", "0", "unlimited"),
        ("transactional.id", "x", "transactions"),
        ("isolation.level", "read_uncommitted", "read_committed"),
        ("isolation.level", "read_committed", "consumers' setting"),
    ] {
        let problems = check_properties(&props(&[(key, value)]));
        assert_eq!(problems.len(), 1, "{key}: {problems:?}");
        assert!(
            problems[0].contains(&format!("\"{key}\"")),
            "names the key: {}",
            problems[0]
        );
        assert!(problems[0].contains(needle), "says why: {}", problems[0]);
        assert!(problems[0].contains("remove the key"), "{}", problems[0]);
    }
}

#[test]
fn exactly_once_refuses_a_message_timeout_and_says_why() {
    let mut settings = kafka(&[("delivery.timeout.ms", "0"), ("linger.ms", "5")]);
    assert!(settings.problems().is_empty(), "{:?}", settings.problems());
    settings.exactly_once = true;
    let problems = settings.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("\"delivery.timeout.ms\"")
            && problems[0].contains("transaction.timeout.ms")
            && problems[0].contains("remove the key"),
        "{}",
        problems[0]
    );
    let config = transactional_producer_config("b:9092", &props(&[]), queue(10), "outbox-relay-s");
    assert_eq!(config.get("transactional.id"), Some("outbox-relay-s"));
    assert_eq!(config.get("message.timeout.ms"), Some("60000"));
    assert_eq!(config.get("enable.idempotence"), Some("true"));
}

#[test]
fn safe_values_pass() {
    assert!(check_properties(&props(&[
        ("message.timeout.ms", "0"),
        ("delivery.timeout.ms", "0"),
        ("acks", "all"),
        ("request.required.acks", "-1"),
        ("topic.acks", "all"),
        ("enable.idempotence", "true"),
        ("retries", "2147483647"),
        ("linger.ms", "50"),
    ]))
    .is_empty());
}

#[test]
fn two_names_of_one_property_with_different_values_are_refused() {
    let problems = check_properties(&props(&[
        ("linger.ms", "5"),
        ("queue.buffering.max.ms", "50"),
    ]));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("\"linger.ms\""), "{}", problems[0]);
    assert!(
        problems[0].contains("\"queue.buffering.max.ms\""),
        "{}",
        problems[0]
    );
    assert!(problems[0].contains("keep one"), "{}", problems[0]);
}

#[test]
fn user_properties_override_defaults_under_any_name() {
    let config = producer_config("b:1", &props(&[("linger.ms", "50")]), queue(100));
    assert_eq!(config.get("linger.ms"), Some("50"));
    assert_eq!(config.get("enable.idempotence"), Some("true"));
    assert_eq!(config.get("acks"), Some("all"));
    assert_eq!(config.get("message.timeout.ms"), Some("0"));
    assert_eq!(config.get("partitioner"), Some("murmur2_random"));
    assert_eq!(config.get("bootstrap.servers"), Some("b:1"));
    assert_eq!(config.get("queue.buffering.max.messages"), Some("1000"));
    // An alias of a default replaces it, rather than racing it.
    let config = producer_config(
        "b:1",
        &props(&[
            ("queue.buffering.max.ms", "50"),
            ("compression.codec", "zstd"),
            ("topic.partitioner", "murmur2"),
        ]),
        queue(100),
    );
    assert_eq!(config.get("linger.ms"), None);
    assert_eq!(config.get("queue.buffering.max.ms"), Some("50"));
    assert_eq!(config.get("compression.type"), None);
    assert_eq!(config.get("compression.codec"), Some("zstd"));
    assert_eq!(config.get("partitioner"), None);
    assert_eq!(config.get("topic.partitioner"), Some("murmur2"));
    // The brokers too, for the producer and the admin client alike.
    let user = props(&[("metadata.broker.list", "other:9092")]);
    for config in [
        producer_config("b:1", &user, queue(100)),
        admin_config("b:1", &user),
    ] {
        assert_eq!(config.get("bootstrap.servers"), None);
        assert_eq!(config.get("metadata.broker.list"), Some("other:9092"));
    }
    assert_eq!(
        admin_config("b:1", &props(&[("linger.ms", "5")])).get("bootstrap.servers"),
        Some("b:1")
    );
    // The admin client's metadata look-up before a creation must not make a broker
    // with auto.create.topics.enable create the topic with its own settings.
    assert_eq!(
        admin_config("b:1", &props(&[])).get("allow.auto.create.topics"),
        Some("false")
    );
}

/// A queue bound of `messages` events and 16 MiB.
fn queue(messages: usize) -> QueueBound {
    QueueBound {
        messages,
        bytes: 16 * 1024 * 1024,
    }
}

#[test]
fn the_queue_bytes_follow_the_byte_bound_and_message_max_bytes() {
    let config = producer_config("b:1", &props(&[]), queue(100));
    // Twice 16 MiB plus librdkafka's default message.max.bytes (1,000,000), in KiB.
    assert_eq!(config.get("queue.buffering.max.kbytes"), Some("33745"));
    let config = producer_config(
        "b:1",
        &props(&[("message.max.bytes", "10485760")]),
        QueueBound {
            messages: 100,
            bytes: 1024,
        },
    );
    assert_eq!(config.get("queue.buffering.max.kbytes"), Some("10242"));
    let user = props(&[("queue.buffering.max.kbytes", "65536")]);
    let config = producer_config("b:1", &user, queue(100));
    assert_eq!(config.get("queue.buffering.max.kbytes"), Some("65536"));
}

#[test]
fn a_queue_too_small_for_the_byte_bound_and_one_record_is_refused() {
    let bound = 16 * 1024 * 1024;
    // 16 MiB + 1,000,000 bytes = 17361 KiB (rounded up).
    let enough = props(&[("queue.buffering.max.kbytes", "17361")]);
    assert_eq!(check_queue_kbytes(&enough, bound), None);
    assert_eq!(check_queue_kbytes(&props(&[]), bound), None, "derived");
    let small = props(&[("queue.buffering.max.kbytes", "17360")]);
    let problem = check_queue_kbytes(&small, bound).expect("refused");
    assert!(
        problem.contains("\"queue.buffering.max.kbytes\"")
            && problem.contains("relay.max_in_flight_bytes")
            && problem.contains("message.max.bytes")
            && problem.contains("remove the key"),
        "{problem}"
    );
    // A larger message.max.bytes needs a larger queue.
    let large_records = props(&[
        ("queue.buffering.max.kbytes", "17361"),
        ("message.max.bytes", "2000000"),
    ]);
    assert!(check_queue_kbytes(&large_records, bound).is_some());
}
