#!/usr/bin/env bash
# Seeds fuzz/corpus/<target>/ from the pgoutput fixtures (tests/fixtures/pgoutput/*.hex):
#   pgoutput_decode:   each fixture message as it is (one XLogData payload)
#   replication_frame: each message wrapped in an XLogData ('w') frame, plus keepalives ('k')
# Files are named by content hash, so running it again adds nothing twice. Only needed to
# start a corpus from scratch: the minimised corpus is committed.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
pg="$root/fuzz/corpus/pgoutput_decode"
frame="$root/fuzz/corpus/replication_frame"
mkdir -p "$pg" "$frame"

# put <dir> <hex>: write the bytes of <hex> to <dir>/<sha1 of the hex>
put() { echo "$2" | xxd -r -p > "$1/$(echo "$2" | sha1sum | cut -c1-16)"; }

send_time=$(printf '%016x' 757000000000000) # 2023-12-27, microseconds since 2000-01-01

grep -hv '^#' "$root"/tests/fixtures/pgoutput/*.hex |
  while read -r _tag lsn _xid hex; do
    IFS=/ read -r hi lo <<< "$lsn"
    wal_end=$(printf '%08x%08x' "0x$hi" "0x$lo")
    put "$pg" "$hex"
    # 'w', wal_start (0: not a progress marker), wal_end, send_time, payload
    put "$frame" "77$(printf '%016x' 0)$wal_end$send_time$hex"
  done

# 'k', wal_end, send_time, reply_requested
for keepalive in "6b${send_time}${send_time}00" "6b${send_time}${send_time}01" \
  "6b$(printf '%016x' 0)$(printf '%016x' 0)00" "6bffffffffffffffffffffffffffffffff02"; do
  put "$frame" "$keepalive"
done

echo "pgoutput_decode: $(ls "$pg" | wc -l) files, replication_frame: $(ls "$frame" | wc -l) files"
