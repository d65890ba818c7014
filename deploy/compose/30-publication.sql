-- Run by the postgres image after sql/outbox.sql and sql/roles.sql (mounted as
-- 10-outbox.sql and 20-roles.sql into /docker-entrypoint-initdb.d), as the superuser.
-- The relay's role (outbox_relay) does not own the outbox, so it cannot create its
-- publication itself: the owner creates it once, as sql/roles.sql describes.
CREATE PUBLICATION outbox_relay FOR TABLE public.outbox WITH (publish = 'insert');
