//! The byte bound on what is in flight (`[relay] max_in_flight_bytes`), against a real
//! PostgreSQL and a real Apache Kafka broker: with the broker stopped (SIGSTOP) and a
//! backlog far larger than the bound, the relay's in-flight bytes stay within the bound
//! plus one event while status updates go on, and every event id arrives after SIGCONT.

use outbox_relay_harness as support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outbox_relay::metrics::{IN_FLIGHT, IN_FLIGHT_BYTES, LAST_STATUS_UNIX_SECONDS};
use support::kafka::{consume, KafkaBroker};
use support::outbox::{
    cluster_with_outbox, kafka_config, metric, start_streaming, with_metrics, WAIT,
};
use support::PgOptions;

/// The byte bound under test: 64 events of the 4 KB payloads below.
const BOUND: u64 = 256 * 1024;
/// Rows in the backlog: 8 MB of payload, 30 times the bound (and far below the event
/// bound, 100,000, which therefore is not what holds reading back).
const ROWS: i64 = 2_000;
/// One event's record as the relay counts it: a ~4,030-byte payload (jsonb's text form
/// of the object below), a 36-byte key and the 38-byte `id` header; rounded up.
const ONE_EVENT: u64 = 4_200;

#[test]
fn the_in_flight_bytes_stay_within_the_byte_bound_while_the_broker_is_stopped() {
    let broker = KafkaBroker::start();
    let pg = cluster_with_outbox(PgOptions::default());
    let (config, port) = with_metrics(&format!(
        "{}[relay]\nmax_in_flight_bytes = {BOUND}\n",
        kafka_config(&pg, &broker.bootstrap(), "", None, &[])
    ));
    let relay = start_streaming(&config);
    let mut client = pg.client_db("app");
    let insert = |client: &mut postgres::Client, first: i64, last: i64| -> Vec<String> {
        client
            .query(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                 SELECT 'mem', 'a-' || g, 'T', jsonb_build_object('n', g, 'pad', repeat('x', 4000))
                 FROM generate_series($1::bigint, $2::bigint) g ORDER BY g RETURNING id::text",
                &[&first, &last],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    };
    // Warm up: the topic exists and the producer is connected.
    let mut ids = insert(&mut client, 0, 0);
    consume(&broker.bootstrap(), &["outbox.event.mem"], 1, WAIT);

    broker.pause();
    ids.extend(insert(&mut client, 1, ROWS));
    // The relay reads until the bound is reached...
    relay.wait_metric(
        port,
        IN_FLIGHT_BYTES,
        "the in-flight bytes to reach the byte bound",
        WAIT,
        |bytes| bytes + ONE_EVENT > BOUND,
    );
    // ... and no further, while status updates keep flowing (watched over some status
    // intervals, 200 ms each; the broker answers nothing meanwhile).
    let status_before = metric(port, LAST_STATUS_UNIX_SECONDS).unwrap_or(0);
    let watch_until = Instant::now() + Duration::from_secs(5);
    let mut peak = 0;
    while Instant::now() < watch_until {
        let bytes = metric(port, IN_FLIGHT_BYTES).unwrap_or(0);
        peak = peak.max(bytes);
        assert!(
            bytes < BOUND + ONE_EVENT,
            "{bytes} bytes in flight: more than the bound ({BOUND}) plus one event ({ONE_EVENT})"
        );
        let events = metric(port, IN_FLIGHT).unwrap_or(0);
        assert!(
            events <= BOUND.div_ceil(4_000) + 1,
            "{events} events in flight: reading did not pause at the byte bound"
        );
        assert_eq!(
            relay.exit_status(),
            None,
            "the relay waits, it does not die"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    relay.wait_metric(
        port,
        LAST_STATUS_UNIX_SECONDS,
        "a status update while reading is paused",
        WAIT,
        |at| at > status_before,
    );
    support::outbox::report(&format!(
        "memory_bound: peak {peak} bytes in flight (bound {BOUND}) with the broker stopped"
    ));

    broker.resume();
    let records = consume(
        &broker.bootstrap(),
        &["outbox.event.mem"],
        ids.len(),
        WAIT * 4,
    );
    let seen: HashSet<String> = records
        .iter()
        .map(|record| {
            record
                .header("id")
                .expect("every record carries its event id")
        })
        .collect();
    let lost = ids.iter().filter(|id| !seen.contains(*id)).count();
    let first_lost = ids.iter().find(|id| !seen.contains(*id));
    assert_eq!(
        (lost, first_lost),
        (0, None),
        "event ids lost after SIGCONT (how many, the first), of {}",
        ids.len()
    );
}
