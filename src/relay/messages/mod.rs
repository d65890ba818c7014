//! The table-less outbox: events written with `pg_logical_emit_message(true, prefix,
//! content)`, routed by prefix. Pure: `(prefix, content, position) → OutboxEvent`.
//!
//! ```text
//! Message 'M' ──▶ MessageRouter::route ──▶ None                        (prefix not relayed)
//!   prefix          │ which topic: topics["prefix"] | prefixes → template | prefix_regex → template
//!   content         │ envelope::read: {"id","key","headers","payload"} or the content as is
//!   lsn             └──────────────▶ Some(Ok(OutboxEvent)) | Some(Err(MessageError))
//! ```
//!
//! PostgreSQL does not filter messages by publication: every message written in the
//! database reaches the relay, so only the configured prefixes are relayed, the others
//! are counted and passed over. A transactional message is decoded inside its
//! transaction's Begin..Commit (and never when the transaction rolls back), so it is
//! acknowledged by the same rules as a table event: its transaction's `end_lsn`, once it
//! and everything before it were delivered ([`crate::relay::txn`]).
//!
//! The event id is the envelope's `id`, else the message's LSN as PostgreSQL prints it
//! (`0/16B3748`): unique within the cluster's WAL, and the same when the message is sent
//! again after a restart, so consumers can deduplicate on it.

pub mod config;
pub mod envelope;

use std::collections::{HashMap, HashSet};

use regex::Regex;

use crate::event::{Header, OutboxEvent, PayloadFormat};
use crate::pg::Lsn;
use crate::relay::router::placement::TopicRule;
use config::{EnvelopeMode, KeySource, MessagesConfig, NonTransactional};
use envelope::Reading;

/// A relayed message that cannot become a record as it is: it goes to the dead-letter
/// topic with the reason, or the relay stops without acknowledging it.
///
/// `Display` and `Debug` leave the content out (never log payloads).
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[error("message at {lsn} with prefix {prefix:?}: {reason}")]
pub struct MessageError {
    pub prefix: String,
    pub lsn: Lsn,
    pub reason: String,
    /// The topic it was routed to.
    pub topic: String,
    /// The content, for the dead-letter record; `None` when it is too large to carry.
    pub content: Option<Vec<u8>>,
}

impl std::fmt::Debug for MessageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageError")
            .field("prefix", &self.prefix)
            .field("lsn", &self.lsn)
            .field("reason", &self.reason)
            .field("topic", &self.topic)
            .field(
                "content",
                &format_args!("<{} bytes>", self.content.as_ref().map_or(0, Vec::len)),
            )
            .finish()
    }
}

/// The routing rules taken from `[messages]`.
#[derive(Debug, Clone)]
pub struct MessageRouter {
    /// Exact prefixes to the `topic` template.
    prefixes: HashSet<String>,
    /// Exact prefixes with a topic of their own.
    topics: HashMap<String, String>,
    /// The template for exact prefixes (the whole prefix as the routed value).
    exact_rule: TopicRule,
    /// `prefix_regex` (anchored) and the template filled from its groups.
    pattern: Option<(Regex, TopicRule)>,
    envelope: EnvelopeMode,
    key: KeySource,
    non_transactional: NonTransactional,
    max_bytes: usize,
}

/// Where a message's record goes, and what it carries.
#[derive(Debug, Clone, Copy)]
pub struct MessageContext {
    pub lsn: Lsn,
    /// The record timestamp: the transaction's commit time (the time it was received
    /// for a non-transactional message).
    pub timestamp_ms: i64,
}

