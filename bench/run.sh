#!/usr/bin/env bash
# Throughput and memory benchmark of outbox-relay on this machine: a throwaway PostgreSQL
# cluster, an Apache Kafka broker (single-node KRaft, deploy/lib.sh) and the release build of the relay, driven by
# three scenarios (many small transactions, one large transaction, a backlog of small
# ones) on two sinks (stdout, Kafka). Prints one markdown results table on stdout;
# progress and notes go to stderr. See docs/benchmarks.md for what is measured and how.
#
#   ./bench/run.sh                                  # defaults: about a minute on 2 cores, plus the build
#   N1=50000 N2=200000 SINKS=stdout ./bench/run.sh  # smaller, stdout sink only
#
# Knobs (environment):
#   N1=200000           events of scenario "small": transactions of TXN1 events each
#   TXN1=10             events per transaction in scenario "small"
#   N2=1000000          events of scenario "large": one transaction
#   N3=$N1              events of scenario "backlog": inserted in transactions of TXN1
#                       while the relay is stopped, then the relay is started and timed
#   SCENARIOS="small large backlog"
#   SINKS="stdout kafka"  stdout goes to /dev/null; kafka goes to a fresh Apache Kafka per scenario
#   PAYLOAD_PAD=100     characters of filler in each event's JSON payload
#   STATUS_INTERVAL_MS=100  the relay's [postgres] status_interval_ms (its default is 10000;
#                       the slot's confirmed_flush_lsn only moves on a status update, so
#                       it is the resolution of the measurement)
#   TIMEOUT_S=900       give up waiting for the slot to catch up after this long
#   IDLE_MAX_BUSY=20    before each scenario wait until the machine's CPUs are at most
#                       this % busy (sampled over 3 s) ...
#   IDLE_WAIT_S=1800    ... for at most this long (0: do not wait); a run that started
#                       on a busy machine is flagged in the table
#   PG_EXTRA_CONF="name=value ..."  extra postgres -c settings
#   RELAY_EXTRA_TOML='[relay]\nmax_in_flight = 1000000'  appended to the relay's config
#                       (\n becomes a newline; [sink] and [kafka] are already written)
set -euo pipefail
cd "$(dirname "$0")/.."

N1="${N1:-200000}"
TXN1="${TXN1:-10}"
N2="${N2:-1000000}"
N3="${N3:-$N1}"
SCENARIOS="${SCENARIOS:-small large backlog}"
SINKS="${SINKS:-stdout kafka}"
PAYLOAD_PAD="${PAYLOAD_PAD:-100}"
STATUS_INTERVAL_MS="${STATUS_INTERVAL_MS:-100}"
TIMEOUT_S="${TIMEOUT_S:-900}"
IDLE_MAX_BUSY="${IDLE_MAX_BUSY:-20}"
IDLE_WAIT_S="${IDLE_WAIT_S:-1800}"
PG_EXTRA_CONF="${PG_EXTRA_CONF:-}"
RELAY_EXTRA_TOML="${RELAY_EXTRA_TOML:-}"

log() { echo "bench: $*" >&2; }
die() { echo "bench: error: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------- binaries
log "building the relay (cargo build --release)"
cargo build --release --quiet
RELAY="$PWD/target/release/outbox-relay"

. deploy/lib.sh
BINDIR="$(find_pg_bindir)" \
    || die "no PostgreSQL server binaries (initdb, postgres); run ./deploy/dev-deps.sh"
command -v psql >/dev/null || die "psql not found; run ./deploy/dev-deps.sh"

KAFKA_VERSION=""
case " $SINKS " in
    *" kafka "*) [ -f "$(kafka_libs_dir)/kafka_2.13-$(kafka_version).jar" ] \
                     || die "Apache Kafka's jars not found; run ./deploy/dev-deps.sh (or set SINKS=stdout)"
                 KAFKA_VERSION="Apache Kafka $(kafka_version)" ;;
esac

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# ---------------------------------------------------------------------------- cleanup
WORK="$(mktemp -d /tmp/outbox-relay-bench.XXXXXX)"
AS_PG=()
if [ "$(id -u)" = 0 ]; then
    chown postgres: "$WORK"
    AS_PG=(runuser -u postgres --)
