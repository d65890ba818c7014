//! The broker's JVM: where its jars are, the `java` command line, its logging
//! configuration, and the watchdog that kills it when the test process exits.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Env var naming the directory that holds the broker's jars.
pub const KAFKA_LIBS_ENV: &str = "OUTBOX_RELAY_KAFKA_LIBS";
/// Env var: `info` or `debug` makes the broker log more than warnings (default `warn`).
pub const KAFKA_TEST_LOG_ENV: &str = "KAFKA_TEST_LOG";
const INSTALL_HINT: &str = "run ./deploy/dev-deps.sh (it copies Apache Kafka's jars from \
                            Maven Central with deploy/kafka/pom.xml)";
/// Heap bound for the broker JVM: enough for the million-record tests, small enough
/// that two brokers and the rest of a test fit the machine.
const HEAP: &str = "-Xmx512m";

/// `java` (from `$JAVA_HOME` when set) with the broker's class path, heap bound and
/// logging configuration, its working directory `dir`.
pub(super) fn java_command(libs: &Path, dir: &Path) -> Command {
    let java = std::env::var_os("JAVA_HOME")
        .map(|home| PathBuf::from(home).join("bin/java"))
        .filter(|java| java.is_file())
        .unwrap_or_else(|| PathBuf::from("java"));
    let mut command = Command::new(java);
    command
        .arg(HEAP)
        .arg("-Xms64m")
        // One core's worth of GC and JIT threads: the machine has two, shared with
        // PostgreSQL, the relay and the test.
        .arg("-XX:+UseSerialGC")
        .arg("-XX:CICompilerCount=2")
        .arg("-Djava.awt.headless=true")
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            dir.join("log4j2.properties").display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .current_dir(dir);
    command
}

/// Logs warnings and errors (to stdout, which the harness captures); `KAFKA_TEST_LOG`
/// raises the level of Kafka's own loggers.
pub(super) fn log4j_config(level: Option<&str>) -> String {
    let level = level
        .map(str::to_owned)
        .unwrap_or_else(|| std::env::var(KAFKA_TEST_LOG_ENV).unwrap_or_else(|_| "warn".to_owned()));
    format!(
        "status = warn\n\
         appender.out.type = Console\n\
         appender.out.name = OUT\n\
         appender.out.layout.type = PatternLayout\n\
         appender.out.layout.pattern = [%d{{HH:mm:ss,SSS}}] %p %m (%c)%n\n\
         rootLogger.level = warn\n\
         rootLogger.appenderRef.out.ref = OUT\n\
         logger.kafka.name = kafka\n\
         logger.kafka.level = {level}\n\
         logger.apache.name = org.apache.kafka\n\
         logger.apache.level = {level}\n"
    )
}

/// The Kafka version `deploy/kafka/pom.xml` pins (`<kafka.version>`).
pub fn kafka_version() -> String {
    let pom = crate::repo_root().join("deploy/kafka/pom.xml");
    let text = std::fs::read_to_string(&pom)
        .unwrap_or_else(|err| panic!("reading {}: {err}", pom.display()));
    text.split("<kafka.version>")
        .nth(1)
        .and_then(|rest| rest.split("</kafka.version>").next())
        .map(|version| version.trim().to_owned())
        .unwrap_or_else(|| panic!("{} has no <kafka.version>", pom.display()))
}

/// Where the broker's jars are: `$OUTBOX_RELAY_KAFKA_LIBS`, else
/// `${XDG_CACHE_HOME:-~/.cache}/outbox-relay/kafka-<version>/libs` (as in
/// `deploy/lib.sh`). Panics with the install hint when the broker's jar is not there.
pub fn kafka_libs_dir() -> PathBuf {
    let dir = match std::env::var_os(KAFKA_LIBS_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .expect("HOME or XDG_CACHE_HOME is set");
            cache
                .join("outbox-relay")
                .join(format!("kafka-{}", kafka_version()))
                .join("libs")
        }
    };
    let broker_jar = dir.join(format!("kafka_2.13-{}.jar", kafka_version()));
    assert!(
        broker_jar.is_file(),
        "Apache Kafka's jars are not in {} (no {}); {INSTALL_HINT}",
        dir.display(),
        broker_jar.display()
    );
    dir
}
