//! The Kafka side: the brokers and the topics the router sends to.

use super::*;
use crate::ops::check::kafka;
use crate::sink::kafka_probe::{ClusterFacts, ProbeError};

#[test]
fn kafka_topics_constant_or_by_prefix() {
    let cluster = ClusterFacts {
        brokers: vec!["127.0.0.1:9092".into()],
        topics: [
            ("outbox.event.order".to_owned(), Ok(3)),
            ("dlq".to_owned(), Ok(1)),
        ]
        .into_iter()
        .collect(),
    };
    let target =
        |constant: Option<&str>, create: bool, dead_letter: Option<&'static str>| kafka::Target {
            brokers: "127.0.0.1:9092",
            create_topics: create,
            routes: vec![kafka::Route {
                table: None,
                constant_topic: constant.map(str::to_owned),
                topic_prefix: constant.unwrap_or("outbox.event.").to_owned(),
            }],
            dead_letter_topic: dead_letter,
        };
    let status = |found: &[Finding], id: &str| found.iter().find(|f| f.id == id).map(|f| f.status);
    let found = kafka::findings(&Ok(cluster.clone()), &target(None, true, Some("dlq")));
    assert!(found.iter().all(|f| f.status == Status::Ok), "{found:#?}");
    assert!(
        found[1].message.contains("outbox.event.order"),
        "{found:#?}"
    );
    let found = kafka::findings(
        &Ok(cluster.clone()),
        &target(Some("events"), false, Some("dead")),
    );
    assert_eq!(status(&found, "kafka.topics"), Some(Status::Problem));
    assert_eq!(status(&found, "kafka.dead_letter"), Some(Status::Problem));
    let found = kafka::findings(&Ok(cluster.clone()), &target(Some("events"), true, None));
    assert!(found.iter().all(|f| f.status == Status::Ok), "{found:#?}");
    let found = kafka::findings(&Ok(cluster), &target(None, false, None));
    assert_eq!(status(&found, "kafka.topics"), Some(Status::Warning));
    let unreachable = Err(ProbeError::Unreachable {
        brokers: "b:1".into(),
        secs: 10,
        reason: "down".into(),
    });
    let found = kafka::findings(&unreachable, &target(None, true, None));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].status, Status::Problem);
}
