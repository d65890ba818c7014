//! What the relay does about each librdkafka error: pure, one table.
//!
//! ```text
//! RDKafkaErrorCode ──action()──▶ Retry       rebuild the producer, resend from the
//!                                            slot's acknowledged position (in order)
//!                               DeadLetter   permanent for this one record only: the
//!                                            dead-letter topic takes it (or the relay
//!                                            stops when there is none)
//!                               Stop         the operator must act (ACLs, settings):
//!                                            stop without acknowledging anything
//! ```
//!
//! The default is `Retry`: an error the table does not know may be transient, and a
//! retry never loses an event (it is sent again, at worst as a duplicate) while a dead
//! letter takes the event out of its topic for good. Only errors that say the *record*
//! can never be accepted (its size, its bytes, its topic's name) are dead letters; an
//! error about the cluster, a partition or a leader is not the record's fault.
//!
//! Sources: librdkafka's error codes (`rdkafka.h`, `rd_kafka_resp_err_t`) and Kafka's
//! protocol error list (`org.apache.kafka.common.protocol.Errors`), which say per code
//! whether it is retriable.

use rdkafka::error::RDKafkaErrorCode;

/// What to do about a failed delivery, a refused send or a refused admin request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorAction {
    /// Transient or not the record's fault: rebuild the producer and resend everything
    /// not yet acknowledged, in order.
    Retry,
    /// Permanent for this one record: dead-letter it (with the reason).
    DeadLetter,
    /// Needs the operator (authorization, configuration): stop, acknowledge nothing.
    Stop,
}

/// The action for one librdkafka error code.
pub fn action(code: RDKafkaErrorCode) -> ErrorAction {
    use RDKafkaErrorCode as E;
    match code {
        // The record itself: too large for the broker or the topic, a batch it alone
        // makes too large, bytes the broker cannot read, a record the broker's
        // validation refuses (e.g. no key on a compacted topic), a timestamp outside
        // the topic's accepted range, a topic name Kafka refuses.
        E::MessageSizeTooLarge
        | E::MessageBatchTooLarge
        | E::InvalidMessage
        | E::InvalidMessageSize
        | E::InvalidRecord
        | E::InvalidTimestamp
        | E::InvalidTopic => ErrorAction::DeadLetter,

        // Authorization and authentication: grant the ACL or fix the credentials.
        E::TopicAuthorizationFailed
        | E::ClusterAuthorizationFailed
        | E::GroupAuthorizationFailed
        | E::TransactionalIdAuthorizationFailed
        | E::DelegationTokenAuthorizationFailed
        | E::SaslAuthenticationFailed
        | E::UnsupportedSASLMechanism
        | E::IllegalSASLState
        | E::Authentication
        | E::SecurityDisabled
        | E::PrincipalDeserializationFailure => ErrorAction::Stop,

        // Configuration the broker or librdkafka refuses, whatever the record.
        E::InvalidRequiredAcks
        | E::InvalidConfig
        | E::InvalidPartitions
        | E::InvalidReplicaAssignment
        | E::PolicyViolation
        | E::UnsupportedVersion
        | E::UnsupportedForMessageFormat
        | E::UnsupportedCompressionType
        | E::UnsupportedFeature
        | E::InvalidArgument
        | E::NotImplemented
        | E::InvalidRequest
        | E::InvalidTransactionTimeout => ErrorAction::Stop,

        // Not always the configuration: a KRaft cluster answers a topic creation with
        // INVALID_REPLICATION_FACTOR too while its brokers are fenced (right after an
        // outage, "only 0 broker(s) are registered"). Retried; the message names the
        // setting in case it persists.
        E::InvalidReplicationFactor => ErrorAction::Retry,

        // Everything else, among them: broker down or unreachable, leader changes,
        // `NOT_CONTROLLER`, `REQUEST_TIMED_OUT`, not enough replicas, storage errors,
        // `_UNKNOWN_TOPIC` / `_UNKNOWN_PARTITION` / `UNKNOWN_TOPIC_OR_PARTITION` (a topic
        // being created or recreated, partitions being added), `_MSG_TIMED_OUT`,
        // idempotence errors (out-of-order sequence, unknown producer id, fenced epoch),
        // `_FATAL`, purged messages, throttling.
        _ => ErrorAction::Retry,
    }
}

/// Whether the record was refused for its size: the one failure after which a
/// dead-letter record may go without its value.
pub fn is_size_error(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge
    )
}

