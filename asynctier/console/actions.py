"""The console's actions (POST): each is the library call the CLI makes, behind the login,
the CSRF check and the read-only switch (:func:`~asynctier.console.security.check_action`),
and each writes an audit line."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from asynctier.console import params
from asynctier.console.security import audit, check_action, log_in, same_secret
from asynctier.console.state import Console, console_of, render
from asynctier.delay_streams.dlq import LetterFilter, ReplayOptions
from asynctier.delay_streams.dlq import purge_dead_letters as dlq_purge
from asynctier.platform.paused import set_paused
from asynctier.queue.admin import replay_at_rate

#: A bulk action needs this field set: the page asks before it touches many records.
CONFIRM = "confirm"


async def login(request: Request) -> Response:
    """GET: the form. POST: check the token, start the session."""
    options = console_of(request).options
    if request.method == "GET":
        return render(request, "login.html", problem="")
    form = await request.form()
    given = str(form.get("token") or "")
    if options.token and given and same_secret(given, options.token):
        log_in(request, "operator")
        return RedirectResponse("/", status_code=303)
    return render(request, "login.html", status_code=401,
                  problem="that is not the console's token")


async def logout(request: Request) -> Response:
    """End the session."""
    request.session.clear()
    return RedirectResponse("/login", status_code=303)


async def replay_dead_letters(request: Request) -> Response:
    """Replay the chosen dead letters, or every one matching a filter (confirmed), in the
    background at the rate given, with its canary and auto-stop."""
    console = console_of(request)
    await check_action(request, console.options)
    name = params.binding_name(request.path_params["name"])
    form = await request.form()
    fields = {k: str(v) for k, v in form.items()}
    chosen = params.offsets([str(v) for v in form.getlist("offset")])
    if chosen:
        only, what = LetterFilter(offsets=chosen), f"{len(chosen)} chosen dead letter(s)"
    else:
        if fields.get(CONFIRM) != "yes":
            raise params.bad(CONFIRM, "replaying every dead letter that matches a filter "
                                      "touches many records: tick the confirmation")
        only = LetterFilter(reason=params.text(fields, "reason"),
                            error=params.text(fields, "error"),
                            since_ms=params.moment(fields, "since"),
                            until_ms=params.moment(fields, "until"))
        what = "every dead letter matching the filter" if only.selective \
            else "every dead letter not replayed yet"
    options = ReplayOptions(rate_per_s=params.number(fields, "rate", 0.001, 1_000_000),
                            limit=params.integer(fields, "limit", None, 1),
                            canary=params.integer(fields, "canary", 0, 0, 10_000) or 0,
                            only=only)
    job = console.jobs.replay_dead_letters(name, options, request.state.user,
                                           f"replay {what} of {name}")
    audit(request, "dlq replay", f"{name} ({what})", len(chosen))
    return RedirectResponse(f"/jobs#job-{job.id}", status_code=303)


async def purge_dead_letters(request: Request) -> Response:
    """Delete the dead letters a bulk replay has passed, or (confirmed) every one
    (``asynctier dlq purge [--all]``)."""
    console = console_of(request)
    await check_action(request, console.options)
    name = params.binding_name(request.path_params["name"])
    fields = {k: str(v) for k, v in (await request.form()).items()}
    everything = fields.get("scope") == "all"
    if everything and fields.get(CONFIRM) != "yes":
        raise params.bad(CONFIRM, "deleting every dead letter drops those never replayed "
                                  "too: tick the confirmation")
    done = await run_in_threadpool(dlq_purge, console.settings, name, everything)
    audit(request, "dlq purge", f"{name} ({'all' if everything else 'replayed'})",
          done.deleted)
    return render(request, "done.html", message=f"deleted {done.deleted} dead letter(s) of "
                  f"{name}; {done.kept} kept (from offset {done.first_kept})",
                  back=f"/dlq/{name}")


async def stop_job(request: Request) -> Response:
    """Stop a replay at its next batch."""
    console = console_of(request)
    await check_action(request, console.options)
    job_id = params.integer({"job": request.path_params["job"]}, "job", 0, 1) or 0
    job = console.jobs.get(job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    job.stop.set()
    audit(request, "stop job", str(job_id), 1)
    return RedirectResponse("/jobs", status_code=303)


async def _item_action(request: Request) -> tuple[Console, str, str, str]:
    """The checks of an action on one queue item, and (console, namespace, topic, id)."""
    console = console_of(request)
    await check_action(request, console.options)
    ns = params.namespace(request.path_params["namespace"])
    topic = params.topic(request.path_params["topic"])
    form = await request.form()
    item_id = params.text({k: str(v) for k, v in form.items()}, "id")
    if not item_id:
        raise params.bad("id", "give the item's id")
    return console, ns, topic, item_id


async def cancel_item(request: Request) -> Response:
    """Delete one queue item (``asynctier queue cancel``)."""
    console, ns, topic, item_id = await _item_action(request)
    gone = await run_in_threadpool(console.queue.cancel, ns, topic, item_id)
    audit(request, "queue cancel", f"{ns}/{topic}/{item_id}", int(gone))
    if not gone:
        raise HTTPException(404, f"no item {item_id!r} in {ns}/{topic}")
    return render(request, "done.html", message=f"cancelled item {item_id!r} of {ns}/{topic}",
                  back=f"/queue?namespace={ns}")


async def run_item_now(request: Request) -> Response:
    """Make a delayed queue item due now (``asynctier queue run-now``)."""
    console, ns, topic, item_id = await _item_action(request)
    done = await run_in_threadpool(console.queue.run_now, ns, topic, item_id)
    audit(request, "queue run-now", f"{ns}/{topic}/{item_id}", int(done))
    if not done:
        raise HTTPException(409, f"item {item_id!r} of {ns}/{topic} is not delayed: only a "
                                 "delayed item can be made due now")
    where = urlencode({"namespace": ns, "topic": topic, "id": item_id})
    return RedirectResponse(f"/queue/item?{where}", status_code=303)


async def replay_dead_items(request: Request) -> Response:
    """Put a topic's dead items back as ready (``asynctier queue replay``), confirmed."""
    console = console_of(request)
    await check_action(request, console.options)
    ns = params.namespace(request.path_params["namespace"])
    topic = params.topic(request.path_params["topic"])
    form = await request.form()
    fields = {k: str(v) for k, v in form.items()}
    if fields.get(CONFIRM) != "yes":
        raise params.bad(CONFIRM, "replaying dead items touches many: tick the confirmation")
    limit = params.integer(fields, "limit", None, 1)
    rate = params.number(fields, "rate", 0.001, 1_000_000)
    count = await run_in_threadpool(replay_at_rate, console.queue, ns, topic, limit, rate)
    audit(request, "queue replay", f"{ns}/{topic}", count)
    return render(request, "done.html", message=f"replayed {count} dead item(s) of {ns}/{topic}",
                  back=f"/queue?namespace={ns}")


async def pause_binding(request: Request) -> Response:
    """Pause a binding (its records wait in its source), or resume it: the path's last
    part says which. The same call as ``asynctier pause`` and ``resume``."""
    console = console_of(request)
    await check_action(request, console.options)
    name = params.binding_name(request.path_params["name"])
    if console.sampler.latest.view(name) is None:
        raise HTTPException(404, f"there is no binding named {name!r}")
    pausing = request.url.path.endswith("/pause")
    await run_in_threadpool(set_paused, console.settings, name, pausing,
                            f"console:{request.state.user}")
    audit(request, "pause" if pausing else "resume", name, 1)
    return RedirectResponse(f"/bindings/{name}", status_code=303)
