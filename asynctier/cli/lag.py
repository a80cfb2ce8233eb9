"""``asynctier lag``: committed offset, end offset, lag and lag in seconds per partition,
and beside them the backlog of each queue binding (ready, delayed, leased, dead items and
the oldest ready age, see :mod:`asynctier.queue.backlog`).

Read from the broker and the queue's shards alone (see :mod:`asynctier.platform.lag`), so
it works while the platform is down, like ``kafka-consumer-groups``. A queue shard that
does not answer makes its rows say so; the command still succeeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from asynctier.cli import settings_of
from asynctier.platform import metrics
from asynctier.platform.binding import Binding
from asynctier.platform.config import Settings
from asynctier.platform.errors import AsynctierError, BindingError
from asynctier.platform.lag import LagCollector, LagReader, LagRow, read_lag
from asynctier.platform.paused import PAUSED, read_paused
from asynctier.platform.registry import BindingRegistry, RegistryFollower
from asynctier.platform.status import binding_status, read_statuses
from asynctier.queue.backlog import (
    BacklogRow,
    QueueDepthCollector,
    open_queue,
    queue_bindings,
    read_backlog,
)
from asynctier.queue.shards import ShardedQueue
from asynctier.tailers.parking import ParkingLot


@dataclass(frozen=True)
class ParkedRow:
    """A ``--ordering key`` binding's parked keys (``error`` when Redis did not answer)."""

    name: str
    keys: int = 0
    heads: int = 0
    oldest_s: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The row for ``--json`` (kind ``parked``)."""
        return {"kind": "parked", "name": self.name, "parked_keys": self.keys,
                "heads_on_delay_path": self.heads, "oldest_parked_s": round(self.oldest_s, 3),
                "error": self.error}


def read_parked(settings: Settings, bindings: Sequence[Binding]) -> list[ParkedRow]:
    """The parked keys of every ``--ordering key`` binding among ``bindings``."""
    rows = []
    for binding in bindings:
        if binding.execution.ordering != "key":
            continue
        lot = ParkingLot.of(settings, binding.name)
        try:
            stats = lot.stats()
        except Exception as exc:  # Redis down: the row says so, the command goes on
            rows.append(ParkedRow(binding.name, error=f"Redis did not answer: {exc}"))
            continue
        finally:
            lot.redis.close()
        rows.append(ParkedRow(binding.name, stats.keys, stats.waiting_heads,
                              stats.oldest_age_s))
    return rows


def parked_table(rows: Sequence[ParkedRow]) -> Table:
    """The parked keys per ordered binding as a rich table."""
    table = Table(title="parked keys (--ordering key)", title_justify="left")
    for name in ("name", "parked keys", "on the delay path", "oldest parked"):
        table.add_column(name, justify="left" if name == "name" else "right")
    for row in rows:
        if row.error is not None:
            table.add_row(row.name, "unavailable", "-", "-", style="red")
            table.caption = row.error
            continue
        table.add_row(row.name, str(row.keys), str(row.heads),
                      format_age(row.oldest_s) if row.keys else "-",
                      style="yellow" if row.keys else None)
    return table


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


def backlog_table(rows: Sequence[BacklogRow]) -> Table:
    """The queue bindings' backlog as a rich table (a row whose shard is down says so)."""
    table = Table(title="queue backlog", title_justify="left")
    for name, justify in (("name", "left"), ("namespace", "left"), ("topic", "left"),
                          ("ready", "right"), ("delayed", "right"), ("leased", "right"),
                          ("dead", "right"), ("oldest ready", "right")):
        table.add_column(name, justify=justify,  # type: ignore[arg-type]
                         overflow="fold")
    errors: dict[str, str] = {}
    for row in rows:
        if row.error is not None:
            errors[row.shard] = row.error
            table.add_row(row.name, row.namespace, row.topic, "unavailable", "-", "-", "-",
                          "-", style="red")
            continue
        style = "red" if row.ready or row.dead else None
        table.add_row(row.name, row.namespace, row.topic, str(row.ready), str(row.delayed),
                      str(row.leased), str(row.dead),
                      format_age(row.oldest_ready_age_s) if row.ready else "-", style=style)
    if errors:
        table.caption = "\n".join(f"[red]{error}[/red]" for error in errors.values())
    return table


@dataclass
class Readers:
    """The broker reader, and the queue's shards once a queue binding needs them."""

    settings: Settings
    lag: LagReader
    queue: ShardedQueue | None = None

    def backlog(self, bindings: Sequence[Binding]) -> list[BacklogRow]:
        """The backlog rows of the queue bindings among ``bindings``."""
        wanted = queue_bindings(bindings)
        if not wanted:
            return []
        if self.queue is None:
            self.queue = open_queue(self.settings)
        return read_backlog(self.queue, wanted)

    def close(self) -> None:
        """Close the broker reader and the shards."""
        self.lag.close()
        if self.queue is not None:
            self.queue.close()


@dataclass(frozen=True)
class TailerRow:
    """The state of one binding's tailers (see :func:`binding_status`)."""

    name: str
    status: str

    def as_dict(self) -> dict[str, object]:
        """The row as JSON (``kind`` ``tailer``)."""
        return {"kind": "tailer", "name": self.name, "status": self.status}


def read_tailers(settings: Settings, bindings: Sequence[Binding]) -> list[TailerRow]:
    """Each binding's tailer state, as the tailer processes publish it in Redis."""
    if not bindings:
        return []
    statuses = read_statuses(settings)
    paused = read_paused(settings) if statuses is not None else {}
    return [TailerRow(b.name, PAUSED if b.name in paused
                      else binding_status(b.name, ladder_of(b), statuses))
            for b in sorted(bindings, key=lambda b: b.name)]


