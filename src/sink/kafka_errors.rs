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
//! Errors librdkafka raises outside any one record reach the client's error callback,
//! and librdkafka reconnects after them on its own. Of those, a refused login
//! (`_AUTHENTICATION`, `SASL_AUTHENTICATION_FAILED`, a mechanism the listener does not
//! offer) and a failed TLS handshake (`_SSL`: an untrusted or mismatching broker
//! certificate; a disconnect during the handshake is `_TRANSPORT`, retried) are
//! definite: with `message.timeout.ms=0` librdkafka would retry them for ever while
//! nothing is delivered, so the relay stops with the fix instead
//! ([`client_error_stop`]). Every other code there is librdkafka's to handle, or a
//! fatal producer error (it comes with its own code, e.g. `CLUSTER_AUTHORIZATION_FAILED`
//! for a refused producer id), which the sink finds through the client when the
//! pipeline polls it after the callback, and answers by rebuilding the producer (a new
//! attempt, [`fatal`]). Nothing is acknowledged past
//! the undelivered events, so a restart (by the operator, or a supervisor's restart
//! policy while a new API key reaches every broker) loses nothing.
//!
//! Sources: librdkafka's error codes (`rdkafka.h`, `rd_kafka_resp_err_t`) and Kafka's
//! protocol error list (`org.apache.kafka.common.protocol.Errors`), which say per code
//! whether it is retriable.

use std::fmt::Display;

use rdkafka::error::RDKafkaErrorCode;

use crate::sink::SinkError;

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

        // The TLS handshake failed for a reason of its own (librdkafka reports a
        // disconnect during the handshake as `_TRANSPORT` instead): the broker's
        // certificate is not signed by a trusted CA or does not name the host.
        E::SSL => ErrorAction::Stop,

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

/// A transient failure of the Kafka sink: the attempt ends, a new producer resends
/// everything not yet acknowledged.
pub fn retry(reason: impl Display) -> SinkError {
    SinkError::Retry(format!(
        "Kafka delivery failed: {reason}; rebuilding the producer and resending everything not yet acknowledged"
    ))
}

/// The producer failed for good (a fatal idempotent-producer error): a new attempt
/// builds a new one.
pub fn fatal(reason: impl Display) -> SinkError {
    SinkError::Retry(format!("Kafka producer failed: {reason}"))
}

/// A Kafka client could not be created (its configuration): definite.
pub fn setup(reason: impl Display) -> SinkError {
    SinkError::Setup(format!("cannot create the Kafka producer: {reason}"))
}

/// The reason to stop for an error of the client's error callback (not tied to a
/// record): a refused login or TLS handshake. `None` for anything else, which
/// librdkafka's own reconnecting or the sink's fatal-error check answers. `reason` is
/// librdkafka's text (it names the broker and what failed), secret detail withheld
/// ([`crate::sink::kafka_secrets::withhold_secret_detail`]).
pub fn client_error_stop(code: RDKafkaErrorCode, reason: &str) -> Option<String> {
    use RDKafkaErrorCode as E;
    let refused_connection = matches!(
        code,
        E::Authentication
            | E::SaslAuthenticationFailed
            | E::UnsupportedSASLMechanism
            | E::IllegalSASLState
            | E::SSL
    );
    debug_assert!(!refused_connection || action(code) == ErrorAction::Stop);
    refused_connection.then(|| format!("cannot use Kafka: {reason} ({code}); {}", stop_hint(code)))
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
        E::SaslAuthenticationFailed | E::Authentication => {
            "the brokers refused the relay's login: check security.protocol, sasl.mechanism, sasl.username and sasl.password in [kafka.properties] (a new user or API key can take a minute to reach every broker: start the relay again then)"
        }
        E::UnsupportedSASLMechanism | E::IllegalSASLState => {
            "the brokers do not offer this sasl.mechanism on this listener: check sasl.mechanism and security.protocol in [kafka.properties] against the listener behind bootstrap.servers"
        }
        E::SSL => {
            "the TLS connection to the brokers failed: set ssl.ca.location in [kafka.properties] to the CA that signed the brokers' certificates (unset, the system's CA store is used, which suits MSK and Confluent Cloud), and check that the brokers' certificates name the hosts in [kafka] brokers"
        }
        E::SecurityDisabled
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
            E::SSL,
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
    fn failed_logins_and_tls_handshakes_stop_the_relay_naming_the_fix() {
        let login = client_error_stop(
            E::Authentication,
            "sasl_ssl://127.0.0.1:9/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256",
        )
        .expect("a refused login stops the relay");
        assert!(login.contains("SASL authentication error"), "{login}");
        assert!(login.contains("sasl.password"), "{login}");
        let tls = client_error_stop(
            E::SSL,
            "ssl://127.0.0.1:9/bootstrap: SSL handshake failed: certificate verify failed",
        )
        .expect("an untrusted broker certificate stops the relay");
        assert!(tls.contains("certificate verify failed"), "{tls}");
        assert!(tls.contains("ssl.ca.location"), "{tls}");
        assert!(client_error_stop(E::SaslAuthenticationFailed, "x").is_some());
        assert!(client_error_stop(E::UnsupportedSASLMechanism, "x")
            .is_some_and(|stop| stop.contains("sasl.mechanism")));
        // A broker that is down, a disconnect during the TLS handshake, a name that does
        // not resolve: librdkafka reconnects, the relay waits.
        // A fatal producer error arrives with its own code (a refused producer id:
        // CLUSTER_AUTHORIZATION_FAILED); the pipeline rebuilds the producer for it.
        for code in [
            E::BrokerTransportFailure,
            E::AllBrokersDown,
            E::Resolve,
            E::Fatal,
            E::ClusterAuthorizationFailed,
            E::Unknown,
        ] {
            assert_eq!(client_error_stop(code, "x"), None, "{code:?}");
        }
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
