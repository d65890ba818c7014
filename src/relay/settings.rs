//! The relay's own sections of the configuration (`[relay]`, `[dead_letter]`) and
//! [`Settings`]: everything a run needs, checked and built once. The configuration
//! file is composed and validated by [`crate::config`], which produces these; the relay
//! knows nothing of the file.

use std::time::Duration;

use serde::Deserialize;

use crate::metrics::MetricsConfig;
use crate::pg::config::PostgresConfig;
use crate::pg::slot::SourceSpec;
use crate::pg::source::TablePattern;
use crate::pg::sql::QualifiedName;
use crate::pg::url::ConnectParams;
use crate::relay::ack::InFlightLimits;
use crate::relay::messages::MessageRouter;
use crate::relay::router::config::OutboxSettings;
use crate::sink::SinkSpec;

/// Events handed to the sink but not yet confirmed, before reading pauses. Bounds memory
/// whatever the transaction size; large enough to keep a Kafka producer's batches full.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 100_000;
/// Bytes of events (key + value + headers as handed to the sink, see
/// [`crate::event::OutboxEvent::record_bytes`]) in flight before reading pauses. 8 MiB:
/// an in-flight event is held about three times (the relay's copy kept for the
/// dead-letter topic, librdkafka's copy in its queue, and its batch being compressed),
/// plus what the allocator keeps of it once freed on librdkafka's threads. With 16 MiB,
/// the peak RSS through a broker outage with a backlog of 4 KB rows was 48.4–61.9 MiB in
/// eight runs (docs/benchmarks.md, (i)): at the 64 MB goal; with 8 MiB 38–42 MiB, at the
/// same throughput. Still two thousand typical (4 KB) events, more than a producer needs
/// to keep its batches full over a few milliseconds of broker round trip.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: u64 = 8 * 1024 * 1024;
/// How long a graceful shutdown waits for in-flight deliveries.
pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
/// A sink with events in flight and no confirmation for this long releases the
/// replication connection, so a dead broker cannot hold PostgreSQL's shutdown for long.
pub const DEFAULT_STALL_RELEASE_MS: u64 = 60_000;

/// `[relay]`: flow control and shutdown.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Bytes in flight at most (key + value + headers of each record) before reading
    /// pauses; a single larger event still goes, alone.
    #[serde(default = "default_max_in_flight_bytes")]
    pub max_in_flight_bytes: u64,
    #[serde(default = "default_shutdown_timeout_ms")]
    pub shutdown_timeout_ms: u64,
    /// With events in flight and no delivery confirmed for this long, let the
    /// replication connection go (and reconnect): PostgreSQL's shutdown waits for the
    /// acknowledgements a stalled sink cannot give.
    #[serde(default = "default_stall_release_ms")]
    pub stall_release_ms: u64,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            shutdown_timeout_ms: DEFAULT_SHUTDOWN_TIMEOUT_MS,
            stall_release_ms: DEFAULT_STALL_RELEASE_MS,
        }
    }
}

impl RelayConfig {
    /// Every problem of the section, each with its key path.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.stall_release_ms == 0 {
            problems.push("relay.stall_release_ms: must be greater than 0".into());
        }
        if self.max_in_flight == 0 {
            problems.push("relay.max_in_flight: must be greater than 0".into());
        }
        if self.max_in_flight_bytes == 0 {
            problems.push("relay.max_in_flight_bytes: must be greater than 0 (8388608, 8 MiB, is the default)".into());
        }
        problems
    }

    /// `max_in_flight` as the tracker counts.
    pub fn max_in_flight(&self) -> u64 {
        u64::try_from(self.max_in_flight).unwrap_or(u64::MAX)
    }

    /// Both in-flight bounds, as the tracker checks them.
    pub fn limits(&self) -> InFlightLimits {
        InFlightLimits {
            events: self.max_in_flight(),
            bytes: self.max_in_flight_bytes,
        }
    }
}

/// `[dead_letter]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// Topic for events that cannot be delivered as they are; they are acknowledged
    /// once the dead-letter record is delivered.
    pub topic: String,
}

impl DeadLetterConfig {
    /// Every problem of the section, each with its key path.
    pub fn problems(&self) -> Vec<String> {
        if self.topic.is_empty() {
            vec!["dead_letter.topic: must not be empty".into()]
        } else {
            Vec::new()
        }
    }
}