fi
PG_PID=""; POSTMASTER=""; RELAY_PID=""; KAFKA_PID=""
stop_relay() {
    if [ -n "$RELAY_PID" ]; then
        kill -TERM "$RELAY_PID" 2>/dev/null || true
        wait "$RELAY_PID" 2>/dev/null || true
        RELAY_PID=""
    fi
}
stop_kafka() {
    if [ -n "$KAFKA_PID" ]; then
        kill -KILL "$KAFKA_PID" 2>/dev/null || true
        wait "$KAFKA_PID" 2>/dev/null || true
        KAFKA_PID=""
    fi
}
cleanup() {
    stop_relay
    stop_kafka
    if [ -n "$PG_PID" ]; then
        if [ -z "$POSTMASTER" ] && [ -f "$WORK/data/postmaster.pid" ]; then
            POSTMASTER="$(head -n 1 "$WORK/data/postmaster.pid")"
        fi
        # Signal the postmaster itself: runuser does not pass SIGINT on. Fast shutdown.
        kill -INT "${POSTMASTER:-$PG_PID}" 2>/dev/null || true
        wait "$PG_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------- /proc helpers
HZ="$(getconf CLK_TCK)"
# utime+stime of a process, in clock ticks (fields 14 and 15; the comm field may hold
# spaces, so count from after its closing parenthesis). $2=all adds the waited-for
# children (cutime+cstime): the postmaster reaps its exited backends.
proc_ticks() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 0; return; }
    stat="${stat##*) }"
    # shellcheck disable=SC2086
    set -- $stat "${2:-}"
    # after the comm field: $1=state ... $12=utime $13=stime $14=cutime $15=cstime
    if [ "${!#}" = all ]; then echo $(( ${12} + ${13} + ${14} + ${15} )); else echo $(( ${12} + ${13} )); fi
}
# Every PostgreSQL process of our cluster: the postmaster with its reaped children,
# plus its live children.
pg_ticks() {
    local total child
    total="$(proc_ticks "$POSTMASTER" all)"
    for child in $(pgrep -P "$POSTMASTER" || true); do
        total=$(( total + $(proc_ticks "$child") ))
    done
    echo "$total"
}
# Busy ticks of the whole machine (user nice system irq softirq steal) from /proc/stat.
machine_ticks() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9; exit}' /proc/stat; }
machine_total_ticks() { awk '/^cpu /{s=0; for(i=2;i<=NF;i++) s+=$i; print s; exit}' /proc/stat; }
peak_rss_kib() { awk '/^VmHWM:/{print $2}' "/proc/$1/status"; }
# Percent of all CPUs busy over $1 seconds.
cpu_busy_pct() {
    local b0 t0 b1 t1
    b0="$(machine_ticks)"; t0="$(machine_total_ticks)"
    sleep "$1"
    b1="$(machine_ticks)"; t1="$(machine_total_ticks)"
    awk -v b="$((b1 - b0))" -v t="$((t1 - t0))" 'BEGIN{printf "%.0f", (t > 0 ? 100 * b / t : 0)}'
}
now() { date +%s.%N; }
fmt() { awk -v x="$1" -v p="${2:-1}" 'BEGIN{printf "%.*f", p, x}'; }
ticks_s() { awk -v t="$1" -v hz="$HZ" 'BEGIN{printf "%.2f", t / hz}'; }

# Wait until the machine is quiet; echo the busy percentage last seen.
wait_quiet() {
    local waited=0 busy
    busy="$(cpu_busy_pct 3)"
    while [ "$busy" -gt "$IDLE_MAX_BUSY" ] && [ "$waited" -lt "$IDLE_WAIT_S" ]; do
        log "machine is ${busy}% busy (limit ${IDLE_MAX_BUSY}%); waiting ($(cut -d' ' -f1-3 /proc/loadavg) load)"
        sleep 27; waited=$((waited + 30))
        busy="$(cpu_busy_pct 3)"
    done
    echo "$busy"
}

# ---------------------------------------------------------------------------- PostgreSQL
PG_PORT="$(free_port)"
log "starting PostgreSQL ($("$BINDIR/postgres" --version)) on 127.0.0.1:$PG_PORT in $WORK"
"${AS_PG[@]}" "$BINDIR/initdb" -D "$WORK/data" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
PG_CONF=(-c listen_addresses=127.0.0.1 -c unix_socket_directories="$WORK"
         -c wal_level=logical -c max_wal_senders=4 -c max_replication_slots=4
         -c fsync=off -c max_wal_size=4GB -c autovacuum=off)
for setting in $PG_EXTRA_CONF; do PG_CONF+=(-c "$setting"); done
"${AS_PG[@]}" "$BINDIR/postgres" -D "$WORK/data" -p "$PG_PORT" "${PG_CONF[@]}" \
    >"$WORK/postgres.log" 2>&1 &
