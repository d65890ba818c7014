#!/usr/bin/env bash
# Runs outbox-relay on a fresh machine: a throwaway local PostgreSQL (wal_level=logical),
# the relay on its stdout sink (no Kafka needed), and sample outbox events inserted every
# second so you can watch them arrive as JSON lines. Logs go to stderr.
#
#   ./deploy/demo.sh                 # 20 seconds of sample events, then a graceful stop
#   DEMO_SECONDS=0 ./deploy/demo.sh  # keep inserting until Ctrl-C
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${DEMO_SECONDS:-20}"

./deploy/dev-deps.sh --postgres-only
cargo build --release --quiet
RELAY="$PWD/target/release/outbox-relay"

. deploy/lib.sh
BINDIR="$(find_pg_bindir)"

WORK="$(mktemp -d /tmp/outbox-relay-demo.XXXXXX)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
AS_PG=()
if [ "$(id -u)" = 0 ]; then
    chown postgres: "$WORK"
    AS_PG=(runuser -u postgres --)
fi

RELAY_PID=""; PG_PID=""
cleanup() {
    [ -n "$RELAY_PID" ] && kill "$RELAY_PID" 2>/dev/null && wait "$RELAY_PID" 2>/dev/null || true
    # Signal the postmaster itself (runuser does not pass signals on): fast shutdown.
    if [ -f "$WORK/data/postmaster.pid" ]; then
        kill -INT "$(head -n 1 "$WORK/data/postmaster.pid")" 2>/dev/null || true
    fi
    [ -n "$PG_PID" ] && wait "$PG_PID" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "demo: starting PostgreSQL on 127.0.0.1:$PORT (data in $WORK)" >&2
"${AS_PG[@]}" "$BINDIR/initdb" -D "$WORK/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
"${AS_PG[@]}" "$BINDIR/postgres" -D "$WORK/data" -p "$PORT" -c listen_addresses=127.0.0.1 \
    -c unix_socket_directories="$WORK" -c wal_level=logical >"$WORK/postgres.log" 2>&1 &
PG_PID=$!
psql_() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres "$@"; }
for _ in $(seq 100); do psql_ -c 'select 1' postgres >/dev/null 2>&1 && break; sleep 0.1; done

psql_ postgres -c "CREATE DATABASE app"
psql_ app -f sql/outbox.sql
# The relay's role: REPLICATION to stream the WAL; owning the table and CREATE on the
# database let it create its publication itself, CREATE on the schema its state table
# (its record of the slot) (see sql/roles.sql).
psql_ app -c "CREATE ROLE relay LOGIN REPLICATION PASSWORD 'relay'; ALTER TABLE public.outbox OWNER TO relay; GRANT CREATE ON DATABASE app TO relay; GRANT CREATE ON SCHEMA public TO relay;"

cat >"$WORK/relay.toml" <<TOML
[postgres]
url = "postgres://relay:relay@127.0.0.1:$PORT/app"
slot = "outbox_relay"
publication = "outbox_relay"
[outbox]
table = "public.outbox"
[sink]
type = "stdout"
TOML
echo "demo: relay config:" >&2; sed 's/^/    /' "$WORK/relay.toml" >&2

"$RELAY" run --config "$WORK/relay.toml" &
RELAY_PID=$!
# Wait until the relay's slot exists, so the first sample events are not before it.
for _ in $(seq 300); do
    [ "$(psql_ app -tAc "select count(*) from pg_replication_slots where slot_name = 'outbox_relay'")" = 1 ] && break
    if ! kill -0 "$RELAY_PID" 2>/dev/null; then
        echo "demo: the relay exited; see its error above" >&2
        RELAY_PID=""
        exit 1
    fi
    sleep 0.1
done

echo "demo: inserting sample events every second (Ctrl-C to stop)" >&2
i=0
while [ "$SECONDS_TO_RUN" = 0 ] || [ "$i" -lt "$SECONDS_TO_RUN" ]; do
    i=$((i + 1))
    psql_ app -c "
      BEGIN;
      INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
        VALUES ('order', 'order-$i', 'OrderCreated', jsonb_build_object('order', $i, 'total', $i * 9.5)),
               ('customer', 'customer-' || ($i % 3), 'CustomerSeen', jsonb_build_object('visits', $i));
      COMMIT;"
    sleep 1
done
echo "demo: stopping the relay gracefully" >&2
kill -TERM "$RELAY_PID" 2>/dev/null || true
wait "$RELAY_PID" || true
RELAY_PID=""