/// A checked configuration, with what it takes built once (the router, the connection
/// parameters, the table names).
#[derive(Debug, Clone)]
pub struct Settings {
    pub postgres: PostgresConfig,
    pub connect: ConnectParams,
    /// `[postgres] primary_url`: the relay decodes on the standby `connect` names and
    /// uses this primary for what a standby cannot do.
    pub primary: Option<ConnectParams>,
    /// The outbox tables, each with its router, in the configuration's order; empty for
    /// a messages-only relay (`[outbox] enabled = false`).
    pub outboxes: Vec<OutboxSettings>,
    /// Where the relay records its slot ([`crate::pg::state`]).
    pub state_table: QualifiedName,
    pub sink: SinkSpec,
    /// The dead-letter topic, when one is configured.
    pub dead_letter_topic: Option<String>,
    pub relay: RelayConfig,
    pub metrics: Option<MetricsConfig>,
    /// The table-less outbox's rules (`[messages]`), when enabled.
    pub messages: Option<MessageRouter>,
}

impl Settings {
    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_millis(self.relay.shutdown_timeout_ms)
    }

    /// Outbox tables are relayed (`false`: only messages, `[outbox] enabled = false`).
    pub fn outbox_enabled(&self) -> bool {
        !self.outboxes.is_empty()
    }

    /// The outbox tables' names, in the configuration's order.
    /// (Not the patterns': [`Settings::patterns`].)
    pub fn tables(&self) -> Vec<QualifiedName> {
        self.outboxes
            .iter()
            .filter(|o| o.pattern.is_none())
            .map(|o| o.table.clone())
            .collect()
    }

    /// The schema-per-tenant patterns (`tenant_*.outbox`), in the configuration's order.
    pub fn patterns(&self) -> Vec<TablePattern> {
        self.outboxes
            .iter()
            .filter_map(|o| o.pattern.clone())
            .collect()
    }

    /// The entry `table` belongs to (its own, or the first pattern matching it), by its
    /// place in the configuration.
    pub fn entry_of(&self, table: &QualifiedName) -> Option<usize> {
        self.outboxes
            .iter()
            .position(|o| o.pattern.is_none() && &o.table == table)
            .or_else(|| self.outboxes.iter().position(|o| o.covers(table)))
    }

    /// The outbox `table`'s settings, when it is one of this relay's.
    pub fn outbox(&self, table: &QualifiedName) -> Option<&OutboxSettings> {
        self.entry_of(table).map(|entry| &self.outboxes[entry])
    }

    /// Each entry as metrics and messages name it: its table, or its pattern.
    pub fn entry_names(&self) -> Vec<String> {
        self.outboxes.iter().map(|o| o.table.to_string()).collect()
    }

    /// The column of the outboxes' `partition` placement, for the sink's messages: the
    /// one column when every outbox with such a placement uses the same (else `None`,
    /// and the message speaks of the record's placement).
    pub fn partition_column(&self) -> Option<String> {
        let mut columns = self
            .outboxes
            .iter()
            .filter_map(|o| o.router.partition_column());
        let first = columns.next()?;
        columns.all(|c| c == first).then(|| first.to_owned())
    }

    /// What the PostgreSQL side streams from.
    pub fn source(&self) -> SourceSpec {
        SourceSpec {
            slot: self.postgres.slot.clone(),
            publication: self.postgres.publication.clone(),
            tables: self.tables(),
            patterns: self.patterns(),
            state_table: self.state_table.clone(),
            failover: self.postgres.failover_slot,
            messages: self.messages.is_some(),
            decode_on_standby: self.primary.is_some(),
        }
    }
}

fn default_max_in_flight() -> usize {
    DEFAULT_MAX_IN_FLIGHT
}
fn default_max_in_flight_bytes() -> u64 {
    DEFAULT_MAX_IN_FLIGHT_BYTES
}
fn default_stall_release_ms() -> u64 {
    DEFAULT_STALL_RELEASE_MS
}
fn default_shutdown_timeout_ms() -> u64 {
    DEFAULT_SHUTDOWN_TIMEOUT_MS
}
