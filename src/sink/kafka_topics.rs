//! Topic preparation for the Kafka sink: create a topic through the admin API (or, with
//! `create_topics = false`, check that it exists), and what each answer means. It runs
//! as a task off the pipeline's loop (`Topics::status`), whose outcome wakes the
//! pipeline and is taken in by the sink's poll (`Topics::prepared`); the pure parts
//! (the name check, the classification of answers) are unit-tested here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::error::RDKafkaErrorCode;
use tokio::task::JoinSet;

use crate::sink::kafka_delivery::{Notifier, Wakeup};
use crate::sink::kafka_errors::{action, stop_hint, ErrorAction};
use crate::sink::kafka_log::AdminContext;
use crate::sink::kafka_placement::PartitionCounts;
use crate::sink::{SinkError, TopicStatus};

/// How long an admin request (create topic, metadata) may take. It runs as a task off
/// the pipeline's loop (status updates go on meanwhile); a timeout is asked again
/// within the session ([`UNAVAILABLE_FOR`]).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a topic that does not answer (a broker paused, restarting, overloaded) is
/// asked about again within the session, its records (and, to keep order, those after
/// them) waiting, before the session ends on it. Ending the session sends again what was
/// sent and not yet acknowledged (a CI chaos run: 3,800 second copies after one broker
/// pause of 4 s); waiting too long holds PostgreSQL's shutdown, which waits for the
/// acknowledgements: the same bound as `stall_release_ms`'s default.
const UNAVAILABLE_FOR: Duration = Duration::from_secs(60);
/// The first wait before a topic is asked about again, doubled each time up to
/// [`UNAVAILABLE_RETRY_MAX`].
const UNAVAILABLE_RETRY: Duration = Duration::from_secs(1);
const UNAVAILABLE_RETRY_MAX: Duration = Duration::from_secs(8);
/// How often, and how far apart, a created topic's partition count is asked for while
/// its metadata still has an error: at most about 2 s in all, once per topic.
const COUNT_ATTEMPTS: u32 = 10;
const COUNT_RETRY: Duration = Duration::from_millis(200);
/// How many topics [`Topics`] remembers as ready without a map lookup.
const RECENTLY_READY: usize = 8;

/// What a topic task needs: the admin client and the `[kafka]` topic settings.
#[derive(Clone)]
pub(super) struct TopicPreparer {
    pub(super) admin: Arc<AdminClient<AdminContext>>,
    pub(super) create_topics: bool,
    pub(super) partitions: i32,
    pub(super) replication_factor: i32,
    /// Where each prepared topic's partition count goes (for the message of a partition
    /// placement the topic cannot take).
    pub(super) partition_counts: PartitionCounts,
}

impl TopicPreparer {
    /// Create `topic` (or, with `create_topics = false`, check that it exists).
    pub(super) async fn prepare(&self, topic: &str) -> Result<(), SinkError> {
        self.prepare_as(topic, false).await
    }

    /// The exactly-once offsets topic: created with one partition and
    /// `cleanup.policy=compact` (one checkpoint per slot is all that must stay), or
    /// checked.
    pub(super) async fn prepare_compacted(&self, topic: &str) -> Result<(), SinkError> {
        self.prepare_as(topic, true).await
    }

