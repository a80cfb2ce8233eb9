"""The console's pages (GET): they read, never change anything."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from asynctier.console import params
from asynctier.console.history import polyline, rates
from asynctier.console.state import console_of, render
from asynctier.delay_streams.dlq import (
    DeadLetter,
    LetterFilter,
    dead_letter_span,
    iso_ms,
    list_dead_letters,
    show_bytes,
    show_dead_letter,
)
from asynctier.platform.binding import Binding
from asynctier.platform.errors import AsynctierError, DecodeError
from asynctier.platform.paused import read_paused
from asynctier.platform.payloads import decoder_for

#: Dead letters a page of the list reads (the filters apply to those).
DLQ_PAGE = 200


def overview(request: Request) -> Response:
    """Every binding and component."""
    return render(request, "overview.html")


def overview_live(request: Request) -> Response:
    """The overview's numbers, for the page to refresh without a reload."""
    return render(request, "_overview.html")


def _view(request: Request) -> Any:
    name = params.binding_name(request.path_params["name"])
    view = console_of(request).sampler.latest.view(name)
    if view is None:
        raise HTTPException(404, f"there is no binding named {name!r} (or the console has "
                                 "not read it yet: it reads every few seconds)")
    return view


def binding(request: Request) -> Response:
    """One binding: partitions, charts, ladder, settings, and whether it is paused (read
    now: the sampled state may be a few seconds old)."""
    context = _binding_context(request)
    pause = read_paused(console_of(request).settings).get(context["view"].name)
    since = iso_ms(pause.since_ms) if pause is not None and pause.since_ms else ""
    return render(request, "binding.html", pause=pause, paused_since=since, **context)


def binding_live(request: Request) -> Response:
    """The binding page's numbers."""
    return render(request, "_binding.html", **_binding_context(request))


def _binding_context(request: Request) -> dict[str, Any]:
    view = _view(request)
    samples = console_of(request).history.of(view.name)
    lags: list[float | None] = [float(s.lag) for s in samples]
    return {"view": view, "samples": samples,
            "lag_points": polyline(lags, 600, 120),
            "rate_points": polyline(rates(samples), 600, 120),
            "lag_top": max((s.lag for s in samples), default=0),
            "rate_top": max((r for r in rates(samples) if r is not None), default=0.0),
            "settings": _settings(view.binding)}


def _settings(binding: Binding) -> list[tuple[str, str]]:
    """Every setting of the binding, a group's as ``group.field`` (the schema text aside)."""
    rows = []
    for f in dataclasses.fields(binding):
        value = getattr(binding, f.name)
        if not dataclasses.is_dataclass(value):
            rows.append((f.name, str(value)))
            continue
        rows += [(f"{f.name}.{g.name}", str(getattr(value, g.name)))
                 for g in dataclasses.fields(value) if g.init and g.name != "schema"]
    return rows


def _filter(request: Request) -> LetterFilter:
    q = request.query_params
    return LetterFilter(reason=params.text(q, "reason"), error=params.text(q, "error"),
                        since_ms=params.moment(q, "since"), until_ms=params.moment(q, "until"))


async def dead_letters(request: Request) -> Response:
    """A page of a binding's dead letters, filtered."""
    name = params.binding_name(request.path_params["name"])
    q = request.query_params
    start = params.integer(q, "start", None)
    only = _filter(request)
    settings = console_of(request).settings
    try:
        low, high = await run_in_threadpool(dead_letter_span, settings, name, 5.0)
        first = low if start is None else min(max(start, low), high)
        letters = await run_in_threadpool(list_dead_letters, settings, name, DLQ_PAGE, 5.0,
                                          first, only)
    except AsynctierError as exc:
        return render(request, "dead_letters.html", status_code=404, name=name,
                      problem=str(exc), letters=[], only=only, low=0, high=0, first=0,
                      page=DLQ_PAGE)
    return render(request, "dead_letters.html", name=name, letters=letters, only=only,
                  low=low, high=high, first=first, page=DLQ_PAGE, problem="",
                  query={k: v for k, v in q.items() if k != "start"})


async def dead_letter(request: Request) -> Response:
    """One dead letter: headers, attempts, errors, the payload decoded."""
    name = params.binding_name(request.path_params["name"])
    offset = params.integer({"offset": request.path_params["offset"]}, "offset", 0) or 0
    console = console_of(request)
    try:
        letter = await run_in_threadpool(show_dead_letter, console.settings, name, offset, 5.0)
    except AsynctierError as exc:
        raise HTTPException(404, str(exc)) from exc
    view = console.sampler.latest.view(name)
    return render(request, "dead_letter.html", name=name, letter=letter,
                  doc=letter.detail(), decoded=_decoded(letter, view))


def _decoded(letter: DeadLetter, view: Any) -> str:
    """The value decoded by the binding's format, as indented JSON; '' when it does not
    decode (the page shows the raw value) or the binding is unknown."""
    if view is None:
        return ""
    try:
        value = decoder_for(view.binding)(letter.value)
    except (DecodeError, ValueError):
        return ""
    if isinstance(value, bytes):
        return show_bytes(value)[1] or ""
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


def jobs(request: Request) -> Response:
    """The replays the console started."""
    return render(request, "jobs.html", jobs=console_of(request).jobs.all())


def jobs_live(request: Request) -> Response:
    """The replays' progress."""
    return render(request, "_jobs.html", jobs=console_of(request).jobs.all())
