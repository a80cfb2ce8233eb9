"""The queue's pages (GET): counts by state per topic, one item, the dead items."""

from __future__ import annotations

import dataclasses
import time

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from asynctier.console import params
from asynctier.console.state import console_of, render
from asynctier.delay_streams.dlq import iso_ms, show_bytes
from asynctier.queue.items import LIVE_STATES
from asynctier.schedules.store import ScheduleStore

#: Dead items a page lists.
DEAD_PAGE = 100
#: Live items a browsed page lists, and the furthest it pages (an offset walks the index).
ITEMS_PAGE = 100
MAX_START = 100_000


async def queue(request: Request) -> Response:
    """Counts by state per topic of a namespace (items waiting for their parents among
    them), its schedules, and the form to find an item."""
    ns = params.namespace(request.query_params.get("namespace", "default"))
    console = console_of(request)
    try:
        counted_s, counts = await run_in_threadpool(console.queue_counts, ns)
        schedules = await run_in_threadpool(
            lambda: [s.doc() for s in ScheduleStore(console.queue).list(ns)])
    except Exception as exc:  # a shard down: the page says so
        return render(request, "queue.html", status_code=503, namespace=ns, counts=[],
                      schedules=[], problem=f"the queue did not answer: {exc}",
                      counted_s=0.0)
    return render(request, "queue.html", namespace=ns, counts=counts, schedules=schedules,
                  problem="", counted_s=counted_s, keep_s=console.options.sample_every_s)


async def item(request: Request) -> Response:
    """One item, in whichever state it is."""
    q = request.query_params
    ns = params.namespace(q.get("namespace", "default"))
    topic = params.topic(q.get("topic", ""))
    item_id = params.text(q, "id")
    if not item_id:
        raise params.bad("id", "give the item's id")
    info = await run_in_threadpool(console_of(request).queue.get, ns, topic, item_id)
    if info is None:
        raise HTTPException(404, f"no item {item_id!r} in {ns}/{topic}")
    doc = dataclasses.asdict(info)
    doc["payload"] = show_bytes(info.payload)[1]
    doc["headers"] = [(k, show_bytes(v)[1]) for k, v in info.headers]
    doc["enqueued"] = iso_ms(info.enqueued_ms)
    doc["released"] = iso_ms(info.released_ms) if info.released_ms else ""
    doc["due"] = iso_ms(info.deliver_after_ms) if info.deliver_after_ms else ""
    doc["trace"] = info.trace_id
    return render(request, "item.html", namespace=ns, topic=topic, doc=doc, info=info)


async def dead_items(request: Request) -> Response:
    """The dead items of a topic, oldest death first."""
    ns = params.namespace(request.path_params["namespace"])
    topic = params.topic(request.path_params["topic"])
    rows = await run_in_threadpool(console_of(request).queue.dead_items, ns, topic, DEAD_PAGE)
    items = [{"id": r.id, "attempts": r.attempts, "reason": r.reason, "error": r.error,
              "dead": iso_ms(r.dead_ms), "payload": show_bytes(r.payload)[1]} for r in rows]
    return render(request, "dead_items.html", namespace=ns, topic=topic, items=items,
                  now=time.time())


async def items(request: Request) -> Response:
    """A page of a topic's items in one state, as the lease takes them (priority first)."""
    ns = params.namespace(request.path_params["namespace"])
    topic = params.topic(request.path_params["topic"])
    state = request.query_params.get("state", "ready")
    if state not in LIVE_STATES:
        raise params.bad("state", f"give one of {', '.join(LIVE_STATES)}")
    start = params.integer(request.query_params, "start", 0, 0, MAX_START) or 0
    rows = await run_in_threadpool(console_of(request).queue.browse, ns, topic, state,
                                   ITEMS_PAGE, start)
    shown = [{"id": r.id, "priority": r.priority, "attempts": r.attempts,
              "enqueued": iso_ms(r.enqueued_ms),
              "due": iso_ms(r.deliver_after_ms) if r.deliver_after_ms else "",
              "owner": r.lease_owner or "", "payload": show_bytes(r.head)[1]} for r in rows]
    return render(request, "items.html", namespace=ns, topic=topic, state=state,
                  states=LIVE_STATES, items=shown, start=start, page=ITEMS_PAGE,
                  more=len(rows) == ITEMS_PAGE and start + ITEMS_PAGE <= MAX_START)
