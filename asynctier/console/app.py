"""The console's ASGI app (Starlette, Jinja2 pages) and its server (uvicorn)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from asynctier.console import actions, pages, queue_pages, tenants
from asynctier.console.history import History
from asynctier.console.jobs import Jobs
from asynctier.console.options import ConsoleOptions
from asynctier.console.security import LoginRequired
from asynctier.console.snapshot import Sampler
from asynctier.console.state import Console, render
from asynctier.delay_streams.dlq import iso_ms
from asynctier.platform.config import Settings

log = logging.getLogger(__name__)

ROUTES = [
    Route("/", pages.overview),
    Route("/live/overview", pages.overview_live),
    Route("/bindings/{name}", pages.binding),
    Route("/live/bindings/{name}", pages.binding_live),
    Route("/bindings/{name}/pause", actions.pause_binding, methods=["POST"]),
    Route("/bindings/{name}/resume", actions.pause_binding, methods=["POST"]),
    Route("/dlq/{name}", pages.dead_letters),
    Route("/dlq/{name}/{offset}", pages.dead_letter),
    Route("/dlq/{name}/replay", actions.replay_dead_letters, methods=["POST"]),
    Route("/dlq/{name}/purge", actions.purge_dead_letters, methods=["POST"]),
    Route("/jobs", pages.jobs),
    Route("/live/jobs", pages.jobs_live),
    Route("/jobs/{job}/stop", actions.stop_job, methods=["POST"]),
    Route("/queue", queue_pages.queue),
    Route("/queue/item", queue_pages.item),
    Route("/queue/{namespace}/{topic}/dead", queue_pages.dead_items),
    Route("/queue/{namespace}/{topic}/items", queue_pages.items),
    Route("/queue/{namespace}/{topic}/cancel", actions.cancel_item, methods=["POST"]),
    Route("/queue/{namespace}/{topic}/run-now", actions.run_item_now, methods=["POST"]),
    Route("/queue/{namespace}/{topic}/replay", actions.replay_dead_items, methods=["POST"]),
    Route("/tenants", tenants.tenants),
    Route("/tenants/weight", tenants.edit_weight, methods=["POST"]),
    Route("/tenants/quota", tenants.edit_quota, methods=["POST"]),
    Route("/tenants/limits", tenants.edit_limits, methods=["POST"]),
    Route("/login", actions.login, methods=["GET", "POST"]),
    Route("/logout", actions.logout, methods=["POST"]),
    Route("/healthz", lambda request: PlainTextResponse("ok")),
]


async def _refused(request: Request, exc: Exception) -> Response:
    """An HTTPException as a page (or JSON for a script and a live fragment)."""
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith("/live/") or "html" not in request.headers.get("accept", ""):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
    return render(request, "error.html", status_code=exc.status_code, problem=exc.detail)


def create_app(settings: Settings, options: ConsoleOptions, sample: bool = True) -> Starlette:
    """The console over ``settings``; ``sample``: read in the background from the start
    (a test may call ``app.state.console.sampler.sample`` itself)."""
    options.check()
    history = History(options.keep_samples_s)
    env = jinja2.Environment(loader=jinja2.PackageLoader("asynctier.console"),
                             autoescape=True)  # payloads and headers are shown as text
    env.filters["when"] = lambda epoch_s: iso_ms(int(epoch_s * 1000)) or "never"
    console = Console(settings, options, history,
                      Sampler(settings, history, options.sample_every_s), Jobs(settings),
                      Jinja2Templates(env=env))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if sample:
            console.sampler.start()
        try:
            yield
        finally:
            console.close()

    middleware = [Middleware(SessionMiddleware, secret_key=secrets.token_urlsafe(32),
                             session_cookie="asynctier_console", same_site="strict",
                             max_age=12 * 3600),
                  Middleware(LoginRequired, options=options)]
    app = Starlette(routes=ROUTES, middleware=middleware, lifespan=lifespan,
                    exception_handlers={HTTPException: _refused})
    app.state.console = console
    return app


#: After SIGTERM, requests under way get this long to finish (a live page's open request
#: is cut then); the Helm chart's grace period is derived from it.
STOP_GRACE_S = 10


def serve(settings: Settings, options: ConsoleOptions) -> None:
    """Serve the console until SIGINT or SIGTERM (uvicorn handles both)."""
    import uvicorn

    host, port = options.check().host_port()
    mode = "read-only" if options.read_only else "with actions"
    log.info("console on http://%s:%d/ (%s%s)", host, port, mode,
             ", no login: --insecure-local" if options.insecure_local else "")
    uvicorn.run(create_app(settings, options), host=host, port=port, log_level="warning",
                access_log=False, server_header=False,
                timeout_graceful_shutdown=STOP_GRACE_S)
