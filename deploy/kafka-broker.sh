#!/usr/bin/env bash
# A local single-node Apache Kafka (KRaft) for trying the relay's Kafka sink without a
# cluster or Docker: the same jars the tests run (fetched from Maven Central when missing).
#
#   ./deploy/kafka-broker.sh            # 127.0.0.1:9092, data in a temp dir, Ctrl-C stops
#   KAFKA_PORT=19092 KAFKA_DATA=/var/tmp/kafka ./deploy/kafka-broker.sh
#
# Topics are not auto-created (as on most production clusters); the relay creates the
# ones it needs ([kafka] create_topics = true, the default).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh
# Only what the broker needs: a JDK, Maven and Kafka's jars (not the test suite's
# PostgreSQL versions, Debezium, fonts or cargo-fuzz).
./deploy/dev-deps.sh --kafka-only >/dev/null
PORT="${KAFKA_PORT:-9092}"
WORK="${KAFKA_DATA:-$(mktemp -d /tmp/outbox-relay-kafka.XXXXXX)}"
KAFKA_PID=""
trap '[ -n "$KAFKA_PID" ] && kill "$KAFKA_PID" 2>/dev/null; wait 2>/dev/null || true' EXIT
trap 'exit 130' INT TERM
start_kafka_broker "$WORK" "$PORT"
echo "kafka-broker: Apache Kafka $(kafka_version) on 127.0.0.1:$PORT (pid $KAFKA_PID, data in $WORK, log $WORK/kafka.log); Ctrl-C stops it" >&2
wait "$KAFKA_PID"