    async fn prepare_as(&self, topic: &str, compacted: bool) -> Result<(), SinkError> {
        if self.create_topics {
            // A topic that exists needs no CreateTopics: that request goes through the
            // cluster's controller, which a loaded broker answers slowly (20 relays on
            // one broker of two cores took longer than ADMIN_TIMEOUT, and each timeout
            // ended a replication session). The metadata answer is the broker's cache.
            // A metadata request that got no answer at all says the broker is away:
            // CreateTopics would wait as long again for nothing.
            if let Some((None, partitions)) = self.metadata(topic).await? {
                if partitions > 0 {
                    self.partition_counts.record(topic, partitions);
                    tracing::debug!(%topic, partitions, "the topic exists");
                    return Ok(());
                }
            }
            let replication = TopicReplication::Fixed(self.replication_factor);
            let partitions = if compacted { 1 } else { self.partitions };
            let mut new_topic = NewTopic::new(topic, partitions, replication);
            if compacted {
                new_topic = new_topic.set("cleanup.policy", "compact");
            }
            let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
            let results = tokio::time::timeout(
                ADMIN_TIMEOUT,
                self.admin.create_topics(&[new_topic], &options),
            )
            .await
            .map_err(|_| SinkError::TopicUnavailable {
                topic: topic.to_owned(),
                reason: "creating it timed out; is the broker reachable?".into(),
            })?
            .map_err(|e| SinkError::TopicUnavailable {
                topic: topic.to_owned(),
                reason: format!("creating it failed: {e}"),
            })?;
            for result in results {
                if creation_outcome(topic, result.map_err(|(_, code)| code))? {
                    tracing::info!(%topic, "created topic");
                }
            }
            // Best effort: only the message of a partition placement beyond the topic
            // needs the count. A topic just created may be listed with an error (no
            // leader yet) for a moment, longer on a loaded broker: asked again a few
            // times (CI once dead-lettered a record with "no such partition in Kafka's
            // metadata" instead of the count, the first answer having had an error).
            for attempt in 1..=COUNT_ATTEMPTS {
                match self.metadata(topic).await {
                    Ok(Some((None, partitions))) if partitions > 0 => {
                        self.partition_counts.record(topic, partitions);
                        break;
                    }
                    _ if attempt < COUNT_ATTEMPTS => tokio::time::sleep(COUNT_RETRY).await,
                    _ => {}
                }
            }
            Ok(())
        } else {
            let found = self.metadata(topic).await?;
            if let Some((None, partitions)) = found {
                self.partition_counts.record(topic, partitions);
            }
            existence_outcome(topic, found)
        }
    }

    /// `topic`'s error and partition count in the brokers' metadata, `None` when it is
    /// not listed.
    async fn metadata(
        &self,
        topic: &str,
    ) -> Result<Option<(Option<RDKafkaErrorCode>, usize)>, SinkError> {
        let admin = Arc::clone(&self.admin);
        let topic_owned = topic.to_owned();
        let metadata = tokio::task::spawn_blocking(move || {
            admin
                .inner()
                .fetch_metadata(Some(&topic_owned), ADMIN_TIMEOUT)
        })
        .await
        .map_err(|e| SinkError::TopicUnavailable {
            topic: topic.to_owned(),
            reason: format!("the metadata request did not finish: {e}"),
        })?
        .map_err(|e| SinkError::TopicUnavailable {
            topic: topic.to_owned(),
            reason: format!("cannot read its metadata: {e}"),
        })?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        Ok(found.map(|t| (t.error().map(RDKafkaErrorCode::from), t.partitions().len())))
    }
}

#[derive(Debug, Clone)]
enum TopicState {
    Ready,
    Pending,
    Refused(String),
}

/// Where each topic the sink has seen stands, and the tasks preparing new ones.
pub(super) struct Topics {
    pub(super) preparer: TopicPreparer,
    states: HashMap<String, TopicState>,
    /// The topics last found ready in `states`, at most [`RECENTLY_READY`] (a shortcut
    /// for the next records).
    recently_ready: Vec<String>,
    /// Admin requests under way; aborted when the sink is dropped (a new attempt).
    tasks: JoinSet<()>,
    /// Topics that did not answer: since when, and how many times.
    unavailable: HashMap<String, (Instant, u32)>,
}

impl Topics {
    pub(super) fn new(preparer: TopicPreparer) -> Self {
        Topics {
            preparer,
            states: HashMap::new(),
            recently_ready: Vec::with_capacity(RECENTLY_READY),
            tasks: JoinSet::new(),
            unavailable: HashMap::new(),
        }
    }

