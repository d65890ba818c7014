//! Pure: what the Kafka cluster's metadata says ([`ClusterFacts`], asked by
//! [`crate::sink::kafka_probe`]) → findings about the brokers, the topics the router
//! would produce to, and the dead-letter topic.

use crate::sink::kafka_probe::{ClusterFacts, ProbeError};

use super::Finding;

/// What the Kafka findings are checked against.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub brokers: &'a str,
    pub create_topics: bool,
    /// The topics of each outbox table's router, in the configuration's order.
    pub routes: Vec<Route>,
    pub dead_letter_topic: Option<&'a str>,
}

/// The topics one outbox table's router sends to.
#[derive(Debug, Clone)]
pub struct Route {
    /// The outbox table, named in the finding when there are several.
    pub table: Option<String>,
    /// Every event's topic, when the template uses no group of the regex.
    pub constant_topic: Option<String>,
    /// The template's text before its first group.
    pub topic_prefix: String,
}

/// Topics listed by name in a finding at most.
const LISTED_TOPICS: usize = 20;

pub fn findings(cluster: &Result<ClusterFacts, ProbeError>, target: &Target<'_>) -> Vec<Finding> {
    let cluster = match cluster {
        Ok(cluster) => cluster,
        Err(error) => {
            let fix = match error {
                ProbeError::Client(_) => "fix the [kafka.properties] entry librdkafka names",
                ProbeError::Unreachable { .. } => "check [kafka] brokers, that the brokers run and are reachable from here, and the security.protocol, sasl.* and ssl.* entries of [kafka.properties]",
            };
            return vec![Finding::problem(
                "kafka.brokers",
                format!("{error}; the topics could not be checked"),
                fix,
            )];
        }
    };
    let mut out = vec![Finding::ok(
        "kafka.brokers",
        format!(
            "the cluster at {} answered: {} broker(s) ({})",
            target.brokers,
            cluster.brokers.len(),
            cluster.brokers.join(", ")
        ),
    )];
    for route in &target.routes {
        let mut finding = topics(cluster, route, target.create_topics);
        if let Some(table) = &route.table {
            finding.message = format!("{table}: {}", finding.message);
        }
        out.push(finding);
    }
    out.push(dead_letter(cluster, target));
    out
}

fn topics(cluster: &ClusterFacts, route: &Route, create_topics: bool) -> Finding {
    const ID: &str = "kafka.topics";
    if let Some(topic) = &route.constant_topic {
        return match cluster.topics.get(topic) {
            Some(Ok(partitions)) => Finding::ok(
                ID,
                format!("every event goes to topic {topic:?}, which exists ({partitions} partition(s))"),
            ),
            Some(Err(error)) => Finding::problem(
                ID,
                format!("every event goes to topic {topic:?}, and the cluster reports for it: {error}"),
                "grant the relay's principal Describe and Write on the topic, or fix the topic",
            ),
            None if create_topics => Finding::ok(
                ID,
                format!("every event goes to topic {topic:?}, which does not exist yet; the relay will create it (create_topics = true)"),
            ),
            None => Finding::problem(
                ID,
                format!("every event goes to topic {topic:?}, which does not exist, and create_topics = false: the relay would stop at the first event"),
                format!("create the topic (kafka-topics.sh --create --topic {topic}) or set [kafka] create_topics = true"),
            ),
        };
    }
    let prefix = &route.topic_prefix;
    let matching: Vec<&String> = cluster
        .topics
        .keys()
        .filter(|name| name.starts_with(prefix.as_str()))
        .collect();
    let listed = if matching.is_empty() {
        "none exists yet".to_owned()
    } else {
        let mut names: Vec<&str> = matching
            .iter()
            .take(LISTED_TOPICS)
            .map(|s| s.as_str())
            .collect();
        if matching.len() > LISTED_TOPICS {
            names.push("...");
        }
        format!("{} exist: {}", matching.len(), names.join(", "))
    };
    let message = format!(
        "topics depend on each row's route-by value, so they cannot all be checked; of the topics starting with {prefix:?}, {listed}"
    );
    if create_topics {
        Finding::ok(
            ID,
            format!("{message}; the relay creates missing ones (create_topics = true)"),
        )
    } else {
        Finding::warning(
            ID,
            format!("{message}; with create_topics = false an event routed to a missing topic stops the relay"),
            "create every topic the route-by values name before their events are written, or set [kafka] create_topics = true",
        )
    }
}

fn dead_letter(cluster: &ClusterFacts, target: &Target<'_>) -> Finding {
    const ID: &str = "kafka.dead_letter";
    let Some(topic) = target.dead_letter_topic else {
        return Finding::ok(
            ID,
            "no [dead_letter] topic: the relay stops, without acknowledging, on an event it cannot deliver",
        );
    };
    match cluster.topics.get(topic) {
        Some(Ok(partitions)) => Finding::ok(
            ID,
            format!("dead-letter topic {topic:?} exists ({partitions} partition(s))"),
        ),
        Some(Err(error)) => Finding::problem(
            ID,
            format!("dead-letter topic {topic:?}: the cluster reports {error}"),
            "grant the relay's principal Describe and Write on the topic, or fix the topic",
        ),
        None if target.create_topics => Finding::ok(
            ID,
            format!("dead-letter topic {topic:?} does not exist yet; the relay will create it when needed (create_topics = true)"),
        ),
        None => Finding::problem(
            ID,
            format!("dead-letter topic {topic:?} does not exist, and create_topics = false: the first invalid event would stop the relay"),
            format!("create the topic (kafka-topics.sh --create --topic {topic}) or set [kafka] create_topics = true"),
        ),
    }
}
