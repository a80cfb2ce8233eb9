"""Progress bars for long work (``dlq replay``, ``demo``, bulk ``produce``).

:func:`progress` gives a rich :class:`~rich.progress.Progress` that draws on stderr (so
stdout stays clean for data and JSON) and stays silent when stderr is not a terminal
(CI, pipes, logs)::

    with progress() as bar:
        task = bar.add_task("replaying orders", total=len(records))
        for batch in batches:
            ...
            bar.advance(task, len(batch))
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class RateColumn(ProgressColumn):
    """Items per second (``1.2k/s``)."""

    def render(self, task: Task) -> Text:
        """The task's current speed."""
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text("-/s", style="progress.data.speed")
        shown = f"{speed / 1000:.1f}k" if speed >= 1000 else f"{speed:.0f}"
        return Text(f"{shown}/s", style="progress.data.speed")


def progress(console: Console | None = None, transient: bool = False,
             enabled: bool | None = None) -> Progress:
    """A Progress with description, bar, done/total, rate, elapsed and remaining time.

    Draws on ``console`` (default: stderr). ``enabled`` None means "when that console is
    a terminal"; a disabled Progress accepts every call and draws nothing.
    """
    out = console or Console(stderr=True)
    show = out.is_terminal if enabled is None else enabled
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(),
        console=out, transient=transient, disable=not show,
    )
