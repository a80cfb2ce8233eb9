"""A dead-letter topic made before it took any record a scheduler can run (8 MB of
``max.message.bytes``) is raised to that size when its binding's topics are ensured: else a
record too large for a delay topic would find no place there either, and its binding would
wait behind it. Real Kafka."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from asynctier.delay_streams.topics import MAX_MESSAGE_BYTES, ensure_binding_topics
from asynctier.platform.binding import Binding
from asynctier.platform.binding_features import Retries, Source
from asynctier.platform.config import Settings
from asynctier.platform.kafka import (
    DLQ_MAX_MESSAGE_BYTES,
    admin,
    ensure_topics,
    raise_topic_minimums,
)
from tests.helpers import wait_until

LIMIT = "max.message.bytes"


def _limit(client: AdminClient, topic: str) -> int:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = client.describe_configs([resource], request_timeout=30)[resource].result()
    return int(entries[LIMIT].value)


def test_an_old_dead_letter_topic_is_raised_to_take_any_record(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="asynctier.platform.kafka")
    client = admin(settings)
    binding = Binding("old", Source("kafka", "old-source"), "tests.funcs.basic:noop",
                      retries=Retries(ladder_s=(1.0,)))
    dlq = settings.names.dlq_topic(binding.name)
    ensure_topics(client, {dlq: (1, {LIMIT: str(MAX_MESSAGE_BYTES)})})  # as it used to be
    assert _limit(client, dlq) == MAX_MESSAGE_BYTES

    created = ensure_binding_topics(settings, [binding])

    assert dlq not in created
    assert f"topic {dlq}: raised {LIMIT} from {MAX_MESSAGE_BYTES} to " \
           f"{DLQ_MAX_MESSAGE_BYTES}" in caplog.text
    # the broker that answers may show the change a moment after the controller took it
    wait_until(lambda: _limit(client, dlq) == DLQ_MAX_MESSAGE_BYTES, 15,
               "the dead-letter topic's limit was raised")
    assert raise_topic_minimums(client, {dlq: {LIMIT: DLQ_MAX_MESSAGE_BYTES}}) == []


def test_a_higher_limit_is_kept_and_a_topic_that_cannot_be_read_is_used_as_it_is(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    client = admin(settings)
    roomy = settings.names.dlq_topic("roomy")
    ensure_topics(client, {roomy: (1, {LIMIT: str(2 * DLQ_MAX_MESSAGE_BYTES)})})
    missing = settings.names.dlq_topic("never-made")

    changed = raise_topic_minimums(client, {roomy: {LIMIT: DLQ_MAX_MESSAGE_BYTES},
                                            missing: {LIMIT: DLQ_MAX_MESSAGE_BYTES}})

    assert changed == []
    assert _limit(client, roomy) == 2 * DLQ_MAX_MESSAGE_BYTES
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and missing in warned[0], warned
    assert (f"kafka-configs.sh --alter --entity-type topics --entity-name {missing} "
            f"--add-config {LIMIT}={DLQ_MAX_MESSAGE_BYTES}") in warned[0]
