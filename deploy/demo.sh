#!/usr/bin/env bash
# Runs outbox-relay on a fresh machine: a throwaway local PostgreSQL (wal_level=logical),
# the relay on its stdout sink (no Kafka needed), and sample outbox events inserted every
# second so you can watch them arrive as JSON lines. Logs go to stderr. PostgreSQL is
# started by the tests' own harness (harness/src/bin/demo.rs), not by this script.
#
#   ./deploy/demo.sh                 # 20 seconds of sample events, then a graceful stop
#   DEMO_SECONDS=0 ./deploy/demo.sh  # keep inserting until Ctrl-C
set -euo pipefail
cd "$(dirname "$0")/.."

./deploy/dev-deps.sh --postgres-only
cargo build --release --quiet -p outbox-relay --bin outbox-relay
exec cargo run --release --quiet -p outbox-relay-harness --bin demo