    /// Where `topic` stands; a topic seen for the first time is created (or checked) by
    /// a task whose outcome wakes the pipeline ([`Wakeup::Topic`]), to be taken in by
    /// [`Topics::prepared`].
    pub(super) fn status(&mut self, topic: &str, notifier: &Notifier) -> TopicStatus {
        // Asked for every record, mostly about a few topics: comparing with the topics
        // found ready last is cheaper than hashing the name.
        if self.recently_ready.iter().any(|ready| ready == topic) {
            return TopicStatus::Ready;
        }
        match self.states.get(topic) {
            Some(TopicState::Ready) => {
                self.remember_ready(topic);
                return TopicStatus::Ready;
            }
            Some(TopicState::Pending) => return TopicStatus::Waiting,
            Some(TopicState::Refused(reason)) => return TopicStatus::Refused(reason.clone()),
            None => {}
        }
        if let Some(reason) = illegal_topic_name(topic) {
            self.states
                .insert(topic.to_owned(), TopicState::Refused(reason.clone()));
            return TopicStatus::Refused(reason);
        }
        while self.tasks.try_join_next().is_some() {}
        self.states.insert(topic.to_owned(), TopicState::Pending);
        // "created topic" (info) follows only when the topic was really missing.
        if self.preparer.create_topics {
            tracing::debug!(%topic, "creating the topic unless it exists");
        } else {
            tracing::debug!(%topic, "checking that the topic exists");
        }
        self.spawn_prepare(topic, Duration::ZERO, notifier);
        TopicStatus::Waiting
    }

    /// Prepares `topic` in a task, after `delay`; its outcome wakes the pipeline.
    fn spawn_prepare(&mut self, topic: &str, delay: Duration, notifier: &Notifier) {
        let preparer = self.preparer.clone();
        let notifier = notifier.clone();
        let topic = topic.to_owned();
        self.tasks.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let outcome = preparer.prepare(&topic).await;
            notifier.wake(Wakeup::Topic { topic, outcome });
        });
    }

    /// `topic` did not answer (`reason`): asked again after a backoff, its records
    /// waiting, unless it has not answered for [`UNAVAILABLE_FOR`] (`false`: the
    /// session ends on it, as the next one asks anew).
    pub(super) fn ask_again(&mut self, topic: &str, reason: &str, notifier: &Notifier) -> bool {
        let now = Instant::now();
        let (since, attempts) = self.unavailable.entry(topic.to_owned()).or_insert((now, 0));
        let Some(delay) = unavailable_retry(now.saturating_duration_since(*since), *attempts)
        else {
            self.unavailable.remove(topic);
            return false;
        };
        *attempts += 1;
        let attempts = *attempts;
        self.states.insert(topic.to_owned(), TopicState::Pending);
        tracing::warn!(
            %topic,
            reason,
            attempts,
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "the topic does not answer; asking again (its records, and those after them, wait)"
        );
        self.spawn_prepare(topic, delay, notifier);
        true
    }

    /// Keep `topic` among the recently ready ones, in place of the oldest when full.
    fn remember_ready(&mut self, topic: &str) {
        if self.recently_ready.len() == RECENTLY_READY {
            self.recently_ready.remove(0);
        }
        self.recently_ready.push(topic.to_owned());
    }

    /// Record the outcome of a topic task.
    pub(super) fn prepared(&mut self, topic: &str, outcome: &Result<(), SinkError>) {
        if outcome.is_err() {
            self.recently_ready.retain(|ready| ready != topic);
        }
        if !matches!(outcome, Err(SinkError::TopicUnavailable { .. })) {
            self.unavailable.remove(topic);
        }
        match outcome {
            Ok(()) => {
                self.states.insert(topic.to_owned(), TopicState::Ready);
            }
            Err(SinkError::TopicRefused { reason, .. }) => {
                self.states
                    .insert(topic.to_owned(), TopicState::Refused(reason.clone()));
            }
            Err(_) => {
                // Asked again by the next attempt.
                self.states.remove(topic);
            }
        }
    }

    /// Make sure `topic` exists, creating it when allowed, waiting for the answer (for
    /// the dead-letter topic, before streaming starts).
    pub(super) async fn prepare_now(&mut self, topic: &str) -> Result<(), SinkError> {
        if let Some(reason) = illegal_topic_name(topic) {
            return Err(SinkError::TopicRefused {
                topic: topic.to_owned(),
                reason,
            });
        }
        self.preparer.prepare(topic).await?;
        self.states.insert(topic.to_owned(), TopicState::Ready);
        Ok(())
    }
}