PG_PID=$!
psql_() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres "$@"; }
for _ in $(seq 300); do psql_ -c 'select 1' postgres >/dev/null 2>&1 && break; sleep 0.1; done
psql_ -c 'select 1' postgres >/dev/null || { cat "$WORK/postgres.log" >&2; die "PostgreSQL did not start"; }
POSTMASTER="$(head -n 1 "$WORK/data/postmaster.pid")"
PG_VERSION="$(psql_ -tAc 'show server_version' postgres)"

psql_ postgres -c "CREATE DATABASE bench"
psql_ bench -f sql/outbox.sql
psql_ bench <<'SQL'
-- Inserts `total` events in transactions of `per_txn`, committing each (a procedure, so
-- one session does it all). Times come from the server's clock (the same clock as this
-- script's), the target LSN is pg_current_wal_lsn() right after the last commit.
CREATE PROCEDURE bench_insert(total bigint, per_txn bigint, pad int,
                              INOUT t_start float8 DEFAULT NULL, INOUT t_first float8 DEFAULT NULL,
                              INOUT t_last float8 DEFAULT NULL, INOUT target pg_lsn DEFAULT NULL)
LANGUAGE plpgsql AS $$
DECLARE
    done bigint := 0;
BEGIN
    t_start := extract(epoch FROM clock_timestamp());
    WHILE done < total LOOP
        INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload)
        SELECT 'order', 'order-' || g, 'OrderCreated',
               jsonb_build_object('order', g, 'customer', 'customer-' || (g % 1000),
                                  'total', (g % 1000) * 1.5, 'note', repeat('x', pad))
        FROM generate_series(done + 1, least(done + per_txn, total)) AS g;
        COMMIT;
        IF t_first IS NULL THEN
            t_first := extract(epoch FROM clock_timestamp());
        END IF;
        done := done + per_txn;
    END LOOP;
    t_last := extract(epoch FROM clock_timestamp());
    target := pg_current_wal_lsn();
END $$;

-- Polls the slot every 100 ms until its confirmed_flush_lsn reaches `target`; returns
-- the time it did.
CREATE FUNCTION bench_wait(slot text, target pg_lsn, timeout_s float8) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => timeout_s);
    flushed pg_lsn;
BEGIN
    LOOP
        SELECT confirmed_flush_lsn INTO flushed FROM pg_replication_slots WHERE slot_name = slot;
        IF flushed >= target THEN
            RETURN extract(epoch FROM clock_timestamp());
        END IF;
        IF clock_timestamp() > deadline THEN
            RAISE EXCEPTION 'slot % at % has not reached % after % s', slot, flushed, target, timeout_s;
        END IF;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;

-- Waits until the slot's restart_lsn reaches `since` (false after timeout_s): from
-- there a new walsender has no older WAL to decode again.
CREATE FUNCTION bench_settle(slot text, since pg_lsn, timeout_s float8) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    deadline timestamptz := clock_timestamp() + make_interval(secs => timeout_s);
BEGIN
    WHILE clock_timestamp() < deadline LOOP
        IF (SELECT restart_lsn >= since FROM pg_replication_slots WHERE slot_name = slot) THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.1);
    END LOOP;
    RETURN false;
END $$;
SQL

# ---------------------------------------------------------------------------- kafka, relay
start_kafka() { # a fresh single-node KRaft broker per scenario (deploy/lib.sh)
    KAFKA_PORT="$(free_port)"
    rm -rf "$WORK/kafka"
    start_kafka_broker "$WORK/kafka" "$KAFKA_PORT" "$(free_port)" || die "kafka did not start"
}

start_relay() { # $1 = sink
    {
        echo "[postgres]"
        echo "url = \"postgres://postgres@127.0.0.1:$PG_PORT/bench\""
        echo "slot = \"bench\""
        echo "publication = \"bench\""
        echo "status_interval_ms = $STATUS_INTERVAL_MS"
        echo "[outbox]"
        echo "table = \"public.outbox\""
        echo "[sink]"
        echo "type = \"$1\""
        if [ "$1" = kafka ]; then
            echo "[kafka]"
            echo "brokers = \"127.0.0.1:$KAFKA_PORT\""
        fi
        if [ -n "$RELAY_EXTRA_TOML" ]; then printf '%b\n' "$RELAY_EXTRA_TOML"; fi
    } >"$WORK/relay.toml"
    : >"$WORK/relay.log"
    NO_COLOR=1 RUST_LOG=info "$RELAY" run --config "$WORK/relay.toml" >/dev/null 2>"$WORK/relay.log" &
    RELAY_PID=$!
    for _ in $(seq 600); do
        grep -q "starting replication" "$WORK/relay.log" && break
        kill -0 "$RELAY_PID" 2>/dev/null || { cat "$WORK/relay.log" >&2; die "the relay exited"; }
        sleep 0.1
    done
    grep -q "starting replication" "$WORK/relay.log" || { cat "$WORK/relay.log" >&2; die "the relay did not start replicating"; }
    # The walsender serving the relay.
    WALSENDER=""
    for _ in $(seq 100); do
        WALSENDER="$(psql_ bench -tAc "select active_pid from pg_replication_slots where slot_name = 'bench'")"
        [ -n "$WALSENDER" ] && break
        sleep 0.1
    done
    [ -n "$WALSENDER" ] || die "no walsender is serving slot bench"
}

