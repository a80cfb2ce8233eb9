"""The tenants page: weights, quotas and this minute's usage side by side, each binding's
rate and concurrency cap under its tenant, and their edits (``asynctier tenant set``,
``asynctier quota set``, the binding stored again as ``asynctier bind`` does)."""

from __future__ import annotations

from dataclasses import replace

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from asynctier.cli.quota import set_quota
from asynctier.cli.tenant import read_tenants, set_weight
from asynctier.console import params
from asynctier.console.security import audit, check_action
from asynctier.console.state import console_of, render
from asynctier.platform.errors import AsynctierError, BindingError
from asynctier.platform.registry import BindingRegistry
from asynctier.scheduler.queues import MAX_WEIGHT, MIN_WEIGHT

#: The largest quota the form takes (items per window).
MAX_QUOTA = 10**12
#: A binding's rate (records a second) and concurrency cap the form takes.
MIN_RATE, MAX_RATE = 0.001, 1_000_000.0
MAX_CONCURRENCY = 100_000


async def tenants(request: Request) -> Response:
    """Every tenant with a weight, a quota or usage, and each binding's rate and
    concurrency cap under its tenant."""
    console = console_of(request)
    limits = sorted(((v.binding.tenant, v.binding) for v in console.sampler.latest.bindings),
                    key=lambda pair: (pair[0], pair[1].name))
    try:
        rows = await run_in_threadpool(read_tenants, console.settings)
    except AsynctierError as exc:  # Redis down: the page says so
        return render(request, "tenants.html", status_code=503, rows=[], problem=str(exc),
                      low=MIN_WEIGHT, high=MAX_WEIGHT, limits=limits)
    return render(request, "tenants.html", rows=rows, problem="", low=MIN_WEIGHT,
                  high=MAX_WEIGHT, limits=limits)


async def edit_limits(request: Request) -> Response:
    """Set a binding's rate and concurrency cap (blank: none): the binding stored again,
    as ``asynctier bind`` stores it; its tailer restarts with it within seconds."""
    console = console_of(request)
    await check_action(request, console.options)
    fields = {k: str(v).strip() for k, v in (await request.form()).items()}
    name = params.binding_name(fields.get("binding", ""))
    rate = params.number(fields, "rate", MIN_RATE, MAX_RATE)
    cap = params.integer(fields, "concurrency", None, 1, MAX_CONCURRENCY)
    registry = BindingRegistry(console.settings)
    binding = (await run_in_threadpool(registry.load)).get(name)
    if binding is None:
        raise HTTPException(404, f"there is no binding named {name!r}")
    limits = replace(binding.limits, rate_per_s=rate,
                     burst=binding.limits.burst if rate else None, max_concurrency=cap)
    changed = binding.with_changes(limits=limits)
    try:
        await run_in_threadpool(registry.put, changed)
    except BindingError as exc:
        raise HTTPException(400, str(exc)) from exc
    audit(request, "binding limits", f"{name}: rate={rate}, concurrency={cap}", 1)
    return RedirectResponse("/tenants", status_code=303)


async def edit_weight(request: Request) -> Response:
    """Set one tenant's weight."""
    console = console_of(request)
    await check_action(request, console.options)
    fields = {k: str(v) for k, v in (await request.form()).items()}
    name = params.namespace(fields.get("tenant", ""))
    weight = params.number(fields, "weight", MIN_WEIGHT, MAX_WEIGHT)
    if weight is None:
        raise params.bad("weight", f"give a weight from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}")
    await run_in_threadpool(set_weight, console.settings, name, weight)
    audit(request, "tenant weight", f"{name}={weight:g}", 1)
    return RedirectResponse("/tenants", status_code=303)


async def edit_quota(request: Request) -> Response:
    """Replace one tenant's quota; both windows left blank lift it."""
    console = console_of(request)
    await check_action(request, console.options)
    fields = {k: str(v).strip() for k, v in (await request.form()).items()}
    name = params.namespace(fields.get("tenant", ""))
    per_minute = params.integer(fields, "per_minute", None, 1, MAX_QUOTA)
    per_day = params.integer(fields, "per_day", None, 1, MAX_QUOTA)
    stored = await run_in_threadpool(set_quota, console.settings, name, per_minute, per_day)
    said = ", ".join(f"{k}={v}" for k, v in stored.items() if v is not None)
    audit(request, "tenant quota", f"{name}: {said or 'no quota'}", 1)
    return RedirectResponse("/tenants", status_code=303)