/// The wait before a topic that has not answered for `unanswered`, asked `attempts`
/// times already, is asked again; `None` once [`UNAVAILABLE_FOR`] has passed.
fn unavailable_retry(unanswered: Duration, attempts: u32) -> Option<Duration> {
    if unanswered >= UNAVAILABLE_FOR {
        return None;
    }
    let doubled = UNAVAILABLE_RETRY.saturating_mul(1 << attempts.min(8));
    Some(doubled.min(UNAVAILABLE_RETRY_MAX))
}

/// What a metadata answer about `topic` means when the relay may not create it:
/// `found` is the topic's error and partition count, `None` when it is not listed.
fn existence_outcome(
    topic: &str,
    found: Option<(Option<RDKafkaErrorCode>, usize)>,
) -> Result<(), SinkError> {
    let missing = || {
        SinkError::Stop(format!(
            "topic {topic:?} does not exist and [kafka] create_topics = false; create it or enable create_topics"
        ))
    };
    match found {
        Some((None, partitions)) if partitions > 0 => Ok(()),
        None | Some((None, _)) => Err(missing()),
        Some((Some(RDKafkaErrorCode::UnknownTopicOrPartition), _)) => Err(missing()),
        Some((Some(code), _)) => Err(match action(code) {
            ErrorAction::DeadLetter => SinkError::TopicRefused {
                topic: topic.to_owned(),
                reason: format!("Kafka refuses it: {code}"),
            },
            ErrorAction::Stop => SinkError::Stop(format!(
                "topic {topic:?}: the broker refused its metadata: {code}; {}",
                stop_hint(code)
            )),
            ErrorAction::Retry => SinkError::TopicUnavailable {
                topic: topic.to_owned(),
                reason: format!("its metadata has an error: {code}"),
            },
        }),
    }
}

/// What a CreateTopics answer means: `Ok(true)` created, `Ok(false)` already there, or
/// the refusal classified by [`action`]: an illegal name (its events are dead letters),
/// a setting or permission to fix (stop), or a transient failure (retry).
fn creation_outcome(
    topic: &str,
    result: Result<String, RDKafkaErrorCode>,
) -> Result<bool, SinkError> {
    match result {
        Ok(_) => Ok(true),
        Err(RDKafkaErrorCode::TopicAlreadyExists) => Ok(false),
        Err(code) => Err(match action(code) {
            ErrorAction::DeadLetter => SinkError::TopicRefused {
                topic: topic.to_owned(),
                reason: format!("the broker refused to create it: {code}"),
            },
            ErrorAction::Stop => SinkError::Stop(format!(
                "topic {topic:?}: the broker refused to create it: {code}; {}",
                stop_hint(code)
            )),
            // NOT_CONTROLLER, REQUEST_TIMED_OUT, a topic being deleted, brokers still
            // fenced after an outage...: ask again.
            ErrorAction::Retry => SinkError::TopicUnavailable {
                topic: topic.to_owned(),
                reason: if code == RDKafkaErrorCode::InvalidReplicationFactor {
                    format!(
                        "creating it failed: {code}; retrying, as brokers still fenced after an outage give this too. If it persists, [kafka] topic_replication_factor asks for more replicas than the cluster has brokers: lower it (-1 takes the broker's default)"
                    )
                } else {
                    format!("creating it failed for now: {code}")
                },
            },
        }),
    }
}

