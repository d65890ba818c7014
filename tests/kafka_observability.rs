//! Metrics and logs that stay true while Kafka fails, against a real PostgreSQL and a
//! real Apache Kafka broker killed mid-stream: the age of the oldest undelivered event
//! grows for as long as it waits (across the relay's reconnects and producer rebuilds,
//! never reading 0 meanwhile), the log says each cause a bounded number of times, and
//! "creating topic" is not repeated for topics that exist.

use outbox_relay_harness as support;

use std::collections::BTreeMap;

use outbox_relay::metrics::OLDEST_UNDELIVERED_SECONDS;
use support::kafka::{consume, read_all, KafkaBroker};
use support::outbox::{
    cluster_with_outbox, insert_events, kafka_config, metric, plain, start_streaming, with_metrics,
    WAIT,
};
use support::PgOptions;

const TOPIC: &str = "outbox.event.watched";
const DEAD_LETTER: &str = "watched.dead-letter";
/// How long the undelivered event must be seen waiting: several of the relay's
/// reconnects (every `stall_release_ms` plus backoff) fall into it.
const WAITED_SECONDS: u64 = 25;

/// The WARN and ERROR lines of `log`, counted by cause: their level, target and message,
/// without the timestamp, the structured fields, parenthesised details and numbers.
fn warnings_by_cause(log: &str) -> BTreeMap<String, usize> {
    let mut causes = BTreeMap::new();
    for line in log.lines() {
        let Some(at) = line.find(" WARN ").or_else(|| line.find(" ERROR ")) else {
            continue;
        };
        let rest = &line[at..];
        // Fields follow the message as ` key=value`; the cause is what comes before.
        let cut = [" error=", " reason=", " ("]
            .iter()
            .filter_map(|marker| rest.find(marker))
            .min()
            .unwrap_or(rest.len());
        let cause: String = rest[..cut]
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        *causes.entry(cause.trim().to_owned()).or_insert(0) += 1;
    }
    causes
}

#[test]
fn with_kafka_down_the_age_gauge_grows_and_the_log_stays_bounded() {
    let mut broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let config = kafka_config(&pg, &broker.bootstrap(), "", Some(DEAD_LETTER), &[])
        .replace("[sink]\n", "[relay]\nstall_release_ms = 3000\n[sink]\n");
    let (config, port) = with_metrics(&config);
    let relay = start_streaming(&config);
    let first = insert_events(&pg, "watched", 1);
    consume(&broker.bootstrap(), &[TOPIC], 1, WAIT);
    relay.wait_metric(port, OLDEST_UNDELIVERED_SECONDS, "0", WAIT, |age| age == 0);

    broker.kill9();
    let logged_before = relay.stderr().len();
    let waiting = insert_events(&pg, "watched", 1);
    // Sample the gauge until it shows the event waiting long enough; once it showed the
    // event waiting, it never reads 0 again while the broker is down.
    let mut samples = Vec::new();
    let reached = support::wait::poll_until(WAIT, || {
        assert_eq!(relay.exit_status(), None, "the relay waits for Kafka");
        let age = metric(port, OLDEST_UNDELIVERED_SECONDS)?;
        samples.push(age);
        (age >= WAITED_SECONDS).then_some(age)
    });
    assert!(
        reached.is_some(),
        "{OLDEST_UNDELIVERED_SECONDS} never reached {WAITED_SECONDS} with an event waiting; samples: {samples:?}"
    );
    let first_seen = samples.iter().position(|&age| age > 0).unwrap_or(0);
    assert!(
        samples[first_seen..].iter().all(|&age| age > 0),
        "read 0 with an event waiting: {samples:?}"
    );
    let during_outage = relay.stderr()[logged_before..].to_owned();

    broker.restart();
    let records = consume(&broker.bootstrap(), &[TOPIC], 2, WAIT);
    let ids: Vec<_> = records.iter().filter_map(|r| r.header("id")).collect();
    assert!(
        first.iter().chain(&waiting).all(|id| ids.contains(id)),
        "both events delivered: {ids:?}"
    );
    relay.wait_metric(
        port,
        OLDEST_UNDELIVERED_SECONDS,
        "0 once delivered",
        WAIT,
        |age| age == 0,
    );

    // At least WAITED_SECONDS of outage: each cause at most at its first occurrence and
    // then one summary every 15 s, plus the relay's own reconnect attempts (backoff).
    let causes = warnings_by_cause(&during_outage);
    let noisy: Vec<_> = causes.iter().filter(|(_, n)| **n > 6).collect();
    assert!(
        noisy.is_empty(),
        "causes logged more than 6 times in {WAITED_SECONDS}+ s: {noisy:#?}\nall: {causes:#?}"
    );
    let log = relay.stderr();
    assert!(
        !log.lines()
            .any(|line| line.contains(" INFO ") && line.contains("creating topic")),
        "no \"creating topic\" for topics that exist:\n{log}"
    );
    let created = log
        .lines()
        .filter(|line| line.contains("created topic") && line.contains(TOPIC))
        .count();
    assert_eq!(created, 1, "{TOPIC} was created once:\n{log}");
    assert!(read_all(&broker.bootstrap(), &[DEAD_LETTER]).is_empty());
    drop(relay);
}

/// A topic that exists is used as it is: the relay asks the broker's metadata, not the
/// controller (CreateTopics, which a loaded cluster answers slowly: 20 relays on one
/// broker timed out on it and restarted their sessions); a missing one is created with
/// the configured partitions.
#[test]
fn a_topic_that_exists_is_not_created_again_and_a_missing_one_is() {
    // The controller logs its answer to every CreateTopics request at INFO.
    let broker = KafkaBroker::start_logging("info");
    const EXISTING: &str = "outbox.event.existing";
    const MISSING: &str = "outbox.event.missing";
    support::create_topic(&broker.bootstrap(), EXISTING, 2);
    let pg = cluster_with_outbox(PgOptions::default());
    let config = kafka_config(&pg, &broker.bootstrap(), "", None, &[])
        .replace("[kafka]\n", "[kafka]\ntopic_partitions = 3\n");
    let relay = start_streaming(&config);
    let mut ids = insert_events(&pg, "existing", 3);
    ids.extend(insert_events(&pg, "missing", 3));
    let records = consume(&broker.bootstrap(), &[EXISTING, MISSING], ids.len(), WAIT);
    let got: Vec<String> = records.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(got.len(), ids.len());
    for id in &ids {
        assert!(got.contains(id), "event {id} missing from {got:?}");
    }
    let log = broker.log();
    let asked: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("CreateTopics") && line.contains(EXISTING))
        .collect();
    assert_eq!(
        asked.len(),
        1,
        "only the test's own CreateTopics for {EXISTING}, none from the relay: {asked:?}"
    );
    assert!(
        log.lines()
            .any(|line| line.contains("CreateTopics") && line.contains(MISSING)),
        "the missing topic was created through CreateTopics: {log}"
    );
    assert!(plain(&relay.stderr()).contains("created topic"));
}
