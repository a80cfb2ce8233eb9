"""How the platform's topics are replicated, and its producers' acks (no broker needed:
the 3-broker scenario is ``tests/faults/test_clusters.py``, ``--long``)."""

from __future__ import annotations

import logging

import pytest

from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, ConfigError
from asynctier.platform.kafka import (
    Replication,
    producer_config,
    replication_for,
    topic_replication,
)

MIN2 = {"min.insync.replicas": "2"}


@pytest.mark.parametrize(("brokers", "wanted", "expected"), [
    (3, Replication(), (3, MIN2)),
    (5, Replication(), (3, MIN2)),
    (2, Replication(), (-1, {})),  # below 3 brokers: the broker's own default
    (1, Replication(), (-1, {})),
    (3, Replication(factor=2), (2, {})),
    (5, Replication(factor=5), (5, MIN2)),
    (3, Replication(factor=3, min_insync=3), (3, {"min.insync.replicas": "3"})),
    (3, Replication(min_insync=1), (3, {"min.insync.replicas": "1"})),
])
def test_replication_follows_the_broker_count_unless_set(
        brokers: int, wanted: Replication, expected: tuple[int, dict[str, str]]) -> None:
    assert replication_for(brokers, wanted) == expected


def test_an_impossible_replication_names_the_setting_to_fix() -> None:
    with pytest.raises(AsynctierError, match="topic_replication_factor 3 is more than the 1"):
        replication_for(1, Replication(factor=3))
    with pytest.raises(AsynctierError, match="ASYNCTIER_TOPIC_MIN_INSYNC_REPLICAS"):
        replication_for(3, Replication(factor=2, min_insync=3))


def test_replication_is_read_from_the_file_and_the_environment() -> None:
    settings = Settings.from_mapping({"asynctier": {"topic_replication_factor": 3,
                                                    "topic_min_insync_replicas": 2}})
    assert topic_replication(settings) == Replication(3, 2)
    over = settings.from_env({"ASYNCTIER_TOPIC_MIN_INSYNC_REPLICAS": "1"})
    assert topic_replication(over) == Replication(3, 1)
    assert topic_replication(Settings()) == Replication(0, 0)
    with pytest.raises(ConfigError, match="ASYNCTIER_TOPIC_REPLICATION_FACTOR"):
        Settings().from_env({"ASYNCTIER_TOPIC_REPLICATION_FACTOR": "three"})


def test_hand_off_and_dead_letter_producers_always_use_acks_all(
        caplog: pytest.LogCaptureFixture) -> None:
    assert producer_config(Settings())["acks"] == "all"
    loose = Settings(kafka={"bootstrap.servers": "127.0.0.1:9", "acks": "1"})
    with caplog.at_level(logging.WARNING):
        assert producer_config(loose)["acks"] == "all"
    assert "acks=1 is ignored" in caplog.text
    assert producer_config(loose)["enable.idempotence"] is True
