//! Progress is visible in metrics: the relay serves Prometheus text on /metrics.
//!
//! Metric names come from `outbox_relay::metrics`, the constants the relay renders; the
//! names themselves (what dashboards and alerts are written against) are pinned once, by
//! the unit test in `src/metrics.rs`.

use outbox_relay_harness as support;

use std::io::{Read, Write};
use std::net::TcpStream;

use outbox_relay::metrics::{
    EVENTS_TOTAL, FLUSH_LSN, IN_FLIGHT, LAST_STATUS_UNIX_SECONDS, TRANSACTIONS_TOTAL,
};
use support::outbox::{cluster_with_outbox, start_streaming, stdout_config, with_metrics, WAIT};
use support::PgOptions;

fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

fn value(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn metrics_show_events_and_the_acknowledged_position() {
    let pg = cluster_with_outbox(PgOptions::default());
    let (config, port) = with_metrics(&stdout_config(&pg));
    let relay = start_streaming(&config);
    pg.client_db("app")
        .batch_execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
             SELECT 'm', 'a', 'T', '{}' FROM generate_series(1, 3)",
        )
        .unwrap();
    relay.wait_for_lines(3, WAIT);
    let after = pg.current_wal_lsn();
    let text = support::wait_for(
        "metrics report 3 events and the acknowledged commit",
        WAIT,
        || {
            let text = scrape(port)?;
            let events = value(&text, EVENTS_TOTAL)?;
            let flush = value(&text, FLUSH_LSN)?;
            (events == 3 && flush >= after).then_some(text)
        },
    );
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert_eq!(value(&text, TRANSACTIONS_TOTAL), Some(1));
    assert_eq!(value(&text, IN_FLIGHT), Some(0));
    assert!(value(&text, LAST_STATUS_UNIX_SECONDS).unwrap() > 0);
}
