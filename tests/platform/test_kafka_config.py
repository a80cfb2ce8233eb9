"""Client settings from the operator's ``[kafka]`` table: the tailers follow the group
protocol the operator chose (KIP-848's ``consumer`` leaves assignment and session to the
broker), and producers and admin clients never get consumer-only keys (librdkafka would
print a CONFWARN line for each on every client)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from asynctier.platform.config import Settings
from asynctier.platform.kafka import (
    PRODUCER_DEFAULTS,
    ConfirmingProducer,
    client_config,
    producer_config,
    tailer_consumer_config,
)

OPERATOR = {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "PLAINTEXT",
            "fetch.max.bytes": "2097152", "max.poll.interval.ms": "60000"}


def _tailer(kafka: dict[str, str]) -> dict[str, object]:
    return tailer_consumer_config(Settings(kafka=kafka), "g", session_timeout_ms=30_000,
                                  max_poll_interval_ms=300_000, fetch_wait_max_ms=50,
                                  queued_max_kbytes=2048)


def test_classic_groups_are_cooperative_sticky_with_our_session() -> None:
    conf = _tailer(OPERATOR)
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert conf["session.timeout.ms"] == 30_000
    assert conf["max.poll.interval.ms"] == "60000"  # the operator's value wins
    assert conf["enable.auto.commit"] is False and conf["group.id"] == "g"


def test_kip_848_groups_leave_assignment_and_session_to_the_broker() -> None:
    conf = _tailer({**OPERATOR, "group.protocol": "consumer"})
    assert conf["group.protocol"] == "consumer"
    assert "partition.assignment.strategy" not in conf and "session.timeout.ms" not in conf
    assert conf["enable.auto.commit"] is False and conf["fetch.max.bytes"] == "2097152"


def test_producers_and_admins_get_no_consumer_keys() -> None:
    conf = client_config(Settings(kafka={**OPERATOR, "group.protocol": "consumer",
                                         "session.timeout.ms": "6000"}), acks="all")
    assert conf == {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "PLAINTEXT",
                    "acks": "all"}


def test_the_operators_producer_settings_win_over_the_platforms_defaults() -> None:
    tuned = {**OPERATOR, "linger.ms": "50", "compression.type": "zstd",
             "delivery.report.only.error": "false"}
    conf = producer_config(Settings(kafka=tuned))
    assert conf["linger.ms"] == "50" and conf["compression.type"] == "zstd"
    assert conf["enable.idempotence"] is True  # a default the operator left alone
    assert conf["message.max.bytes"] == PRODUCER_DEFAULTS["message.max.bytes"]
    assert conf["delivery.report.only.error"] is True  # ours: no Python call per record
    assert "fetch.max.bytes" not in conf and "max.poll.interval.ms" not in conf


def test_a_hand_off_producer_prints_no_configuration_warning(
        capfd: pytest.CaptureFixture[str]) -> None:
    kafka = {**OPERATOR, "group.protocol": "consumer", "session.timeout.ms": "6000"}
    Producer(dict(kafka))  # the control: librdkafka does warn about these keys
    assert "CONFWARN" in capfd.readouterr().err
    ConfirmingProducer(Settings(kafka=kafka))
    assert "CONFWARN" not in capfd.readouterr().err


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_an_operators_assignment_strategy_cannot_break_the_tailers(
        protocol: str, caplog: pytest.LogCaptureFixture) -> None:
    """The tailers' rebalance callbacks are incremental: an eager strategy (``range``)
    would fail every assignment, and a KIP-848 group takes no strategy at all."""
    with caplog.at_level("WARNING"):
        conf = _tailer({**OPERATOR, "group.protocol": protocol,
                        "partition.assignment.strategy": "range"})
    assert conf.get("partition.assignment.strategy") == (
        "cooperative-sticky" if protocol == "classic" else None)
    assert "is not used by the tailers" in caplog.text


def test_a_dead_letter_topic_takes_any_record_a_scheduler_can_run() -> None:
    """A failing record too large for a delay topic goes to the dead-letter topic whole:
    that topic, and the hand-off producer, take a record as large as one submit call."""
    from asynctier.delay_streams.topics import MAX_MESSAGE_BYTES, dlq_topic_config
    from asynctier.platform.rpc import MAX_MESSAGE

    assert int(dlq_topic_config()["max.message.bytes"]) == MAX_MESSAGE > MAX_MESSAGE_BYTES
    assert PRODUCER_DEFAULTS["message.max.bytes"] > MAX_MESSAGE


def test_a_refused_client_certificate_names_the_certificate_settings() -> None:
    from confluent_kafka import KafkaError

    from asynctier.platform.kafka import credential_hint

    refused = KafkaError(KafkaError._TRANSPORT, "ssl://b:9093/bootstrap: Receive failed: "
                         "error:0A000412:SSL routines::ssl/tls alert bad certificate")
    hint = credential_hint(refused)
    assert "refused this client's certificate" in hint
    assert "ssl.certificate.location and ssl.key.location" in hint
    untrusted = KafkaError(KafkaError._SSL, "certificate verify failed")
    assert "ssl.ca.location" in credential_hint(untrusted)
    assert credential_hint(KafkaError(KafkaError._TRANSPORT, "Connection refused")) == ""


def test_sasl_credentials_come_from_the_environment() -> None:
    settings = Settings(kafka={"bootstrap.servers": "b:9092",
                               "security.protocol": "SASL_SSL"}).from_env(
        {"ASYNCTIER_KAFKA_SASL_USERNAME": "tailer", "ASYNCTIER_KAFKA_SASL_PASSWORD": "pw",
         "ASYNCTIER_KAFKA_BOOTSTRAP": "k:9093"})
    assert dict(settings.kafka) == {"bootstrap.servers": "k:9093",
                                    "security.protocol": "SASL_SSL",
                                    "sasl.username": "tailer", "sasl.password": "pw"}
