# Shared by deploy/dev-deps.sh, deploy/demo.sh, deploy/kafka-broker.sh and bench/run.sh
# (sourced, not run): where the PostgreSQL server binaries and Apache Kafka's jars are on
# this machine, and how to start a single-node Kafka from those jars.

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

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KAFKA_POM="$DEPLOY_DIR/kafka/pom.xml"

# The Apache Kafka version deploy/kafka/pom.xml pins (the tests read the same line).
kafka_version() {
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_POM" | head -n 1
}

# Where the broker's jars live: $OUTBOX_RELAY_KAFKA_LIBS, else
# ${XDG_CACHE_HOME:-~/.cache}/outbox-relay/kafka-<version>/libs (as in tests/support/kafka.rs).
kafka_libs_dir() {
    if [ -n "${OUTBOX_RELAY_KAFKA_LIBS:-}" ]; then echo "$OUTBOX_RELAY_KAFKA_LIBS"; return; fi
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/kafka-$(kafka_version)/libs"
}

# Copies the broker and its runtime dependencies from Maven Central into kafka_libs_dir
# when the broker's jar is not there yet (about 45 MB, seconds). Needs java and mvn.
ensure_kafka_libs() {
    local libs version
    libs="$(kafka_libs_dir)"; version="$(kafka_version)"
    if [ -f "$libs/kafka_2.13-$version.jar" ]; then return 0; fi
    command -v mvn >/dev/null 2>&1 || { echo "Maven (mvn) not found: install it (Debian: apt-get install maven) to fetch Apache Kafka" >&2; return 1; }
    echo "fetching Apache Kafka $version from Maven Central into $libs" >&2
    mkdir -p "$libs.partial"
    mvn -q -B -f "$KAFKA_POM" dependency:copy-dependencies -DoutputDirectory="$libs.partial" >&2
    rm -rf "$libs"; mv "$libs.partial" "$libs"
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
