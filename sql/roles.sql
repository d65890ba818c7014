-- Roles for a production setup (run as a superuser; change the passwords).
--
-- The relay's role: LOGIN + REPLICATION to stream the WAL. To let the relay create its
-- publication itself it must own the outbox table and have CREATE on the database
-- (GRANT CREATE ON DATABASE app TO outbox_relay); otherwise create the publication
-- once as the owner:
--   CREATE PUBLICATION outbox_relay FOR TABLE public.outbox WITH (publish = 'insert');
CREATE ROLE outbox_relay LOGIN REPLICATION PASSWORD 'change-me';
GRANT SELECT ON public.outbox TO outbox_relay;
-- Two relay instances (one streams, one waits): when the streaming one's host vanishes,
-- the waiting one sees its walsender's reply_time stand still (pg_read_all_stats) and
-- ends it, instead of waiting for wal_sender_timeout. Ending a walsender of the same
-- role needs nothing more; instances under different roles also need pg_signal_backend.
GRANT pg_read_all_stats TO outbox_relay;

-- The relay's record of its slot: that it streamed from it, and its acknowledged
-- position, so a lost slot is never silently replaced (README, "Operating it"). The
-- relay creates this table itself when its role has CREATE on the schema; otherwise
-- create it here ([postgres] state_table names another place).
CREATE TABLE IF NOT EXISTS public.outbox_relay_state (
    slot_name         text PRIMARY KEY,
    system_identifier text,
    created_at        timestamptz,
    first_streamed_at timestamptz,
    acknowledged_lsn  pg_lsn,
    acknowledged_at   timestamptz,
    gap_accepted_at   timestamptz,
    gap_from_lsn      pg_lsn,
    gap_to_lsn        pg_lsn
);
GRANT SELECT, INSERT, UPDATE, DELETE ON public.outbox_relay_state TO outbox_relay;  -- DELETE: slot drop --forget

-- The application's role may only INSERT into the outbox: it can publish events but
-- never rewrite or delete history that consumers may not have seen.
CREATE ROLE app_writer LOGIN PASSWORD 'change-me';
GRANT INSERT ON public.outbox TO app_writer;
