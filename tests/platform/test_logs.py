"""Log lines speak to the operator: the binding and the record's position on each line."""

from __future__ import annotations

import io
import json
import logging

import pytest

from asynctier.platform.logs import (
    JsonFormatter,
    RepeatFilter,
    TextFormatter,
    context_logger,
    position,
)


def _capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test.logs.{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, stream


def test_text_lines_end_with_binding_and_position() -> None:
    logger, stream = _capture(TextFormatter())
    log = context_logger(logger, binding="orders", topic="orders-in", partition=3)
    log.warning("function failed, retrying in %s", "30s", extra={"offset": 42})
    log.bind(attempt=2).info("retry")
    logger.info("no context")
    lines = stream.getvalue().splitlines()
    assert lines[0].endswith(
        f"WARNING {logger.name}: function failed, retrying in 30s "
        "[binding=orders at=orders-in/3@42]")
    assert lines[1].endswith("retry [binding=orders attempt=2 at=orders-in/3]")
    assert lines[2].endswith("no context")


def test_json_lines_carry_each_field() -> None:
    logger, stream = _capture(JsonFormatter())
    context_logger(logger, binding="orders").error("dead letter", extra=position("t", 1, 7))
    doc = json.loads(stream.getvalue())
    assert (doc["level"], doc["msg"], doc["binding"], doc["topic"], doc["partition"],
            doc["offset"]) == ("ERROR", "dead letter", "orders", "t", 1, 7)
    assert doc["ts"].endswith("Z")


def test_an_exception_stays_on_following_lines() -> None:
    logger, stream = _capture(TextFormatter())
    try:
        raise ValueError("boom")
    except ValueError:
        context_logger(logger, binding="b").exception("failed", extra=position("t", 0, 1))
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith("failed [binding=b at=t/0@1]")
    assert any("ValueError: boom" in line for line in rest)


@pytest.mark.parametrize("offset", [None, 5])
def test_position_without_offset(offset: int | None) -> None:
    logger, stream = _capture(JsonFormatter())
    logger.info("x", extra=position("t", 2, offset))
    assert json.loads(stream.getvalue())["offset"] == offset


def test_a_repeated_library_line_passes_once_a_minute_and_others_pass() -> None:
    now = [0.0]
    only = RepeatFilter(every_s=60.0, clock=lambda: now[0])

    def passes(msg: str) -> bool:
        return only.filter(logging.LogRecord("psycopg.pool", logging.WARNING, "", 0, msg,
                                             None, None))

    assert passes("error connecting in 'db': refused")
    now[0] = 59.0
    assert not passes("error connecting in 'db': refused")
    assert passes("error connecting in 'other': refused")
    now[0] = 60.0
    assert passes("error connecting in 'db': refused")
    assert not passes("error connecting in 'db': refused")
