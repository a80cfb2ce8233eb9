-- Schedules that target a Kafka topic (asynctier.schedules.relay): target 'kafka' names
-- the Kafka topic in `topic`; its ticks are enqueued to the namespace's outbox queue topic
-- and relayed to Kafka each once. 'queue': `topic` is the queue topic fed, as before.

ALTER TABLE asynctier_schedules ADD COLUMN target text NOT NULL DEFAULT 'queue';