# ---------------------------------------------------------------------------- scenarios
ROWS=()
NOTES=()
PAYLOAD_BYTES=""
run_scenario() { # $1 = small|large|backlog, $2 = sink
    local name="$1" sink="$2" events per_txn label backlog=0
    case "$name" in
        small) events="$N1"; per_txn="$TXN1"; label="small: $N1 events, txns of $TXN1" ;;
        large) events="$N2"; per_txn="$N2"; label="large: $N2 events, 1 txn" ;;
        backlog) events="$N3"; per_txn="$TXN1"; backlog=1
                 label="backlog: $N3 events, txns of $TXN1, relay started after" ;;
        *) die "unknown scenario $name (small, large, backlog)" ;;
    esac
    if [ "$sink" = kafka ]; then start_kafka; fi
    start_relay "$sink"
    # Start from a clean slate: an empty table, and a slot whose restart_lsn is past
    # the earlier scenarios' WAL (a CHECKPOINT logs the running-transactions record the
    # slot needs to move it), so no walsender decodes old WAL again.
    local since
    since="$(psql_ bench -tAc "TRUNCATE public.outbox; select pg_current_wal_lsn()")"
    psql_ bench -c "CHECKPOINT"
    if [ "$(psql_ bench -tAc "select bench_settle('bench', '$since', 30)")" != t ]; then
        NOTES+=("$name/$sink: the slot's restart_lsn did not reach $since before the scenario")
    fi
    if [ "$backlog" = 1 ]; then stop_relay; fi
    local busy
    busy="$(wait_quiet)"
    log "scenario $label -> $sink: machine ${busy}% busy before it, load $(cut -d' ' -f1-3 /proc/loadavg)"

    local relay0=0 wal0=0 pg0 kafka0=0 mach0
    if [ "$backlog" = 0 ]; then
        relay0="$(proc_ticks "$RELAY_PID")"; wal0="$(proc_ticks "$WALSENDER")"
        pg0="$(pg_ticks)"; mach0="$(machine_ticks)"
        if [ -n "$KAFKA_PID" ]; then kafka0="$(proc_ticks "$KAFKA_PID")"; fi
    fi

    local result t_start t_first t_last target t_window t_done
    result="$(psql_ bench -tA -F ' ' -c "CALL bench_insert($events, $per_txn, $PAYLOAD_PAD)")"
    read -r t_start t_first t_last target <<<"$result"
    local wal_mid=0
    if [ "$backlog" = 0 ]; then wal_mid="$(proc_ticks "$WALSENDER")"; fi
    log "  inserted in $(fmt "$(awk -v a="$t_start" -v b="$t_last" 'BEGIN{print b-a}')" 2) s; waiting for the slot to pass $target"
    t_window="$t_first"
    if [ "$backlog" = 1 ]; then
        sleep 0.5 # let the postmaster reap the inserting backend: its CPU is not ours
        # The window opens when the relay process is started (its CPU counts from 0, and
        # its walsender is a new process).
        pg0="$(pg_ticks)"; mach0="$(machine_ticks)"
        if [ -n "$KAFKA_PID" ]; then kafka0="$(proc_ticks "$KAFKA_PID")"; fi
        t_window="$(now)"
        start_relay "$sink"
    fi
    t_done="$(psql_ bench -tAc "select bench_wait('bench', '$target', $TIMEOUT_S)")"

    local relay1 wal1 pg1 kafka1=0 mach1 rss kafka_rss=""
    sleep 0.3 # let the postmaster reap the exited backends (their CPU counts once reaped)
    relay1="$(proc_ticks "$RELAY_PID")"; wal1="$(proc_ticks "$WALSENDER")"; pg1="$(pg_ticks)"
    if [ -n "$KAFKA_PID" ]; then kafka1="$(proc_ticks "$KAFKA_PID")"; kafka_rss="$(peak_rss_kib "$KAFKA_PID")"; fi
    mach1="$(machine_ticks)"
    rss="$(peak_rss_kib "$RELAY_PID")"

    [ -n "$PAYLOAD_BYTES" ] || PAYLOAD_BYTES="$(psql_ bench -tAc "select octet_length(payload::text) from public.outbox limit 1")"

    stop_relay
    local seen warnings
    seen="$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/relay.log" | grep ' stopped' | sed -n 's/.*events=\([0-9]*\).*/\1/p' | tail -n 1)"
    warnings="$(grep -cE ' (WARN|ERROR) ' "$WORK/relay.log" || true)"
    stop_kafka
    if [ "$seen" != "$events" ]; then
        NOTES+=("$name/$sink: the relay reported events=${seen:-?} at shutdown, expected $events")
    fi
    if [ "$warnings" != 0 ]; then
        NOTES+=("$name/$sink: the relay logged $warnings WARN/ERROR lines: $(grep -E ' (WARN|ERROR) ' "$WORK/relay.log" | head -n 3 | tr '\n' ' ')")
    fi
    if [ "$busy" -gt "$IDLE_MAX_BUSY" ]; then
        NOTES+=("$name/$sink: started while the machine was ${busy}% busy (limit ${IDLE_MAX_BUSY}%): not a quiet measurement")
    fi

    local ours=$(( (relay1 - relay0) + (pg1 - pg0) + (kafka1 - kafka0) ))
    local other=$(( mach1 - mach0 - ours ))
    [ "$other" -lt 0 ] && other=0
    ROWS+=("$(awk -v label="$label" -v sink="$sink" -v n="$events" \
        -v ts="$t_start" -v tw="$t_window" -v tl="$t_last" -v td="$t_done" -v backlog="$backlog" \
        -v relay="$((relay1 - relay0))" -v wal="$((wal1 - wal0))" -v wal_after="$((wal1 - wal_mid))" -v pg="$((pg1 - pg0))" \
        -v kafka="$((kafka1 - kafka0))" -v other="$other" -v rss="$rss" -v trss="$kafka_rss" -v hz="$HZ" '
        BEGIN {
            ins = tl - ts; rel = td - tw; lag = (backlog ? "–" : sprintf("%.1f s", td - tl));
            walsender = backlog ? sprintf("%.1f s", wal / hz) : sprintf("%.1f s (%.1f s after)", wal / hz, wal_after / hz);
            broker = (sink == "kafka") ? sprintf("%.1f s / %.0f MiB", kafka / hz, trss / 1024) : "–";
            printf "| %s | %s | %.1f s (%.0f/s) | %.1f s | **%.0f/s** | %s | %.1f s | **%.1f s** | **%.1f MiB** | %s | %.1f s | %s | %.1f s |",
                label, sink, ins, n / ins, rel, n / rel, lag,
                relay / hz, relay / hz / (n / 1e6), rss / 1024,
                walsender, (pg - wal) / hz, broker, other / hz
        }')")
    log "  ${ROWS[-1]}"
}

