//! What the Debezium runner runs: where the jars are, the JVM options, and the worker,
//! connector and logging configuration it writes (see the parent module for why each
//! setting is what it is).

use std::path::{Path, PathBuf};
use std::time::Duration;

use postgres::NoTls;

use crate::pg::{PgCluster, SUPERUSER};

/// Env var naming the directory that holds Connect's and Debezium's jars.
pub const DEBEZIUM_LIBS_ENV: &str = "OUTBOX_RELAY_DEBEZIUM_LIBS";
/// Env var: the level of Debezium's and Connect's own loggers (default `info` for
/// Debezium, `warn` for the rest). Output goes to the captured stdout, not the test's.
pub const DEBEZIUM_TEST_LOG_ENV: &str = "DEBEZIUM_TEST_LOG";
/// The connector's name in Connect (its REST path, its offsets key).
pub const CONNECTOR_NAME: &str = "outbox-debezium";
/// Default slot and publication: Debezium's own, beside the relay's `outbox_relay`.
pub const DEFAULT_SLOT: &str = "debezium";
pub const DEFAULT_PUBLICATION: &str = "debezium";
/// The JVM options `connect-standalone.sh` and `kafka-run-class.sh` use when the user
/// sets none (`KAFKA_HEAP_OPTS`, `KAFKA_JVM_PERFORMANCE_OPTS`): Debezium measured as
/// users run it.
pub const CONNECT_JVM_OPTIONS: &[&str] = &[
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
];

const INSTALL_HINT: &str = "run ./deploy/dev-deps.sh (it copies Kafka Connect's and \
                            Debezium's jars from Maven Central with deploy/debezium/pom.xml)";
/// Where Debezium connects: a PostgreSQL server, role and database.
#[derive(Debug, Clone)]
pub struct PgEndpoint {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub database: String,
}

impl PgEndpoint {
    /// The harness cluster's superuser (trust authentication) on `database`.
    pub fn superuser(pg: &PgCluster, database: &str) -> Self {
        PgEndpoint {
            host: "127.0.0.1".to_owned(),
            port: pg.port(),
            user: SUPERUSER.to_owned(),
            password: None,
            database: database.to_owned(),
        }
    }

    pub(super) fn connect(&self) -> Result<postgres::Client, postgres::Error> {
        let mut config = postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.database)
            .connect_timeout(Duration::from_secs(5));
        if let Some(password) = &self.password {
            config.password(password);
        }
        config.connect(NoTls)
    }
}

/// How the outbox payload (`jsonb`) becomes the record value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// `table.expand.json.payload=true` and the `JsonConverter` without schemas: the
    /// value is the payload as a JSON document (Debezium's documented way to get JSON).
    ExpandedJson,
    /// The `StringConverter`: the value is the payload's text as PostgreSQL prints it,
    /// with no JSON parsing in Connect (cheaper; the same JSON, other whitespace).
    String,
}

/// What [`DebeziumConnect::start`] runs. `Default` is Debezium as its documentation
/// configures it for the outbox, on slot and publication `debezium`.
#[derive(Debug, Clone)]
pub struct DebeziumOptions {
    /// The connector's replication slot (`slot.name`).
    pub slot: String,
    /// The publication it reads (`publication.name`), made by [`prepare_slot`].
    pub publication: String,
    pub payload: PayloadFormat,
    /// When `Some(n)`, Connect creates missing topics with `n` partitions
    /// (`topic.creation.default.*`, replication factor 1); `None` leaves topic creation
    /// to the caller (the test broker does not auto-create topics: a record for a missing
    /// topic then waits in the producer).
    pub create_topics_with_partitions: Option<u32>,
    /// JVM options before the class path; [`CONNECT_JVM_OPTIONS`] by default.
    pub jvm_options: Vec<String>,
    /// Extra worker properties (e.g. `offset.flush.interval.ms`, `producer.linger.ms`),
    /// after the harness's own, so they win.
    pub worker_properties: Vec<(String, String)>,
    /// Extra connector properties (e.g. `max.batch.size`), after the harness's own.
    pub connector_properties: Vec<(String, String)>,
}

impl Default for DebeziumOptions {
    fn default() -> Self {
        DebeziumOptions {
            slot: DEFAULT_SLOT.to_owned(),
            publication: DEFAULT_PUBLICATION.to_owned(),
            payload: PayloadFormat::ExpandedJson,
            create_topics_with_partitions: None,
            jvm_options: CONNECT_JVM_OPTIONS.iter().map(|&o| o.to_owned()).collect(),
            worker_properties: Vec::new(),
            connector_properties: Vec::new(),
        }
    }
}

