//! Shared set-up for relay tests: a database with an outbox table, relay configs for
//! the stdout and Kafka sinks, and small SQL helpers.

use std::time::Duration;

use super::pg::PgCluster;
use super::pg::PgOptions;
// Reads the relay's own endpoint, so it lives with the relay process; named here too,
// where the tests import it.
pub use super::relay::metric;
use super::relay::RelayProcess;

/// The default outbox table of the product (Debezium's shape).
pub const OUTBOX_SQL: &str = include_str!("../../sql/outbox.sql");
/// Slot and publication names the tests use.
pub const SLOT: &str = "outbox_relay";
pub const PUBLICATION: &str = "outbox_relay";
/// Generous deadline for anything a relay should do in a test.
pub const WAIT: Duration = Duration::from_secs(90);

/// A cluster with database `app` holding the default outbox table.
pub fn cluster_with_outbox(opts: PgOptions) -> PgCluster {
    let pg = PgCluster::start_with(opts);
    pg.batch_execute("CREATE DATABASE app");
    pg.client_db("app")
        .batch_execute(OUTBOX_SQL)
        .unwrap_or_else(|e| panic!("creating the outbox table: {e}"));
    pg
}

/// A cluster with database `app` and no outbox table yet.
pub fn cluster_with_app_db() -> PgCluster {
    let pg = PgCluster::start();
    pg.batch_execute("CREATE DATABASE app");
    pg
}

/// Whether the relay's outbox watch (its session, by application name) waits for a lock
/// now: tests hold a lock the watch needs, and let it go once it waits.
pub fn watch_waits_for_a_lock(pg: &PgCluster) -> bool {
    let waiting: i64 = pg
        .client_db("app")
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity \
             WHERE application_name = 'outbox-relay (outbox watch)' AND wait_event_type = 'Lock'",
            &[],
        )
        .unwrap_or_else(|e| panic!("looking for the watch's lock wait: {e}"))
        .get(0);
    waiting == 1
}

/// Whether this server's `pg_publication_tables` opens every table it lists
/// (PostgreSQL 16 and later), so that a read of it waits for a drop's lock.
pub fn publication_tables_opens_tables(pg: &PgCluster) -> bool {
    pg.client_db("app")
        .query_one(
            "SELECT pg_catalog.current_setting('server_version_num')::int >= 160000",
            &[],
        )
        .unwrap_or_else(|e| panic!("reading server_version_num: {e}"))
        .get(0)
}

/// Config of a relay on the stdout sink, as the superuser on database `app`.
pub fn stdout_config(pg: &PgCluster) -> String {
    format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"{PUBLICATION}\"\n\
         status_interval_ms = 200\n\
         [outbox]\ntable = \"public.outbox\"\n[sink]\ntype = \"stdout\"\n",
        pg.url("postgres", None, "app")
    )
}

/// Config of a relay on the Kafka sink. `outbox` is the body of the `[outbox]` table
/// (empty = defaults), `dead_letter` the optional dead-letter topic, `properties`
/// extra librdkafka properties.
pub fn kafka_config(
    pg: &PgCluster,
    bootstrap: &str,
    outbox: &str,
    dead_letter: Option<&str>,
    properties: &[(&str, &str)],
) -> String {
    let mut toml = format!(
        "[postgres]\nurl = \"{}\"\nslot = \"{SLOT}\"\npublication = \"{PUBLICATION}\"\n\
         status_interval_ms = 200\n\
         [outbox]\n{outbox}\n\
         [sink]\ntype = \"kafka\"\n\
         [kafka]\nbrokers = \"{bootstrap}\"\n\
         [kafka.properties]\n\"linger.ms\" = \"5\"\n",
        pg.url("postgres", None, "app")
    );
    for (key, value) in properties {
        toml.push_str(&format!("\"{key}\" = \"{value}\"\n"));
    }
    if let Some(topic) = dead_letter {
        toml.push_str(&format!("[dead_letter]\ntopic = \"{topic}\"\n"));
    }
    toml
}