impl MessageRouter {
    /// Build the router, or return every problem of `[messages]`, each with its key path.
    pub fn try_new(config: &MessagesConfig) -> Result<Self, Vec<String>> {
        let mut problems = Vec::new();
        let mut prefixes = HashSet::new();
        for (i, prefix) in config.prefixes.iter().enumerate() {
            if prefix.is_empty() {
                problems.push(format!("messages.prefixes[{i}]: must not be empty"));
            }
            prefixes.insert(prefix.clone());
        }
        let mut topics = HashMap::new();
        for (i, spec) in config.topics.iter().enumerate() {
            match spec.rsplit_once('=') {
                Some((prefix, topic)) if !prefix.is_empty() && !topic.trim().is_empty() => {
                    if topics
                        .insert(prefix.to_owned(), topic.trim().to_owned())
                        .is_some()
                    {
                        problems.push(format!(
                            "messages.topics[{i}]: prefix {prefix:?} is given a topic twice"
                        ));
                    }
                }
                _ => problems.push(format!(
                    "messages.topics[{i}]: {spec:?} is not \"prefix=topic\" (a prefix and a topic, split at the last '=')"
                )),
            }
        }
        if config.topic.is_empty() {
            problems.push("messages.topic: must not be empty".into());
        }
        if config.max_bytes == 0 {
            problems.push("messages.max_bytes: must be greater than 0".into());
        }
        let rename = |problem: String| {
            problem
                .replacen("outbox.topic_regex", "messages.prefix_regex", 1)
                .replacen("outbox.topic", "messages.topic", 1)
        };
        let mut rule_problems = Vec::new();
        let exact_rule = TopicRule::new(
            crate::relay::router::config::DEFAULT_TOPIC_REGEX,
            &config.topic,
            &mut rule_problems,
        );
        let pattern = match &config.prefix_regex {
            None => None,
            Some(regex) => {
                let mut pattern_problems = Vec::new();
                let rule = TopicRule::new(regex, &config.topic, &mut pattern_problems);
                problems.extend(pattern_problems.into_iter().map(rename));
                let anchored = Regex::new(&format!(r"\A(?:{regex})\z")).ok();
                rule.zip(anchored).map(|(rule, anchored)| (anchored, rule))
            }
        };
        if exact_rule.is_none() && (config.prefix_regex.is_none() || !prefixes.is_empty()) {
            problems.extend(rule_problems.into_iter().map(|p| {
                format!(
                    "{} (for messages.prefixes the template may use only ${{routedByValue}}, the whole prefix)",
                    rename(p)
                )
            }));
        }
        if prefixes.is_empty() && topics.is_empty() && config.prefix_regex.is_none() {
            problems.push(
                "messages: no prefix is relayed; set messages.prefixes, messages.topics or messages.prefix_regex (or enabled = false)"
                    .into(),
            );
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let exact_rule = match exact_rule {
            Some(rule) => rule,
            // Only prefix_regex is used: the exact rule is never asked.
            None => match &pattern {
                Some((_, rule)) => rule.clone(),
                None => return Err(vec!["messages.topic: not a valid template".into()]),
            },
        };
        Ok(MessageRouter {
            prefixes,
            topics,
            exact_rule,
            pattern,
            envelope: config.envelope,
            key: config.key,
            non_transactional: config.non_transactional,
            max_bytes: config.max_bytes,
        })
    }

    pub fn non_transactional(&self) -> NonTransactional {
        self.non_transactional
    }

    /// Every fixed topic (from `messages.topics`), for checks against the dead-letter
    /// topic.
    pub fn fixed_topics(&self) -> impl Iterator<Item = &str> {
        self.topics.values().map(String::as_str)
    }

    /// The topic of `prefix`, `None` when it is not relayed.
    pub fn topic(&self, prefix: &str) -> Option<String> {
        if let Some(topic) = self.topics.get(prefix) {
            return Some(topic.clone());
        }
        if self.prefixes.contains(prefix) {
            return Some(self.exact_rule.topic(prefix));
        }
        match &self.pattern {
            Some((anchored, rule)) if anchored.is_match(prefix) => Some(rule.topic(prefix)),
            _ => None,
        }
    }

    /// The record of one message: `None` when its prefix is not relayed.
    pub fn route(
        &self,
        prefix: &str,
        content: &bytes::Bytes,
        context: MessageContext,
    ) -> Option<Result<OutboxEvent, MessageError>> {
        let topic = self.topic(prefix)?;
        let error = |reason: String, content: Option<Vec<u8>>| MessageError {
            prefix: prefix.to_owned(),
            lsn: context.lsn,
            reason,
            topic: topic.clone(),
            content,
        };
        if content.len() > self.max_bytes {
            return Some(Err(error(
                format!(
                    "the content is {} bytes, more than messages.max_bytes = {} (the dead letter leaves it out)",
                    content.len(),
                    self.max_bytes
                ),
                None,
            )));
        }
        let reading = match self.envelope {
            EnvelopeMode::Never => Reading::Plain,
            EnvelopeMode::Auto | EnvelopeMode::Always => envelope::read(content),
        };
        let (id, key, extra_headers, payload, format) = match reading {
            Reading::Malformed(reason) => {
                return Some(Err(error(reason, Some(content.to_vec()))));
            }
            Reading::Plain if self.envelope == EnvelopeMode::Always => {
                return Some(Err(error(
                    "the content is not an envelope (a JSON object with a \"payload\" member), and messages.envelope = \"always\"".into(),
                    Some(content.to_vec()),
                )));
            }
            Reading::Plain => (
                None,
                None,
                Vec::new(),
                Some(content.clone()),
                plain_format(content),
            ),
            Reading::Envelope(envelope) => (
                envelope.id,
                envelope.key,
                envelope.headers,
                envelope
                    .payload
                    .map(|text| content.slice_ref(text.as_bytes())),
                PayloadFormat::Json,
            ),
        };
        let id = id.unwrap_or_else(|| context.lsn.to_string());
        let key = key.unwrap_or_else(|| match self.key {
            KeySource::Id => Some(id.clone()),
            KeySource::Prefix => Some(prefix.to_owned()),
            KeySource::None => None,
        });
        let mut headers = Vec::with_capacity(1 + extra_headers.len());
        headers.push(Header {
            name: "id".into(),
            value: Some(id),
        });
        headers.extend(
            extra_headers
                .into_iter()
                .map(|(name, value)| Header { name, value }),
        );
        Some(Ok(OutboxEvent {
            topic,
            partition: None,
            key,
            headers,
            payload,
            payload_format: format,
            envelope: Vec::new(),
            tombstone: false,
            lsn: context.lsn,
            timestamp_ms: context.timestamp_ms,
            outbox: OutboxEvent::NOT_A_TABLE,
        }))
    }
}

/// Content that is not an envelope: JSON when it parses as JSON, text when it is UTF-8,
/// bytes otherwise (the stdout sink shows each as such; Kafka gets the bytes as they are).
fn plain_format(content: &[u8]) -> PayloadFormat {
    match std::str::from_utf8(content) {
        Err(_) => PayloadFormat::Binary,
        Ok(text) if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() => {
            PayloadFormat::Json
        }
        Ok(_) => PayloadFormat::Text,
    }
}

#[cfg(test)]
mod tests;
