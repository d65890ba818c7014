#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, only when it is missing:
# PostgreSQL server binaries (Debian's postgresql package) and the tansu Kafka broker
# (cargo install, ~15-20 min on 2 cores the first time; skipped when already present).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if ! find_pg_bindir >/dev/null; then
    echo "dev-deps: installing PostgreSQL server (Debian package postgresql)" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
    # Debian's package starts a system cluster; the tests never use it.
    $SUDO service postgresql stop >/dev/null 2>&1 || true
fi
echo "dev-deps: PostgreSQL server binaries present" >&2

# tansu: a Kafka wire-compatible broker for the integration tests. `dynostore` provides
# the memory:// storage engine, `libsql` the sqlite:// one. The tests find it through
# $TANSU_BIN, then PATH, then $CARGO_HOME/bin and ~/.cargo/bin.
TANSU_VERSION=0.6.0
CARGO_BIN_DIR="${CARGO_HOME:-$HOME/.cargo}/bin"
case ":$PATH:" in
    *":$CARGO_BIN_DIR:"*) ;;
    *) export PATH="$CARGO_BIN_DIR:$PATH" ;;
esac

if ! TANSU="$(find_tansu)"; then
    if ! command -v cargo >/dev/null 2>&1; then
        echo "dev-deps: cargo not found; install Rust (rustup) to build tansu" >&2
        exit 1
    fi
    echo "dev-deps: installing tansu $TANSU_VERSION (cargo install, ~15-20 min)" >&2
    cargo install tansu --locked --version "$TANSU_VERSION" --features dynostore,libsql
    TANSU="$(find_tansu)" || { echo "dev-deps: tansu still not found after install" >&2; exit 1; }
fi
TANSU_FOUND_VERSION="$("$TANSU" --version 2>/dev/null || true)"
case "$TANSU_FOUND_VERSION" in
    *" $TANSU_VERSION") ;;
    *) echo "dev-deps: warning: $TANSU reports '$TANSU_FOUND_VERSION', tests expect tansu $TANSU_VERSION" >&2 ;;
esac
# A CI runner that reads $GITHUB_PATH keeps the cargo bin dir on PATH for later steps.
if [ -n "${GITHUB_PATH:-}" ]; then echo "$CARGO_BIN_DIR" >>"$GITHUB_PATH"; fi
echo "dev-deps: tansu present ($TANSU)" >&2
