#!/usr/bin/env bash
# Sample events for docker-compose.yml, as deploy/demo.sh inserts them: two outbox rows
# per transaction, one transaction a second, as the application role app_writer of
# sql/roles.sql (INSERT only). Runs in the postgres image; PGHOST, PGUSER, PGPASSWORD and
# PGDATABASE come from the compose file. SAMPLE_EVENTS_SECONDS=0 (the default) keeps going.
set -euo pipefail
seconds="${SAMPLE_EVENTS_SECONDS:-0}"
psql_() { psql -X -q -v ON_ERROR_STOP=1 "$@"; }

# Rows committed before the relay's slot exists are not streamed: wait for the slot.
echo "sample-events: waiting for the relay's replication slot" >&2
until [ "$(psql_ -tAc "select count(*) from pg_replication_slots where slot_name = 'outbox_relay'" 2>/dev/null)" = 1 ]; do
    sleep 1
done

echo "sample-events: inserting two events a second" >&2
i=0
while [ "$seconds" = 0 ] || [ "$i" -lt "$seconds" ]; do
    i=$((i + 1))
    psql_ -c "
      BEGIN;
      INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
        VALUES ('order', 'order-$i', 'OrderCreated', jsonb_build_object('order', $i, 'total', $i * 9.5)),
               ('customer', 'customer-' || ($i % 3), 'CustomerSeen', jsonb_build_object('visits', $i));
      COMMIT;"
    sleep 1
done
