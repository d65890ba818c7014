-- The outbox table in Debezium's default shape. The relay reads its inserts from the WAL;
-- nothing ever updates it, so rows can be deleted right away (even in the writing
-- transaction itself) without losing an event: the WAL already holds the insert.
CREATE TABLE IF NOT EXISTS public.outbox (
    id            uuid         PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregatetype varchar(255) NOT NULL,  -- routes the event: topic outbox.event.<aggregatetype>
    aggregateid   varchar(255) NOT NULL,  -- the aggregate's id (key_column = "aggregateid" keys by it)
    type          varchar(255) NOT NULL,  -- event type, e.g. OrderCreated
    payload       jsonb,                  -- the event body, written to Kafka as JSON
    created_at    timestamptz  NOT NULL DEFAULT now()
);
