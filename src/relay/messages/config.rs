//! The table-less outbox's section of the configuration, `[messages]`: which
//! `pg_logical_emit_message` prefixes are relayed, to which topics, how their content is
//! read, and what happens to non-transactional messages. [`MessagesConfig::build`] checks
//! the section and builds the [`MessageRouter`] once.

use serde::Deserialize;

use super::MessageRouter;

/// The topic template when none is given: Debezium's outbox default, with the prefix
/// as the routed value (`orders` → `outbox.event.orders`).
pub const DEFAULT_MESSAGES_TOPIC: &str = "outbox.event.${routedByValue}";
/// Largest message content relayed (1 MiB, Kafka's default `message.max.bytes` is about
/// this): a larger one goes to the dead-letter topic (without its content) instead of
/// being refused by the broker after the relay held it in memory.
pub const DEFAULT_MAX_BYTES: usize = 1_048_576;

/// How the content of a message is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvelopeMode {
    /// A JSON object with a `payload` member is an envelope; anything else is the
    /// record value as it is.
    #[default]
    Auto,
    /// Every message must be an envelope; anything else is a dead letter.
    Always,
    /// The content is the record value as it is, never read as an envelope.
    Never,
}

/// The record key when the envelope gives none (or there is no envelope).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeySource {
    /// The event id (the envelope's `id`, else derived from the message's LSN).
    #[default]
    Id,
    /// The message's prefix.
    Prefix,
    /// No key: the producer's partitioner spreads the records.
    None,
}

/// What happens to a message written with `pg_logical_emit_message(false, …)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NonTransactional {
    /// Not relayed: logged as an error and counted
    /// (`outbox_relay_messages_refused_total`); the stream goes on.
    #[default]
    Refuse,
    /// Relayed on its own, acknowledged once delivered. Not atomic with any business
    /// data: it is delivered even if the writer's transaction rolls back.
    Deliver,
}

/// `[messages]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessagesConfig {
    /// Ask PostgreSQL for logical decoding messages (the section's presence means yes).
    #[serde(default = "enabled_by_default")]
    pub enabled: bool,
    /// Exact prefixes relayed to the `topic` template (`${routedByValue}` = the prefix).
    #[serde(default)]
    pub prefixes: Vec<String>,
    /// Exact prefixes with a topic of their own: `"prefix=topic"` (split at the last
    /// `=`, which a Kafka topic name cannot hold).
    #[serde(default)]
    pub topics: Vec<String>,
    /// Prefixes matching this regular expression (the whole prefix) are relayed too; its
    /// groups fill the `topic` template (`routedByValue` when it has such a named group,
    /// else the whole prefix).
    #[serde(default)]
    pub prefix_regex: Option<String>,
    /// Topic template, as `[outbox] topic`.
    #[serde(default = "default_topic")]
    pub topic: String,
    #[serde(default)]
    pub envelope: EnvelopeMode,
    #[serde(default)]
    pub key: KeySource,
    #[serde(default)]
    pub non_transactional: NonTransactional,
    /// Largest content relayed, in bytes.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: usize,
}

impl Default for MessagesConfig {
    fn default() -> Self {
        MessagesConfig {
            enabled: true,
            prefixes: Vec::new(),
            topics: Vec::new(),
            prefix_regex: None,
            topic: default_topic(),
            envelope: EnvelopeMode::default(),
            key: KeySource::default(),
            non_transactional: NonTransactional::default(),
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

impl MessagesConfig {
    /// Check the section and build its router (`None` when disabled); every problem,
    /// each with its key path.
    pub fn build(&self) -> Result<Option<MessageRouter>, Vec<String>> {
        if !self.enabled {
            return Ok(None);
        }
        MessageRouter::try_new(self).map(Some)
    }
}

fn enabled_by_default() -> bool {
    true
}
fn default_topic() -> String {
    DEFAULT_MESSAGES_TOPIC.into()
}
fn default_max_bytes() -> usize {
    DEFAULT_MAX_BYTES
}
