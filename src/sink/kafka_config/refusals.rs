//! What the relay refuses in `[kafka.properties]`, by canonical name: values that would
//! weaken idempotence, acks, retries or the message timeout, properties that are the
//! relay's own business (transactions, isolation), what `exactly_once` adds, and two
//! names of one property set to different values. Each problem names the key as written
//! and never shows a secret value.

use std::collections::BTreeMap;

use super::canonical_property;
use crate::sink::kafka_secrets::is_secret_property;

/// librdkafka's `message.send.max.retries` default (`INT32_MAX`), which idempotence
/// sets when the user does not.
const UNLIMITED_RETRIES: &str = "2147483647";

/// Why the relay refuses a value of one (canonical) property, or `None` when it is fine.
fn refusal(canonical: &str, value: &str) -> Option<String> {
    let value = value.trim().to_ascii_lowercase();
    match canonical {
        "enable.idempotence" if value != "true" => Some(
            "must stay \"true\": the relay acknowledges PostgreSQL only after Kafka confirmed, which needs an idempotent producer to keep order without duplicates from its own retries; remove the key".into(),
        ),
        "request.required.acks" if value != "all" && value != "-1" => Some(
            "must stay \"all\": an event is durable, and may be acknowledged to PostgreSQL, only once every in-sync replica has it; remove the key".into(),
        ),
        "message.timeout.ms" if value != "0" => Some(
            "must be \"0\" (no timeout): with a timeout librdkafka gives up on events during a broker outage longer than it; the relay waits instead (max_in_flight bounds memory, [relay] stall_release_ms frees PostgreSQL); remove the key".into(),
        ),
        "message.send.max.retries" if value != UNLIMITED_RETRIES => Some(format!(
            "must stay {UNLIMITED_RETRIES} (unlimited): with fewer retries librdkafka gives up on events the broker refuses for a while; remove the key"
        )),
        "transactional.id" => Some(
            "Kafka transactions are the relay's own business: set [kafka] exactly_once = true (and [kafka] transactional_id to choose the id), which also writes the checkpoint that makes restarts skip what Kafka committed; a bare transactional.id would do neither; remove the key".into(),
        ),
        "isolation.level" => Some(
            "the relay reads its exactly-once checkpoint read_committed, and its producer has no isolation level; it is the consumers' setting (isolation.level=read_committed in their configuration); remove the key".into(),
        ),
        _ => None,
    }
}

/// What `exactly_once = true` adds to the refusals: the relay sets these itself.
pub(super) fn check_exactly_once_properties(properties: &BTreeMap<String, String>) -> Vec<String> {
    properties
        .iter()
        .filter(|(key, _)| canonical_property(key) == "message.timeout.ms")
        .map(|(key, value)| {
            format!(
                "kafka.properties.\"{key}\": {} is refused with exactly_once: a transactional producer's message.timeout.ms must not exceed transaction.timeout.ms, and the relay sets it to that (a timed-out record aborts its Kafka transaction, which the relay then sends again from the checkpoint); remove the key",
                shown_value(key, value)
            )
        })
        .collect()
}

/// A value as librdkafka reads it, for comparing two names of one property.
fn same_value(canonical: &str, value: &str) -> String {
    let value = value.trim().to_ascii_lowercase();
    if canonical == "request.required.acks" && value == "-1" {
        return "all".into();
    }
    value
}

/// Every problem of `[kafka.properties]`, each naming the key as written.
pub fn check_properties(properties: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for (key, value) in properties {
        let canonical = canonical_property(key);
        let also = if canonical == key.trim() {
            String::new()
        } else {
            format!(" ({key:?} is librdkafka's name for {canonical:?})")
        };
        if let Some(why) = refusal(canonical, value) {
            problems.push(format!(
                "kafka.properties.\"{key}\"{also}: {} is refused: {why}",
                shown_value(key, value)
            ));
        }
        match seen.get(canonical) {
            Some((first_key, first_value))
                if same_value(canonical, first_value) != same_value(canonical, value) =>
            {
                let (first_value, value) =
                    (shown_value(first_key, first_value), shown_value(key, value));
                problems.push(format!(
                    "kafka.properties: \"{first_key}\" = {first_value} and \"{key}\" = {value} set the same librdkafka property ({canonical:?}) to different values, and which one wins would be chance; keep one"
                ));
            }
            Some(_) => {}
            None => {
                seen.insert(canonical, (key, value));
            }
        }
    }
    problems
}

/// A property's value quoted for a message, or `***` for a secret one.
fn shown_value(key: &str, value: &str) -> String {
    if is_secret_property(key) {
        "***".into()
    } else {
        format!("{value:?}")
    }
}