/// Start a relay and wait until it streams: PostgreSQL shows its walsender streaming
/// from the slot (rows committed before the slot existed are, by design, not part of
/// its stream). The server and the slot are the config's `[postgres] url` and `slot`.
pub fn start_streaming(config: &str) -> RelayProcess {
    let relay = RelayProcess::start(config);
    let (url, slot) = postgres_url_and_slot(config);
    relay.wait_streaming(&url, &slot, WAIT);
    relay
}

/// `[postgres] url` and `slot` of a relay config ([`SLOT`], the product's default too,
/// when it names none).
fn postgres_url_and_slot(config: &str) -> (String, String) {
    let table: toml::Table = config
        .parse()
        .unwrap_or_else(|err| panic!("the relay config is not TOML ({err}):\n{config}"));
    let postgres = table.get("postgres").and_then(toml::Value::as_table);
    let field = |key: &str| {
        postgres
            .and_then(|table| table.get(key))
            .and_then(toml::Value::as_str)
            .map(str::to_owned)
    };
    let url = field("url").unwrap_or_else(|| panic!("no [postgres] url in:\n{config}"));
    (url, field("slot").unwrap_or_else(|| SLOT.to_owned()))
}

/// `config` with `[metrics] listen` on a free port, and that port.
pub fn with_metrics(config: &str) -> (String, u16) {
    let port = free_port();
    let separator = if config.ends_with('\n') { "" } else { "\n" };
    (
        format!("{config}{separator}[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
        port,
    )
}

/// Inserts `n` events of aggregate type `kind`, one transaction each, into database
/// `app`'s outbox; returns their ids in commit order.
pub fn insert_events(pg: &PgCluster, kind: &str, n: usize) -> Vec<String> {
    let mut client = pg.client_db("app");
    (0..n)
        .map(|_| {
            client
                .query_one(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
                     VALUES ($1, 'a', 'T', '{}') RETURNING id::text",
                    &[&kind],
                )
                .unwrap_or_else(|e| panic!("inserting a {kind:?} event: {e}"))
                .get(0)
        })
        .collect()
}

/// The event ids (header `id`) of stdout-sink lines, in order.
pub fn event_ids<S: AsRef<str>>(lines: &[S]) -> Vec<String> {
    lines
        .iter()
        .map(|line| {
            let line = line.as_ref();
            let event: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            event["headers"]["id"]
                .as_str()
                .unwrap_or_else(|| panic!("no id header: {line}"))
                .to_owned()
        })
        .collect()
}

/// Peak resident set size (VmHWM) of a running process, in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The relay's stderr without ANSI colour codes (tracing colours field names).
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for end in chars.by_ref() {
                if end.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Print a result line that must show in the test run's output even when the test
/// passes (libtest captures `println!`, not writes to the stderr handle itself): seeds,
/// summaries, measured figures.
pub fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// A TCP port on 127.0.0.1 that was free a moment ago (for `[metrics] listen`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("binding 127.0.0.1:0")
}

/// The PID of the walsender streaming from the test slot, if any.
pub fn slot_active_pid(pg: &PgCluster) -> Option<i32> {
    pg.client()
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active",
            &[&SLOT],
        )
        .ok()
        .flatten()
        .and_then(|row| row.get(0))
}

/// The acknowledged position in the relay's state table (database `app`, the default
/// table), if it has recorded one for [`SLOT`].
pub fn recorded_lsn(pg: &PgCluster) -> Option<u64> {
    pg.client_db("app")
        .query_opt(
            "SELECT acknowledged_lsn::text FROM outbox_relay_state WHERE slot_name = $1",
            &[&SLOT],
        )
        .unwrap_or_else(|e| panic!("reading the relay's record: {e}"))
        .and_then(|row| row.get::<_, Option<String>>(0))
        .map(|lsn| crate::lsn_to_u64(&lsn))
}