def ladder_of(binding: Binding) -> tuple[str, ...]:
    """The delay intervals a binding's retries go through (none for a queue binding)."""
    return binding.retries.ladder_names if binding.source.kind == "kafka" else ()


def tailer_table(rows: Sequence[TailerRow]) -> Table:
    """The bindings' tailer states (red unless running)."""
    table = Table("name", "tailer", title="tailers", title_justify="left")
    for row in rows:
        table.add_row(row.name, row.status,
                      style=None if row.status == "running" else "red")
    return table


@dataclass(frozen=True)
class Reading:
    """One read: the Kafka lag rows, the queue backlog rows, the parked keys and the
    tailers' states."""

    lag: list[LagRow]
    backlog: list[BacklogRow]
    parked: list[ParkedRow]
    tailers: list[TailerRow]
    #: The bindings read from the registry (all of them, even with one binding asked).
    bindings: dict[str, Binding] = field(default_factory=dict)

    def as_json(self) -> list[dict[str, object]]:
        """Every row, Kafka's, the queue's, the parked keys', then the tailers' (``kind``
        tells them apart)."""
        return ([r.as_dict() for r in self.lag] + [r.as_dict() for r in self.backlog]
                + [r.as_dict() for r in self.parked] + [r.as_dict() for r in self.tailers])


def read_all(settings: Settings, binding: str | None, readers: Readers) -> Reading:
    """Everything ``asynctier lag`` shows (of one binding, or of all): raises
    AsynctierError when the broker does not answer; a queue shard or Redis that does not
    answer makes its rows say so."""
    parts = readers.lag.topics()  # fails with a clear message when the broker does not answer
    has_bindings = settings.names.bindings_topic in parts
    bindings = BindingRegistry(settings).load() if has_bindings else {}
    if binding is not None and binding not in bindings:
        raise BindingError(f"binding: there is no binding named {binding!r} "
                           "(see `asynctier bindings`)")
    chosen = list(bindings.values()) if binding is None else [bindings[binding]]
    if binding is not None and bindings[binding].source.kind == "queue":
        lag_rows: list[LagRow] = []  # a queue binding has no partitions nor delay topics
    else:
        lag_rows = read_lag(settings, bindings.values(), binding, readers.lag, parts)
    return Reading(lag_rows, readers.backlog(chosen), read_parked(settings, chosen),
                   read_tailers(settings, chosen), bindings)


def tables(reading: Reading) -> Group:
    """The Kafka lag table (unless there are queue bindings only), and the queue backlog
    table when there are queue bindings."""
    parts: list[Table] = []
    if reading.lag or not reading.backlog:
        parts.append(lag_table(reading.lag))
    if reading.backlog:
        parts.append(backlog_table(reading.backlog))
    if reading.parked:
        parts.append(parked_table(reading.parked))
    if reading.tailers:
        parts.append(tailer_table(reading.tailers))
    return Group(*parts)


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
                   "(and the queue bindings' depth) on this port (0: a free one) until "
                   "stopped: a lag exporter that keeps working while the platform is down.")
@click.pass_context
def lag(ctx: click.Context, binding: str | None, as_json: bool, watch: bool,
        interval_s: float, metrics_port: int | None) -> None:
    """Committed offset, end offset, lag and age of the oldest unresolved record, per
    binding and partition; delay topics and dead letters as their own rows; and per queue
    binding its ready, delayed, leased and dead items and the oldest ready age."""
    settings = settings_of(ctx)
    if metrics_port is not None:
        _export(settings, metrics_port, interval_s)
        return
    readers = Readers(settings, LagReader(settings))
    try:
        if not watch:
            _show(read_all(settings, binding, readers), as_json, pretty=True)
        elif as_json:
            while True:
                try:
                    _show(read_all(settings, binding, readers), as_json, pretty=False)
                except AsynctierError as exc:  # the broker may come back: keep watching
                    click.echo(f"error: {exc}", err=True)
                time.sleep(interval_s)
        else:
            _watch_table(settings, binding, readers, interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        readers.close()


def _show(reading: Reading, as_json: bool, pretty: bool) -> None:
    if as_json:
        click.echo(json.dumps(reading.as_json(), indent=2 if pretty else None), nl=True)
    else:
        Console().print(tables(reading))


def _watch_table(settings: Settings, binding: str | None, readers: Readers,
                 interval_s: float) -> None:
    with Live(_table_or_error(settings, binding, readers), auto_refresh=False) as live:
        while True:
            time.sleep(interval_s)
            live.update(_table_or_error(settings, binding, readers), refresh=True)


def _table_or_error(settings: Settings, binding: str | None, readers: Readers) -> Group:
    try:
        return tables(read_all(settings, binding, readers))
    except AsynctierError as exc:  # the broker may come back: keep watching
        table = lag_table([])
        table.caption = f"[red]error: {exc}[/red] (retrying every few seconds)"
        return Group(table)


def _export(settings: Settings, port: int, interval_s: float) -> None:
    real = metrics.serve(port)
    click.echo(f"lag metrics on http://0.0.0.0:{real}/metrics (every {interval_s:g}s); "
               "Ctrl-C stops")
    follower = RegistryFollower(settings, lambda _bindings: None)
    follower.start()
    collector = LagCollector(settings, lambda: dict(follower.bindings), delay=True,
                             interval_s=interval_s)
    depth = QueueDepthCollector(settings, lambda: dict(follower.bindings),
                                interval_s=interval_s)
    collector.start()
    depth.start()
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        depth.stop()
        collector.stop()
        follower.stop()


COMMANDS = [lag]
