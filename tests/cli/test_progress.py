"""The progress helper: draws on a terminal, stays quiet elsewhere."""

from __future__ import annotations

import io

from rich.console import Console

from asynctier.cli.progress import progress


def _run(console: Console, enabled: bool | None = None) -> None:
    with progress(console, enabled=enabled) as bar:
        task = bar.add_task("replaying", total=3)
        for _ in range(3):
            bar.advance(task)


def test_quiet_when_not_a_terminal() -> None:
    out = io.StringIO()
    _run(Console(file=out, force_terminal=False))
    assert out.getvalue() == ""


def test_draws_on_a_terminal() -> None:
    out = io.StringIO()
    _run(Console(file=out, force_terminal=True, width=100))
    text = out.getvalue()
    assert "replaying" in text and "3/3" in text


def test_can_be_forced_off() -> None:
    out = io.StringIO()
    _run(Console(file=out, force_terminal=True), enabled=False)
    assert out.getvalue() == ""
