//! The relay binary against an Apache Kafka broker that wants TLS, and SASL over TLS
//! (`KafkaBroker::shared_secured`: a CA and broker certificate made for the test, SCRAM
//! users written at format time). Events arrive through the secured listeners; a wrong
//! password or an untrusted broker certificate stops the relay with the fix, never
//! repeating the password, and acknowledges nothing, so a corrected relay delivers
//! everything.
//!
//! Records are read back through the broker's plain listener: what arrived does not
//! depend on the client under test.

use outbox_relay_harness as support;

use std::path::Path;

use support::kafka::{consume, read_all, KafkaBroker, SASL_PASSWORD, SASL_USER};
use support::outbox::{
    cluster_with_outbox, insert_events, kafka_config, plain, start_streaming, SLOT, WAIT,
};
use support::{PgCluster, PgOptions, RelayProcess};

/// Properties of a relay on the SSL listener, trusting `ca`.
fn ssl(ca: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SSL".to_owned()),
        ("ssl.ca.location", ca.display().to_string()),
    ]
}

/// Properties of a relay on the SASL_SSL listener as [`SASL_USER`] with `password`.
fn sasl_ssl(broker: &KafkaBroker, mechanism: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("security.protocol", "SASL_SSL".to_owned()),
        ("sasl.mechanism", mechanism.to_owned()),
        ("sasl.username", SASL_USER.to_owned()),
        ("sasl.password", password.to_owned()),
        (
            "ssl.ca.location",
            broker.tls().ca_pem().display().to_string(),
        ),
    ]
}

