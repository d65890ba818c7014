//! A read-only look at the Kafka cluster for `outbox-relay check`: one metadata request
//! through an admin client built exactly as the sink builds its own
//! ([`admin_config`]: the brokers and every `[kafka.properties]` entry, so security
//! settings are exercised too). Nothing is created or changed.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use crate::sink::kafka_config::{admin_config, KafkaConfig};

/// What the cluster's metadata says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// `host:port` of each broker the cluster names.
    pub brokers: Vec<String>,
    /// Every topic the client may see, with its partition count, or the error the
    /// broker gave for it (e.g. not authorized).
    pub topics: BTreeMap<String, Result<usize, String>>,
}

/// Why the cluster could not be asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The client could not even be created (a property librdkafka refuses).
    #[error("cannot create a Kafka client from [kafka] and [kafka.properties]: {0}")]
    Client(String),
    #[error("no answer from the brokers at {brokers} within {secs} s: {reason}")]
    Unreachable {
        brokers: String,
        secs: u64,
        reason: String,
    },
}

/// Ask the cluster for its brokers and topics, waiting at most `timeout`.
pub async fn cluster_facts(
    config: &KafkaConfig,
    timeout: Duration,
) -> Result<ClusterFacts, ProbeError> {
    let admin: AdminClient<DefaultClientContext> =
        admin_config(&config.brokers, &config.properties)
            .create()
            .map_err(|e| ProbeError::Client(config.client_error(&e)))?;
    let metadata = tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, timeout))
        .await
        .map_err(|e| ProbeError::Unreachable {
            brokers: config.brokers.clone(),
            secs: timeout.as_secs(),
            reason: format!("the metadata request did not finish: {e}"),
        })?
        .map_err(|e| ProbeError::Unreachable {
            brokers: config.brokers.clone(),
            secs: timeout.as_secs(),
            reason: e.to_string(),
        })?;
    Ok(ClusterFacts {
        brokers: metadata
            .brokers()
            .iter()
            .map(|b| format!("{}:{}", b.host(), b.port()))
            .collect(),
        topics: metadata
            .topics()
            .iter()
            .map(|topic| {
                let state = match topic.error() {
                    Some(code) => Err(RDKafkaErrorCode::from(code).to_string()),
                    None => Ok(topic.partitions().len()),
                };
                (topic.name().to_owned(), state)
            })
            .collect(),
    })
}