/// The Debezium version `deploy/debezium/pom.xml` pins (`<debezium.version>`).
pub fn debezium_version() -> String {
    pom_property("debezium.version")
}

/// The Kafka Connect version `deploy/debezium/pom.xml` pins (`<kafka.version>`: the one
/// Debezium is built against, not necessarily the broker's).
pub fn connect_version() -> String {
    pom_property("kafka.version")
}

fn pom_property(name: &str) -> String {
    let pom = crate::repo_root().join("deploy/debezium/pom.xml");
    let text = std::fs::read_to_string(&pom)
        .unwrap_or_else(|err| panic!("reading {}: {err}", pom.display()));
    text.split(&format!("<{name}>"))
        .nth(1)
        .and_then(|rest| rest.split(&format!("</{name}>")).next())
        .map(|version| version.trim().to_owned())
        .unwrap_or_else(|| panic!("{} has no <{name}>", pom.display()))
}

/// Where Connect's and Debezium's jars are: `$OUTBOX_RELAY_DEBEZIUM_LIBS`, else
/// `${XDG_CACHE_HOME:-~/.cache}/outbox-relay/debezium-<version>/libs` (as in
/// `deploy/lib.sh`); `None` when the connector's or Connect's jar is not there.
pub fn find_debezium_libs() -> Option<PathBuf> {
    let dir = libs_setting()?;
    required_jars(&dir)
        .iter()
        .all(|jar| jar.is_file())
        .then_some(dir)
}

/// [`find_debezium_libs`], panicking with the install hint when the jars are missing.
pub fn debezium_libs_dir() -> PathBuf {
    find_debezium_libs().unwrap_or_else(|| {
        let wanted = libs_setting()
            .map(|dir| {
                let jars: Vec<String> = required_jars(&dir)
                    .iter()
                    .map(|jar| jar.display().to_string())
                    .collect();
                jars.join(" and ")
            })
            .unwrap_or_else(|| "HOME or XDG_CACHE_HOME unset".to_owned());
        panic!(
            "Kafka Connect's and Debezium's jars are not installed (no {wanted}); {INSTALL_HINT}"
        )
    })
}