fn config(pg: &PgCluster, bootstrap: &str, properties: &[(&'static str, String)]) -> String {
    let properties: Vec<(&str, &str)> = properties
        .iter()
        .map(|(key, value)| (*key, value.as_str()))
        .collect();
    kafka_config(pg, bootstrap, "", None, &properties)
}

/// The event ids (header `id`) of `topic`'s records, in offset order, once it holds
/// `expected` of them.
fn delivered_ids(broker: &KafkaBroker, topic: &str, expected: usize) -> Vec<String> {
    consume(&broker.bootstrap(), &[topic], expected, WAIT)
        .iter()
        .map(|record| {
            record
                .header("id")
                .expect("every record carries its event id")
        })
        .collect()
}

#[test]
fn ssl_with_the_brokers_ca_delivers_every_event() {
    let broker = KafkaBroker::shared_secured();
    let pg = cluster_with_outbox(PgOptions::default());
    let relay = start_streaming(&config(
        &pg,
        &broker.ssl_bootstrap(),
        &ssl(&broker.tls().ca_pem()),
    ));
    let ids = insert_events(&pg, "order", 20);
    assert_eq!(delivered_ids(&broker, "outbox.event.order", 20), ids);
    assert_eq!(relay.exit_status(), None, "{}", relay.stderr());
}

#[test]
fn sasl_ssl_with_scram_and_plain_delivers_every_event() {
    let broker = KafkaBroker::shared_secured();
    let pg = cluster_with_outbox(PgOptions::default());
    // One relay after the other on the same slot, one mechanism each.
    for (mechanism, kind) in [
        ("SCRAM-SHA-256", "scram256"),
        ("SCRAM-SHA-512", "scram512"),
        ("PLAIN", "plain"),
    ] {
        let relay = start_streaming(&config(
            &pg,
            &broker.sasl_ssl_bootstrap(),
            &sasl_ssl(&broker, mechanism, SASL_PASSWORD),
        ));
        let ids = insert_events(&pg, kind, 10);
        let topic = format!("outbox.event.{kind}");
        assert_eq!(delivered_ids(&broker, &topic, 10), ids, "{mechanism}");
        assert_eq!(relay.exit_status(), None, "{mechanism}: {}", relay.stderr());
    }
}

/// A relay with `good` properties creates the slot and delivers one event; then, with
/// no relay running, three more events are written; a relay with `bad` properties must
/// exit with an error containing every `expected` text and no `forbidden` one, without
/// acknowledging or sending any of the three; a relay with `good` properties again
/// delivers them. Returns the refused relay's stderr.
fn refused_relay_acknowledges_nothing(
    pg: &PgCluster,
    broker: &KafkaBroker,
    (good_bootstrap, good): (&str, &[(&'static str, String)]),
    (bad_bootstrap, bad): (&str, &[(&'static str, String)]),
    expected: &[&str],
    forbidden: &[&str],
) -> String {
    let topic = "outbox.event.order";
    let relay = start_streaming(&config(pg, good_bootstrap, good));
    let first = insert_events(pg, "order", 1);
    assert_eq!(delivered_ids(broker, topic, 1), first);
    let delivered_to = pg.current_wal_lsn();
    support::wait_until("the first event is acknowledged", WAIT, || {
        pg.slot_confirmed_flush_lsn(SLOT).unwrap_or(0) >= delivered_to
    });
    drop(relay);

    let mut pending = insert_events(pg, "order", 1);
    let after_first_pending = pg.current_wal_lsn();
    pending.extend(insert_events(pg, "order", 2));

    let refused = RelayProcess::start(&config(pg, bad_bootstrap, bad));
    let status = refused.wait_exit(WAIT);
    let stderr = plain(&refused.stderr());
    assert!(!status.success(), "the relay stops ({status}): {stderr}");
    for text in expected {
        assert!(stderr.contains(text), "says {text:?}: {stderr}");
    }
    for text in forbidden {
        assert!(!stderr.contains(text), "never says {text:?}: {stderr}");
    }
    let confirmed = pg.slot_confirmed_flush_lsn(SLOT).expect("the slot exists");
    assert!(
        confirmed < after_first_pending,
        "nothing written after the last delivery is acknowledged ({confirmed:X} >= \
         {after_first_pending:X})"
    );
    let records = read_all(&broker.bootstrap(), &[topic]);
    assert_eq!(records.len(), 1, "nothing more reached Kafka: {records:?}");

    // Not acknowledged means not lost: the corrected relay delivers the three.
    let relay = start_streaming(&config(pg, good_bootstrap, good));
    let ids = delivered_ids(broker, topic, 4);
    assert_eq!(ids[1..], pending[..], "the pending events, in order");
    drop(relay);
    let said = stderr
        .lines()
        .rfind(|line| line.contains("cannot use Kafka"))
        .unwrap_or("");
    support::outbox::report(&format!("the refused relay's last word: {said}"));
    stderr
}

#[test]
fn a_wrong_password_stops_the_relay_naming_authentication_not_the_password() {
    let broker = KafkaBroker::shared_secured();
    let pg = cluster_with_outbox(PgOptions::default());
    let wrong = "Wr0ng-Passw0rd-Kq4";
    let bootstrap = broker.sasl_ssl_bootstrap();
    let stderr = refused_relay_acknowledges_nothing(
        &pg,
        &broker,
        (
            &bootstrap,
            &sasl_ssl(&broker, "SCRAM-SHA-256", SASL_PASSWORD),
        ),
        (&bootstrap, &sasl_ssl(&broker, "SCRAM-SHA-256", wrong)),
        &["authentication", "sasl.password"],
        &[wrong, SASL_PASSWORD],
    );
    assert!(
        stderr.contains("invalid credentials"),
        "says why the login was refused: {stderr}"
    );
}

#[test]
fn an_untrusted_broker_certificate_stops_the_relay_naming_verification() {
    let broker = KafkaBroker::shared_secured();
    let pg = cluster_with_outbox(PgOptions::default());
    let bootstrap = broker.ssl_bootstrap();
    refused_relay_acknowledges_nothing(
        &pg,
        &broker,
        (&bootstrap, &ssl(&broker.tls().ca_pem())),
        (&bootstrap, &ssl(&broker.tls().untrusted_ca_pem())),
        &["certificate verify failed", "ssl.ca.location"],
        &[],
    );
}
