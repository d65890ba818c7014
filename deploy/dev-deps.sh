#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, only when it is missing:
# PostgreSQL server binaries (Debian's postgresql package).
set -euo pipefail

have_pg_server() {
    command -v initdb >/dev/null 2>&1 && command -v postgres >/dev/null 2>&1 && return 0
    if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ] && [ -x "$(pg_config --bindir)/postgres" ]; then
        return 0
    fi
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if ! have_pg_server; then
    echo "dev-deps: installing PostgreSQL server (Debian package postgresql)" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
    # Debian's package starts a system cluster; the tests never use it.
    $SUDO service postgresql stop >/dev/null 2>&1 || true
fi
echo "dev-deps: PostgreSQL server binaries present" >&2