# Create the slot and the publication once, so that every scenario (the backlog one
# included) finds them.
start_relay stdout
stop_relay

START_BUSY="$(cpu_busy_pct 3)"
START_LOAD="$(cut -d' ' -f1-3 /proc/loadavg)"
for sink in $SINKS; do
    for scenario in $SCENARIOS; do
        run_scenario "$scenario" "$sink"
    done
done

# ---------------------------------------------------------------------------- results
echo "## outbox-relay benchmark, $(date -u +'%Y-%m-%d %H:%M UTC')"
echo
echo "relay $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || echo ' (+ uncommitted changes in src/)'),"\
     "PostgreSQL $PG_VERSION (fsync=off, autovacuum=off, logical_decoding_work_mem default),${KAFKA_VERSION:+ $KAFKA_VERSION (single-node KRaft);}"\
     "$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"\
     "$(awk '/^MemTotal:/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM;"\
     "payload ${PAYLOAD_BYTES} bytes of JSON; relay status_interval_ms=$STATUS_INTERVAL_MS${RELAY_EXTRA_TOML:+, $(printf '%b' "$RELAY_EXTRA_TOML" | tr '\n' ' ')}, other settings default."
echo "Machine before the run: ${START_BUSY}% CPU busy, load average $START_LOAD."
echo
echo "| scenario | sink | insert (rate) | relay time | relay throughput | lag after last commit | relay CPU | relay CPU / 1M events | relay peak RSS | walsender CPU (after last commit) | other PostgreSQL CPU | broker CPU / peak RSS | other processes' CPU |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
if [ "${#NOTES[@]}" -gt 0 ]; then
    echo
    printf -- '- %s\n' "${NOTES[@]}"
fi
