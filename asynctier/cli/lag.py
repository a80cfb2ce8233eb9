"""``asynctier lag``: committed offset, end offset, lag and lag in seconds per partition.

Read from the broker alone (see :mod:`asynctier.platform.lag`), so it works while the
platform is down, like ``kafka-consumer-groups``.
"""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.live import Live
from rich.table import Table

from asynctier.cli import settings_of
from asynctier.platform import metrics
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, BindingError
from asynctier.platform.lag import LagCollector, LagReader, LagRow, read_lag
from asynctier.platform.registry import BindingRegistry, RegistryFollower


def format_age(seconds: float | None) -> str:
    """A short age: ``0s``, ``850ms``, ``42s``, ``5m12s``, ``3h04m``, ``?`` when unknown."""
    if seconds is None:
        return "?"
    if seconds < 1:
        return "0s" if seconds == 0 else f"{int(seconds * 1000)}ms"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def lag_table(rows: list[LagRow]) -> Table:
    """The rows as a rich table."""
    table = Table(title="consumer lag", title_justify="left")
    for name, justify in (("kind", "left"), ("name", "left"), ("topic", "left"),
                          ("part", "right"), ("committed", "right"), ("end", "right"),
                          ("lag", "right"), ("oldest", "right")):
        table.add_column(name, justify=justify,  # type: ignore[arg-type]
                         overflow="fold")
    for row in rows:
        style = "red" if row.lag and row.kind != "dlq" else None
        table.add_row(row.kind, row.name, row.topic, str(row.partition),
                      "-" if row.committed is None else str(row.committed),
                      str(row.end), str(row.lag),
                      format_age(row.lag_seconds) if row.lag else "-", style=style)
    if not rows:
        table.caption = "no bindings (see `asynctier bindings`)"
    return table


def _rows(settings: Settings, binding: str | None, reader: LagReader) -> list[LagRow]:
    parts = reader.topics()  # fails with a clear message when the broker does not answer
    has_bindings = settings.names.bindings_topic in parts
    bindings = BindingRegistry(settings).load() if has_bindings else {}
    if binding is not None and binding not in bindings:
        raise BindingError(f"binding: there is no binding named {binding!r} "
                           "(see `asynctier bindings`)")
    return read_lag(settings, bindings.values(), binding, reader, parts)


@click.command("lag")
@click.option("--binding", "binding", metavar="NAME", help="Only this binding (and its "
              "delay steps and dead letters).")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of rows (one per line "
              "with --watch).")
@click.option("--watch", is_flag=True, help="Read again every --interval seconds.")
@click.option("--interval", "interval_s", type=float, default=2.0, show_default=True,
              help="Seconds between reads with --watch or --metrics-port.")
@click.option("--metrics-port", "metrics_port", type=int, default=None,
              envvar="ASYNCTIER_LAG_METRICS_PORT", metavar="PORT",
              help="Instead of printing, export the lag of every binding and delay topic "
                   "on this port (0: a free one) until stopped: a lag exporter that keeps "
                   "working while the platform is down.")
@click.pass_context
def lag(ctx: click.Context, binding: str | None, as_json: bool, watch: bool,
        interval_s: float, metrics_port: int | None) -> None:
    """Committed offset, end offset, lag and age of the oldest unresolved record, per
    binding and partition; delay topics and dead letters as their own rows."""
    settings = settings_of(ctx)
    if metrics_port is not None:
        _export(settings, metrics_port, interval_s)
        return
    reader = LagReader(settings)
    try:
        if not watch:
            _show(_rows(settings, binding, reader), as_json, pretty=True)
        elif as_json:
            while True:
                try:
                    _show(_rows(settings, binding, reader), as_json, pretty=False)
                except AsynctierError as exc:  # the broker may come back: keep watching
                    click.echo(f"error: {exc}", err=True)
                time.sleep(interval_s)
        else:
            _watch_table(settings, binding, reader, interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()


def _show(rows: list[LagRow], as_json: bool, pretty: bool) -> None:
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in rows], indent=2 if pretty else None),
                   nl=True)
    else:
        Console().print(lag_table(rows))


def _watch_table(settings: Settings, binding: str | None, reader: LagReader,
                 interval_s: float) -> None:
    with Live(_table_or_error(settings, binding, reader), auto_refresh=False) as live:
        while True:
            time.sleep(interval_s)
            live.update(_table_or_error(settings, binding, reader), refresh=True)


def _table_or_error(settings: Settings, binding: str | None, reader: LagReader) -> Table:
    try:
        return lag_table(_rows(settings, binding, reader))
    except AsynctierError as exc:  # the broker may come back: keep watching
        table = lag_table([])
        table.caption = f"[red]error: {exc}[/red] (retrying every few seconds)"
        return table


def _export(settings: Settings, port: int, interval_s: float) -> None:
    real = metrics.serve(port)
    click.echo(f"lag metrics on http://0.0.0.0:{real}/metrics (every {interval_s:g}s); "
               "Ctrl-C stops")
    follower = RegistryFollower(settings, lambda _bindings: None)
    follower.start()
    collector = LagCollector(settings, lambda: dict(follower.bindings), delay=True,
                             interval_s=interval_s)
    collector.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()
        follower.stop()


COMMANDS = [lag]