/// Why Kafka would refuse this topic name, checked before producing to it.
pub fn illegal_topic_name(topic: &str) -> Option<String> {
    if topic.is_empty() {
        return Some("a topic name cannot be empty".into());
    }
    if topic == "." || topic == ".." {
        return Some("a topic name cannot be \".\" or \"..\"".into());
    }
    if topic.len() > 249 {
        return Some(format!(
            "a topic name is at most 249 characters, this one has {}",
            topic.len()
        ));
    }
    if let Some(bad) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Some(format!(
            "Kafka topic names may contain only ASCII letters, digits, '.', '_' and '-', not {bad:?}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_topic_is_asked_again_with_backoff_for_a_bounded_time() {
        let waits: Vec<_> = (0..6)
            .map(|attempts| unavailable_retry(Duration::from_secs(5), attempts))
            .collect();
        let s = |secs| Some(Duration::from_secs(secs));
        assert_eq!(waits, [s(1), s(2), s(4), s(8), s(8), s(8)]);
        assert_eq!(unavailable_retry(Duration::from_secs(1), u32::MAX), s(8));
        assert_eq!(unavailable_retry(UNAVAILABLE_FOR, 3), None);
    }

    #[test]
    fn topic_names_kafka_refuses_are_caught_before_sending() {
        assert_eq!(illegal_topic_name("outbox.event.Order_1-x"), None);
        for bad in ["", ".", "..", "outbox.event.注文", "a b", "a/b"] {
            assert!(illegal_topic_name(bad).is_some(), "{bad:?}");
        }
        assert!(illegal_topic_name(&"x".repeat(250)).is_some());
        assert!(illegal_topic_name(&"x".repeat(249)).is_none());
    }

    #[test]
    fn a_refused_creation_is_classified_and_names_the_topic_and_the_fix() {
        assert!(creation_outcome("t", Ok("t".into())).unwrap());
        assert!(!creation_outcome("t", Err(RDKafkaErrorCode::TopicAlreadyExists)).unwrap());
        let err = creation_outcome("outbox.event.x", Err(RDKafkaErrorCode::InvalidPartitions))
            .unwrap_err();
        assert!(matches!(err, SinkError::Stop(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("outbox.event.x"), "{text}");
        assert!(text.contains("refused to create"), "{text}");
        assert!(text.contains("topic_partitions"), "{text}");
        // Retried (fenced brokers give it too), naming the setting should it persist.
        let err = creation_outcome(
            "outbox.event.x",
            Err(RDKafkaErrorCode::InvalidReplicationFactor),
        )
        .unwrap_err();
        assert!(matches!(err, SinkError::TopicUnavailable { .. }), "{err:?}");
        assert!(
            err.to_string().contains("topic_replication_factor"),
            "{err}"
        );
        let err =
            creation_outcome("t", Err(RDKafkaErrorCode::TopicAuthorizationFailed)).unwrap_err();
        assert!(matches!(err, SinkError::Stop(_)), "{err:?}");
        assert!(err.to_string().contains("CREATE"), "{err}");
        for transient in [
            RDKafkaErrorCode::NotController,
            RDKafkaErrorCode::RequestTimedOut,
        ] {
            let err = creation_outcome("t", Err(transient)).unwrap_err();
            assert!(
                matches!(err, SinkError::TopicUnavailable { .. }),
                "{transient:?}: {err:?}"
            );
        }
        let err = creation_outcome("t", Err(RDKafkaErrorCode::InvalidTopic)).unwrap_err();
        assert!(matches!(err, SinkError::TopicRefused { .. }), "{err:?}");
    }

    #[test]
    fn a_missing_topic_without_create_topics_stops_naming_the_setting() {
        assert!(existence_outcome("t", Some((None, 3))).is_ok());
        for found in [
            None,
            Some((None, 0)),
            Some((Some(RDKafkaErrorCode::UnknownTopicOrPartition), 0)),
        ] {
            let err = existence_outcome("outbox.event.t", found).unwrap_err();
            assert!(matches!(err, SinkError::Stop(_)), "{err:?}");
            assert!(err.to_string().contains("create_topics"), "{err}");
            assert!(err.to_string().contains("outbox.event.t"), "{err}");
        }
        assert!(matches!(
            existence_outcome("t", Some((Some(RDKafkaErrorCode::LeaderNotAvailable), 1))),
            Err(SinkError::TopicUnavailable { .. })
        ));
        assert!(matches!(
            existence_outcome(
                "t",
                Some((Some(RDKafkaErrorCode::TopicAuthorizationFailed), 0))
            ),
            Err(SinkError::Stop(_))
        ));
    }
}
