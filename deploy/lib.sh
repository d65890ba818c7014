# Shared by deploy/dev-deps.sh, deploy/demo.sh and bench/run.sh (sourced, not run):
# where the PostgreSQL server binaries and the tansu broker are on this machine.

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

# The tansu binary: $TANSU_BIN, then PATH, then $CARGO_HOME/bin and ~/.cargo/bin (where
# `cargo install` puts it). Prints nothing and fails when there is none.
find_tansu() {
    local bin
    if [ -n "${TANSU_BIN:-}" ] && [ -x "$TANSU_BIN" ]; then echo "$TANSU_BIN"; return 0; fi
    command -v tansu 2>/dev/null && return 0
    for bin in "${CARGO_HOME:-$HOME/.cargo}/bin/tansu" "$HOME/.cargo/bin/tansu"; do
        if [ -x "$bin" ]; then echo "$bin"; return 0; fi
    done
    return 1
}
