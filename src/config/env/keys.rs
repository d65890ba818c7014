//! The table of every configuration key an environment variable may set, by section,
//! with the kind that says how its value is read ([`Kind`]). Data only: a key added to
//! a section's struct gets its line here, and a test in `config.rs` compares the two.
//! Apart from the overrides' logic in `env.rs` because it grows with every section and
//! changes for other reasons.

/// How a key's value is read from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    Int,
    Bool,
    /// A list of strings.
    List,
    /// A table of librdkafka properties: one more path part, the property name.
    Properties,
}

/// Every key of every section, with its kind. `the_environment_key_table_matches_the_structs`
/// (a test in `config.rs`) compares it with what the sections' serde structs accept: a
/// key added to a struct must be added here.
pub const KEYS: &[(&str, &[(&str, Kind)])] = &[
    (
        "postgres",
        &[
            ("url", Kind::Str),
            ("password", Kind::Str),
            ("password_file", Kind::Str),
            ("slot", Kind::Str),
            ("publication", Kind::Str),
            ("status_interval_ms", Kind::Int),
            ("receive_timeout_ms", Kind::Int),
            ("takeover_silence_ms", Kind::Int),
            ("state_table", Kind::Str),
            ("failover_slot", Kind::Bool),
            ("primary_url", Kind::Str),
        ],
    ),
    (
        "outbox",
        &[
            ("enabled", Kind::Bool),
            ("table", Kind::Str),
            ("id_column", Kind::Str),
            ("key_column", Kind::Str),
            ("route_by_column", Kind::Str),
            ("type_column", Kind::Str),
            ("payload_column", Kind::Str),
            ("timestamp_column", Kind::Str),
            ("topic", Kind::Str),
            ("topic_regex", Kind::Str),
            ("additional", Kind::List),
            ("tombstone_on_empty_payload", Kind::Bool),
        ],
    ),
    // What the [[outbox]] entries share (crate::config::outboxes): [outbox]'s keys but
    // table and enabled.
    (
        "outbox_defaults",
        &[
            ("id_column", Kind::Str),
            ("key_column", Kind::Str),
            ("route_by_column", Kind::Str),
            ("type_column", Kind::Str),
            ("payload_column", Kind::Str),
            ("timestamp_column", Kind::Str),
            ("topic", Kind::Str),
            ("topic_regex", Kind::Str),
            ("additional", Kind::List),
            ("tombstone_on_empty_payload", Kind::Bool),
        ],
    ),
    ("sink", &[("type", Kind::Str)]),
    (
        "kafka",
        &[
            ("brokers", Kind::Str),
            ("create_topics", Kind::Bool),
            ("topic_partitions", Kind::Int),
            ("topic_replication_factor", Kind::Int),
            ("properties", Kind::Properties),
            ("property_files", Kind::Properties),
            ("exactly_once", Kind::Bool),
            ("transactional_id", Kind::Str),
            ("offsets_topic", Kind::Str),
            ("transaction_ms", Kind::Int),
            ("transaction_max_events", Kind::Int),
            ("transaction_max_bytes", Kind::Int),
        ],
    ),
    ("dead_letter", &[("topic", Kind::Str)]),
    (
        "relay",
        &[
            ("max_in_flight", Kind::Int),
            ("max_in_flight_bytes", Kind::Int),
            ("shutdown_timeout_ms", Kind::Int),
            ("stall_release_ms", Kind::Int),
        ],
    ),
    ("metrics", &[("listen", Kind::Str)]),
    (
        "messages",
        &[
            ("enabled", Kind::Bool),
            ("prefixes", Kind::List),
            ("topics", Kind::List),
            ("prefix_regex", Kind::Str),
            ("topic", Kind::Str),
            ("envelope", Kind::Str),
            ("key", Kind::Str),
            ("non_transactional", Kind::Str),
            ("max_bytes", Kind::Int),
        ],
    ),
];