fn libs_setting() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(DEBEZIUM_LIBS_ENV) {
        return Some(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(
        cache
            .join("outbox-relay")
            .join(format!("debezium-{}", debezium_version()))
            .join("libs"),
    )
}

fn required_jars(dir: &Path) -> [PathBuf; 2] {
    [
        dir.join(format!(
            "debezium-connector-postgres-{}.jar",
            debezium_version()
        )),
        dir.join(format!("connect-runtime-{}.jar", connect_version())),
    ]
}

pub(super) type Properties = Vec<(String, String)>;

pub(super) fn worker_properties(
    bootstrap: &str,
    rest_port: u16,
    dir: &Path,
    options: &DebeziumOptions,
) -> Properties {
    let mut worker = props(&[
        ("bootstrap.servers", bootstrap),
        // The converters Debezium's outbox page names (see the module doc).
        (
            "key.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        ),
        ("listeners", &format!("http://127.0.0.1:{rest_port}")),
        (
            "offset.storage.file.filename",
            &dir.join("offsets.dat").display().to_string(),
        ),
    ]);
    worker.extend(match options.payload {
        PayloadFormat::ExpandedJson => props(&[
            (
                "value.converter",
                "org.apache.kafka.connect.json.JsonConverter",
            ),
            ("value.converter.schemas.enable", "false"),
        ]),
        PayloadFormat::String => props(&[(
            "value.converter",
            "org.apache.kafka.connect.storage.StringConverter",
        )]),
    });
    worker.extend(options.worker_properties.iter().cloned());
    worker
}

pub(super) fn connector_properties(pg: &PgEndpoint, options: &DebeziumOptions) -> Properties {
    let port = pg.port.to_string();
    let mut connector = props(&[
        ("name", CONNECTOR_NAME),
        (
            "connector.class",
            "io.debezium.connector.postgresql.PostgresConnector",
        ),
        ("tasks.max", "1"),
        ("database.hostname", &pg.host),
        ("database.port", &port),
        ("database.user", &pg.user),
        ("database.dbname", &pg.database),
        // Names the connector's own topics (heartbeats, none here); the outbox records
        // go where the router sends them.
        ("topic.prefix", "debezium"),
        ("plugin.name", "pgoutput"),
        ("slot.name", &options.slot),
        ("publication.name", &options.publication),
        ("publication.autocreate.mode", "disabled"),
        // Stream only the WAL after the slot's position, no initial read of the table.
        ("snapshot.mode", "no_data"),
        ("table.include.list", "public.outbox"),
        // Nothing deletes outbox rows in the benchmark; a delete would be filtered by
        // the router anyway, and its tombstone is not an outbox event.
        ("tombstones.on.delete", "false"),
        ("transforms", "outbox"),
        (
            "transforms.outbox.type",
            "io.debezium.transforms.outbox.EventRouter",
        ),
        ("transforms.outbox.route.by.field", "aggregatetype"),
        (
            "transforms.outbox.route.topic.replacement",
            "outbox.event.${routedByValue}",
        ),
        ("transforms.outbox.table.field.event.id", "id"),
        ("transforms.outbox.table.field.event.key", "aggregateid"),
        ("transforms.outbox.table.field.event.payload", "payload"),
    ]);
    if let Some(password) = &pg.password {
        connector.push(("database.password".to_owned(), password.clone()));
    }
    if options.payload == PayloadFormat::ExpandedJson {
        connector.extend(props(&[(
            "transforms.outbox.table.expand.json.payload",
            "true",
        )]));
    }
    if let Some(partitions) = options.create_topics_with_partitions {
        connector.extend(props(&[
            ("topic.creation.default.partitions", &partitions.to_string()),
            ("topic.creation.default.replication.factor", "1"),
        ]));
    }
    connector.extend(options.connector_properties.iter().cloned());
    connector
}

fn props(pairs: &[(&str, &str)]) -> Properties {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// A Java properties file: `key=value` lines, backslashes and line breaks escaped.
pub(super) fn properties(pairs: &[(String, String)]) -> String {
    let mut text = String::from("# Generated by harness/src/debezium.rs\n");
    for (key, value) in pairs {
        let value = value
            .replace('\\', "\\\\")
            .replace('\n', "\\n")
            .replace('\r', "\\r");
        text.push_str(&format!("{key}={value}\n"));
    }
    text
}

/// Logs to stdout (captured, not echoed): Debezium at `info` (its streaming progress),
/// everything else at `warn`; `DEBEZIUM_TEST_LOG` sets both.
pub(super) fn log4j_config() -> String {
    let level = std::env::var(DEBEZIUM_TEST_LOG_ENV);
    let debezium = level.as_deref().unwrap_or("info");
    let rest = level.as_deref().unwrap_or("warn");
    format!(
        "status = warn\n\
         appender.out.type = Console\n\
         appender.out.name = OUT\n\
         appender.out.layout.type = PatternLayout\n\
         appender.out.layout.pattern = [%d{{HH:mm:ss,SSS}}] %p %m (%c)%n\n\
         rootLogger.level = {rest}\n\
         rootLogger.appenderRef.out.ref = OUT\n\
         logger.debezium.name = io.debezium\n\
         logger.debezium.level = {debezium}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_escape_backslashes_and_line_breaks() {
        let text = properties(&props(&[("a", "x\\y"), ("b", "1\n2")]));
        assert!(text.ends_with("a=x\\\\y\nb=1\\n2\n"), "{text}");
    }

    #[test]
    fn expanded_json_uses_the_json_converter_and_the_router_expands() {
        let pg = PgEndpoint {
            host: "127.0.0.1".into(),
            port: 5432,
            user: "postgres".into(),
            password: Some("secret".into()),
            database: "app".into(),
        };
        let options = DebeziumOptions::default();
        let worker = worker_properties("127.0.0.1:9092", 8083, Path::new("/tmp/x"), &options);
        let connector = connector_properties(&pg, &options);
        let get = |props: &Properties, key: &str| {
            props
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get(&worker, "value.converter").as_deref(),
            Some("org.apache.kafka.connect.json.JsonConverter")
        );
        assert_eq!(
            get(&connector, "transforms.outbox.table.expand.json.payload").as_deref(),
            Some("true")
        );
        assert_eq!(
            get(&connector, "database.password").as_deref(),
            Some("secret")
        );
        assert_eq!(get(&connector, "snapshot.mode").as_deref(), Some("no_data"));

        let options = DebeziumOptions {
            payload: PayloadFormat::String,
            connector_properties: vec![("snapshot.mode".into(), "initial".into())],
            ..DebeziumOptions::default()
        };
        let worker = worker_properties("127.0.0.1:9092", 8083, Path::new("/tmp/x"), &options);
        let connector = connector_properties(&pg, &options);
        assert_eq!(
            get(&worker, "value.converter").as_deref(),
            Some("org.apache.kafka.connect.storage.StringConverter")
        );
        assert_eq!(
            get(&connector, "transforms.outbox.table.expand.json.payload"),
            None
        );
        // Extra properties come last and win.
        assert_eq!(get(&connector, "snapshot.mode").as_deref(), Some("initial"));
    }
}
