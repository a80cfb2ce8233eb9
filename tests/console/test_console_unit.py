"""The console's pure pieces: options, parameter checks, samples and charts, the dead
letters' filter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.exceptions import HTTPException

from asynctier.console import params
from asynctier.console.history import History, Sample, polyline, rates
from asynctier.console.options import ConsoleOptions
from asynctier.delay_streams.dlq import DeadLetter, LetterFilter
from asynctier.platform import names as n
from asynctier.platform.errors import AsynctierError


def test_options_refuse_a_console_anyone_could_use() -> None:
    ConsoleOptions(token="x" * 16).check()
    ConsoleOptions(insecure_local=True).check()
    ConsoleOptions(listen="[::1]:8089", insecure_local=True).check()
    for options, says in ((ConsoleOptions(), "give a login token"),
                          (ConsoleOptions(token="short"), "at least 16"),
                          (ConsoleOptions(listen="0.0.0.0:8089", insecure_local=True),
                           "loopback only"),
                          (ConsoleOptions(listen="8089", token="x" * 16), "not host:port"),
                          (ConsoleOptions(token="x" * 16, sample_every_s=0.01), "sample")):
        with pytest.raises(AsynctierError, match=says):
            options.check()


@pytest.mark.parametrize(("query", "says"), [
    ({"n": "-1"}, "not a whole number"), ({"n": "1.5"}, "not a whole number"),
    ({"n": "٣"}, "not a whole number"), ({"n": "9" * 20}, "not a whole number"),
    ({"n": "5"}, "not from 6 to"),
])
def test_integer_refuses_what_is_not_a_whole_number_in_range(query: dict[str, str],
                                                              says: str) -> None:
    with pytest.raises(HTTPException, match=says) as refused:
        params.integer(query, "n", None, low=6)
    assert refused.value.status_code == 400


def test_parameters_take_good_values_and_refuse_bad_ones() -> None:
    assert params.integer({}, "n", 3) == 3 and params.integer({"n": "12"}, "n", None) == 12
    assert params.number({"r": "2.5"}, "r", 0.001, 10) == 2.5
    assert params.moment({"t": "1970-01-01T00:00:01"}, "t") == 1000
    assert params.offsets(["3", "1"]) == frozenset({1, 3})
    assert params.binding_name("orders-1") == "orders-1"
    for call in (lambda: params.number({"r": "inf"}, "r", 0, 10),
                 lambda: params.number({"r": "nan"}, "r", 0, 10),
                 lambda: params.text({"t": "a\x00b"}, "t"),
                 lambda: params.moment({"t": "soon"}, "t"),
                 lambda: params.offsets(["1"] * 1001),
                 lambda: params.binding_name("../etc"),
                 lambda: params.namespace("<b>"),
                 lambda: params.topic("..")):
        with pytest.raises(HTTPException) as refused:
            call()
        assert refused.value.status_code == 400


@given(st.lists(st.integers(0, 10**9), min_size=1, max_size=50))
def test_rates_are_never_negative_and_follow_the_committed_offsets(steps: list[int]) -> None:
    done, samples = 0, []
    for i, step in enumerate(steps):
        done += step
        samples.append(Sample(float(i), 0, 0.0, done))
    got = rates(samples)
    assert got[0] is None and got[1:] == [float(s) for s in steps[1:]]


def test_history_forgets_old_samples_and_gone_bindings() -> None:
    history = History(keep_s=10)
    for t in range(30):
        history.add("a", Sample(float(t), t, None, t * 2))
    assert history.of("a")[0].at_s == 19.0 and len(history.of("a")) == 11
    assert history.throughput("a") == 2.0
    history.forget_others({"b"})
    assert history.of("a") == [] and history.throughput("a") is None


def test_a_chart_spans_its_box_and_leaves_unknowns_out() -> None:
    points = polyline([0.0, None, 10.0], 100, 50).split()
    assert points == ["0.0,50.0", "100.0,0.0"]
    assert polyline([None, None], 100, 50) == "" and polyline([1.0], 100, 50) == ""


def _letter(offset: int, reason: str, error: str, at_ms: int) -> DeadLetter:
    return DeadLetter(offset, at_ms, None, None,
                      [(n.H_REASON, reason.encode()), (n.H_ERROR, error.encode())])


def test_the_filter_takes_what_matches_every_field_set() -> None:
    letter = _letter(4, "max_attempts", "ValueError: Boom", 5_000)
    assert not LetterFilter().selective and LetterFilter().matches(letter)
    assert LetterFilter(reason="max_attempts", error="boom", since_ms=5_000,
                        until_ms=5_001, offsets=frozenset({4})).matches(letter)
    for no in (LetterFilter(reason="expired"), LetterFilter(error="timeout"),
               LetterFilter(since_ms=5_001), LetterFilter(until_ms=5_000),
               LetterFilter(offsets=frozenset({3}))):
        assert no.selective and not no.matches(letter)


def test_the_command_refuses_to_serve_without_a_login() -> None:
    from click.testing import CliRunner

    from asynctier.cli import main

    env = {"ASYNCTIER_CONSOLE_TOKEN": "", "ASYNCTIER_CONFIG": ""}
    for args, says in ((["console"], "give a login token"),
                       (["console", "--insecure-local", "--listen", "0.0.0.0:8089"],
                        "loopback only"),
                       (["run", "console"], "give a login token")):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 2 and says in result.output, result.output