/// What to tell the operator for an error the relay stops on.
pub fn stop_hint(code: RDKafkaErrorCode) -> &'static str {
    use RDKafkaErrorCode as E;
    match code {
        E::TopicAuthorizationFailed => {
            "grant the relay's principal WRITE and DESCRIBE on the topic (and CREATE on the cluster or topic when create_topics = true)"
        }
        E::ClusterAuthorizationFailed | E::TransactionalIdAuthorizationFailed => {
            "grant the relay's principal IDEMPOTENT_WRITE on the cluster (the idempotent producer needs it)"
        }
        E::SaslAuthenticationFailed
        | E::UnsupportedSASLMechanism
        | E::IllegalSASLState
        | E::Authentication
        | E::SecurityDisabled
        | E::GroupAuthorizationFailed
        | E::DelegationTokenAuthorizationFailed
        | E::PrincipalDeserializationFailure => {
            "check the security settings (sasl.*, ssl.*, security.protocol) in [kafka.properties] and the broker's ACLs"
        }
        E::InvalidPartitions | E::InvalidReplicationFactor | E::InvalidReplicaAssignment => {
            "fix [kafka] topic_partitions / topic_replication_factor, or create the topic yourself"
        }
        E::PolicyViolation => {
            "the broker's create-topic or produce policy refused it: create the topic yourself or change the policy"
        }
        _ => "check [kafka.properties] and the broker's version and settings",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as E;

    #[test]
    fn only_errors_of_the_record_itself_are_dead_letters() {
        for code in [
            E::MessageSizeTooLarge,
            E::MessageBatchTooLarge,
            E::InvalidMessage,
            E::InvalidMessageSize,
            E::InvalidRecord,
            E::InvalidTimestamp,
            E::InvalidTopic,
        ] {
            assert_eq!(action(code), ErrorAction::DeadLetter, "{code:?}");
        }
    }

    #[test]
    fn transient_and_cluster_errors_are_retried() {
        // The ones issue 8 found dead-lettered, and their neighbours.
        for code in [
            E::MessageTimedOut,
            E::UnknownTopic,
            E::UnknownPartition,
            E::UnknownTopicOrPartition,
            E::NotController,
            E::RequestTimedOut,
            E::NotLeaderForPartition,
            E::LeaderNotAvailable,
            E::NotEnoughReplicas,
            E::NotEnoughReplicasAfterAppend,
            E::KafkaStorageError,
            E::BrokerTransportFailure,
            E::AllBrokersDown,
            E::OperationTimedOut,
            E::NetworkException,
            E::OutOfOrderSequenceNumber,
            E::UnknownProducerId,
            E::InvalidProducerEpoch,
            E::Fatal,
            E::PurgeQueue,
            E::PurgeInflight,
            E::ThrottlingQuotaExceeded,
            E::QueueFull,
            E::InvalidReplicationFactor,
            E::Unknown,
        ] {
            assert_eq!(action(code), ErrorAction::Retry, "{code:?}");
        }
    }

    #[test]
    fn authorization_and_configuration_stop_the_relay() {
        for code in [
            E::TopicAuthorizationFailed,
            E::ClusterAuthorizationFailed,
            E::TransactionalIdAuthorizationFailed,
            E::SaslAuthenticationFailed,
            E::Authentication,
            E::InvalidRequiredAcks,
            E::InvalidConfig,
            E::InvalidPartitions,
            E::PolicyViolation,
            E::UnsupportedForMessageFormat,
            E::UnsupportedCompressionType,
            E::InvalidArgument,
        ] {
            assert_eq!(action(code), ErrorAction::Stop, "{code:?}");
        }
        assert!(stop_hint(E::TopicAuthorizationFailed).contains("WRITE"));
        assert!(stop_hint(E::ClusterAuthorizationFailed).contains("IDEMPOTENT_WRITE"));
        assert!(stop_hint(E::InvalidReplicationFactor).contains("topic_replication_factor"));
    }

    #[test]
    fn only_size_errors_may_drop_a_dead_letter_value() {
        assert!(is_size_error(E::MessageSizeTooLarge));
        assert!(is_size_error(E::MessageBatchTooLarge));
        for code in [
            E::InvalidRecord,
            E::InvalidTopic,
            E::InvalidMessage,
            E::NotController,
        ] {
            assert!(!is_size_error(code), "{code:?}");
        }
    }
}
