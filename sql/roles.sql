-- Roles for a production setup (run as a superuser; change the passwords).
--
-- The relay's role: LOGIN + REPLICATION to stream the WAL. To let the relay create its
-- publication itself it must own the outbox table and have CREATE on the database
-- (GRANT CREATE ON DATABASE app TO outbox_relay); otherwise create the publication
-- once as the owner:
--   CREATE PUBLICATION outbox_relay FOR TABLE public.outbox WITH (publish = 'insert');
CREATE ROLE outbox_relay LOGIN REPLICATION PASSWORD 'change-me';
GRANT SELECT ON public.outbox TO outbox_relay;

-- The application's role may only INSERT into the outbox: it can publish events but
-- never rewrite or delete history that consumers may not have seen.
CREATE ROLE app_writer LOGIN PASSWORD 'change-me';
GRANT INSERT ON public.outbox TO app_writer;
