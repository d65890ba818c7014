# Shared by .ci/pg-versions, .ci/test and .ci/run (sourced, after deploy/lib.sh).

# pg_version_jobs MAJOR: the tests whose outcome depends on the PostgreSQL version, one
# job per line: a test target of the root package, then the arguments for its test binary
# (name filters). .ci/pg-versions runs them with `cargo test`, .ci/test runs the binaries.
#   stdout_relay.rs, lost_slot.rs, partitioned_outbox.rs, outbox_changes.rs,
#   many_outboxes.rs (one publication and one watch query over several tables),
#   record_resume.rs (all of them: the slot rewinds after a crash on every version),
#   resilience.rs (slot, publication, promotion and timeline tests),
#   bad_input_config.rs (exhausted slots, a role without REPLICATION), check.rs,
#   admin_commands.rs and tls_postgres.rs (all of them: catalog queries and TLS),
#   takeover.rs (a waiting standby writes nothing; the takeover's catalog queries and
#   wait events, through the privileges test), messages.rs on 14 and later (pgoutput's
#   messages option; its PostgreSQL 13 test starts 13 itself), standby_decoding.rs on 16
#   and later (decoding on a standby; on an older suite major it starts 16 itself).
pg_version_jobs() {
    local major="$1" target
    for target in stdout_relay lost_slot partitioned_outbox outbox_changes many_outboxes record_resume check admin_commands tls_postgres; do
        echo "$target"
    done
    echo "resilience slot publication promotion timeline"
    echo "bad_input_config replication_slots role_without_replication"
    echo "takeover writes_nothing privileges"
    if [ "$major" -ge 14 ]; then echo "messages"; fi
    if [ "$major" -ge 16 ]; then echo "standby_decoding"; fi
}

# suite_pg_major: the major `cargo test --workspace` runs on ($PG_BINDIR, else the one the
# harness finds).
suite_pg_major() {
    pg_major "${PG_BINDIR:-$(find_pg_bindir)}"
}

# other_pg_majors: every major of PG_TEST_MAJORS but the suite's.
other_pg_majors() {
    local suite major
    suite="$(suite_pg_major)"
    for major in $PG_TEST_MAJORS; do
        if [ "$major" != "$suite" ]; then echo "$major"; fi
    done
}

# test_counts FILE...: "N passed, N failed" summed over the libtest "test result:" lines
# of FILE; nothing when there are none.
test_counts() {
    awk '/^test result:/ { seen = 1; for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
         END { if (seen) printf "%d passed, %d failed\n", p, f }' "$@"
}

# failure_summary FILE: why a job failed, in a few lines (the official CI shows only a
# part of the output, and five failed jobs must fit in it): the relays' distinct last
# words in FILE (an "error: ..." line when one exited on an error, 2 at most) and, for
# each panic (4 at most), where it was and the first two lines of its message, with an
# assert_eq!'s "left"/"right" on one more line; each line cut to 240 characters. Without
# a panic (a timeout, a script's error), the last 6 lines.
failure_summary() {
    if grep -q "panicked at" "$1"; then
        grep -E '^\[[a-z0-9_-]+\] error: ' "$1" | cut -c1-240 | awk '!seen[$0]++' | head -n 2
        awk 'function flush() {
                 if (lr != "") print substr(lr, 1, 240)
                 lr = ""; open = 0
             }
             /panicked at/ {
                 flush(); sub(/.*panicked at /, ""); loc = $0; first = 1; open = 1; panics++
                 next
             }
             open && first == 1 { if (panics <= 4) print substr("at " loc " " $0, 1, 240); first = 2; next }
             # The second line of a message that goes on (the chaos run lists its failures).
             open && first == 2 && !/^note: / && !/^stack backtrace:/ && !/^  left: / && !/^$/ {
                 if (panics <= 4) print substr("  " $0, 1, 240)
             }
             open && first == 2 { first = 0 }
             open && /^  left: / { lr = "left: " substr($0, 9) }
             open && /^ right: / { lr = lr "; right: " substr($0, 9) }
             open && (/^note: / || /^stack backtrace:/ || /^---- / || /^failures:$/) {
                 if (panics <= 4) flush(); else { lr = ""; open = 0 }
             }
             END { if (panics <= 4) flush() }' "$1"
    else
        tail -n 6 "$1" | cut -c1-240
    fi
}
