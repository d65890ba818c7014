//! Progress is visible in metrics: the relay serves Prometheus text on /metrics, and
//! its health on /healthz and /readyz, which change state when PostgreSQL or the broker
//! goes away.
//!
//! Metric names come from `outbox_relay::metrics`, the constants the relay renders; the
//! names themselves (what dashboards and alerts are written against) are pinned once, by
//! the unit test in `src/metrics.rs`.

use outbox_relay_harness as support;

use outbox_relay::metrics::{
    DELIVERY_LATENCY_SECONDS, EVENTS_TOTAL, FLUSH_LSN, IN_FLIGHT, LAST_STATUS_UNIX_SECONDS,
    REPLICATION_LAG_BYTES, REPLICATION_LAG_SECONDS, STREAMING, TOPIC_DELIVERED_TOTAL,
    TRANSACTIONS_TOTAL,
};
use support::outbox::{
    cluster_with_outbox, insert_events, kafka_config, start_streaming, stdout_config, with_metrics,
    WAIT,
};
use support::{wait_until, KafkaBroker, PgOptions};

/// The body of a 200 answer on `/metrics`.
fn scrape(port: u16) -> Option<String> {
    support::http_get(port, "/metrics")
        .filter(|(code, _)| *code == 200)
        .map(|(_, body)| body)
}

/// The HTTP status code of `path`, `None` while nothing answers.
fn status(port: u16, path: &str) -> Option<u16> {
    support::http_get(port, path).map(|(code, _)| code)
}

fn wait_status(port: u16, path: &str, code: u16, what: &str) {
    wait_until(&format!("{path} answers {code}: {what}"), WAIT, || {
        status(port, path) == Some(code)
    });
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
    assert_eq!(value(&text, TRANSACTIONS_TOTAL), Some(1));
    assert_eq!(value(&text, IN_FLIGHT), Some(0));
    assert!(value(&text, LAST_STATUS_UNIX_SECONDS).unwrap() > 0);
}

#[test]
fn per_topic_counts_lag_and_latency_follow_deliveries() {
    let pg = cluster_with_outbox(PgOptions::default());
    let (config, port) = with_metrics(&stdout_config(&pg));
    let relay = start_streaming(&config);
    insert_events(&pg, "order", 4);
    insert_events(&pg, "customer", 2);
    relay.wait_for_lines(6, WAIT);
    let after = pg.current_wal_lsn();
    // The lag is the last status update's: received past acknowledged. A status
    // update may go out between the event's acknowledgement and the relay's receipt of
    // WAL after it (a keepalive's position), so the lag is waited for, not sampled.
    let text = support::wait_for(
        "every delivery counted and acknowledged, and no lag",
        WAIT,
        || {
            let text = scrape(port)?;
            (value(&text, FLUSH_LSN)? >= after && value(&text, REPLICATION_LAG_BYTES)? == 0)
                .then_some(text)
        },
    );
    let topic = |name: &str| {
        value(
            &text,
            &format!("{TOPIC_DELIVERED_TOTAL}{{topic=\"{name}\"}}"),
        )
    };
    assert_eq!(topic("outbox.event.order"), Some(4), "{text}");
    assert_eq!(topic("outbox.event.customer"), Some(2), "{text}");
    assert_eq!(
        value(&text, &format!("{DELIVERY_LATENCY_SECONDS}_count")),
        Some(6),
        "one latency per delivered event: {text}"
    );
    assert_eq!(value(&text, REPLICATION_LAG_BYTES), Some(0), "{text}");
    assert!(
        text.contains(&format!("\n{REPLICATION_LAG_SECONDS} 0\n")),
        "everything acknowledged: no lag: {text}"
    );
    assert_eq!(value(&text, STREAMING), Some(1));
}

#[test]
fn health_goes_unready_while_postgresql_is_away_and_back_when_it_returns() {
    let mut pg = cluster_with_outbox(PgOptions::default());
    let (config, port) = with_metrics(&stdout_config(&pg));
    let relay = start_streaming(&config);
    wait_status(port, "/readyz", 200, "streaming");
    assert_eq!(status(port, "/healthz"), Some(200));

    pg.stop_fast();
    wait_status(port, "/readyz", 503, "PostgreSQL is down");
    assert_eq!(
        status(port, "/healthz"),
        Some(200),
        "retrying is healthy: a restart of the relay would not help"
    );
    assert!(relay.exit_status().is_none(), "the relay keeps retrying");

    pg.start_again();
    wait_status(port, "/readyz", 200, "streaming again");
    insert_events(&pg, "back", 1);
    relay.wait_for_lines(1, WAIT);
}

#[test]
fn health_goes_unready_while_the_broker_does_not_confirm_and_back_when_it_does() {
    let pg = cluster_with_outbox(PgOptions::default());
    let broker = KafkaBroker::start();
    // The sink counts as stuck once the oldest event waited half of stall_release.
    let config = format!(
        "{}[relay]\nstall_release_ms = 6000\n",
        kafka_config(&pg, &broker.bootstrap(), "", None, &[])
    );
    let (config, port) = with_metrics(&config);
    let relay = start_streaming(&config);
    insert_events(&pg, "first", 1);
    relay.wait_metric(
        port,
        FLUSH_LSN,
        "the first event acknowledged",
        WAIT,
        |flush| flush >= pg.current_wal_lsn(),
    );
    wait_status(port, "/readyz", 200, "streaming, deliveries confirmed");

    broker.pause();
    insert_events(&pg, "stuck", 1);
    wait_status(port, "/readyz", 503, "the broker confirms nothing");
    assert_eq!(status(port, "/healthz"), Some(200));

    broker.resume();
    wait_status(port, "/readyz", 200, "the broker confirms again");
}

/// The Grafana dashboard (`deploy/grafana/outbox-relay.json`) queries only metrics the
/// relay serves: a renamed metric would leave a panel empty without this.
#[test]
fn the_grafana_dashboard_queries_only_metrics_the_relay_serves() {
    let path = support::repo_root().join("deploy/grafana/outbox-relay.json");
    let text = std::fs::read_to_string(&path).expect("reading the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let served = outbox_relay::metrics::Metrics::new().render();
    let served: Vec<&str> = served
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split(' ').next())
        .collect();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "a dashboard with its panels");
    let mut queried = 0;
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("a query");
            for (at, _) in expr.match_indices("outbox_relay_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .filter(|base| served.contains(base))
                    .unwrap_or(&name);
                assert!(
                    served.contains(&base),
                    "panel {:?} queries {name}, which the relay does not serve",
                    panel["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried > 10);
}
