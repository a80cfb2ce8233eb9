"""Who may use the console and how its actions are kept safe.

* Login: the operator gives the token once (``/login``); the signed session cookie
  (Starlette's SessionMiddleware: itsdangerous, HttpOnly, SameSite=Strict) carries the
  login from then on. A script may send ``Authorization: Bearer TOKEN`` instead. With
  ``--insecure-local`` (loopback only) every visitor is logged in as ``local``.
* Every state-changing request is a POST that carries the session's CSRF token (a form
  field, or the ``X-CSRF-Token`` header); a bearer request needs none (no browser sends it
  on its own).
* ``--read-only``: the pages offer no action and the server refuses every POST but the
  login's.
* Every action writes one audit line (logger ``asynctier.console.audit``): who, what, on
  what, how many.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from asynctier.console.options import ConsoleOptions

audit_log = logging.getLogger("asynctier.console.audit")

#: Paths anyone may open: the login page and the console's own health.
OPEN_PATHS = frozenset({"/login", "/healthz"})


def same_secret(given: str, expected: str) -> bool:
    """Compare in constant time (a token or CSRF value)."""
    return hmac.compare_digest(given.encode(), expected.encode())


def bearer(request: Request) -> str:
    """The token of an ``Authorization: Bearer`` header ('' when none)."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def log_in(request: Request, user: str) -> None:
    """Start a session for ``user`` with a fresh CSRF token."""
    request.session.clear()
    request.session.update({"user": user, "csrf": secrets.token_urlsafe(32)})


def user_of(request: Request, options: ConsoleOptions) -> str | None:
    """Who sent ``request`` (None: nobody logged in)."""
    if options.token and bearer(request):
        return "bearer" if same_secret(bearer(request), options.token) else None
    user = request.session.get("user")
    if isinstance(user, str) and user:
        return user
    if options.insecure_local:
        log_in(request, "local")
        return "local"
    return None


def csrf_token(request: Request) -> str:
    """The session's CSRF token ('' without a session)."""
    token = request.session.get("csrf") if "session" in request.scope else None
    return token if isinstance(token, str) else ""


async def check_action(request: Request, options: ConsoleOptions) -> None:
    """Refuse a POST that may not change anything: read-only mode, or a CSRF token that is
    missing or wrong. Raises HTTPException (403)."""
    if options.read_only:
        raise HTTPException(403, "the console runs read-only (--read-only): it takes no "
                                 "action; use the CLI, or a console without --read-only")
    if request.state.user == "bearer":
        return
    form = await request.form()
    given = request.headers.get("x-csrf-token") or str(form.get("csrf") or "")
    expected = csrf_token(request)
    if not expected or not given or not same_secret(given, expected):
        raise HTTPException(403, "this action did not carry the page's CSRF token: reload "
                                 "the page and try again (a form posted from another site "
                                 "is refused)")


def audit(request: Request, action: str, target: str, count: int) -> None:
    """One audit line: who, what, on what, how many."""
    client = request.client.host if request.client else "?"
    audit_log.info("console action: user=%s from=%s action=%s target=%s count=%d",
                   request.state.user, client, action, target, count)


class LoginRequired(BaseHTTPMiddleware):
    """Every path but :data:`OPEN_PATHS` needs a logged-in user: a page redirects to the
    login, anything else gets 401."""

    def __init__(self, app: object, options: ConsoleOptions) -> None:
        super().__init__(app)  # type: ignore[arg-type]
        self.options = options

    async def dispatch(self, request: Request,
                       call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        request.state.user = user_of(request, self.options)
        if request.state.user is None and request.url.path not in OPEN_PATHS:
            if request.method == "GET" and not request.url.path.startswith("/live/"):
                return RedirectResponse("/login", status_code=303)
            return JSONResponse({"error": "log in first (/login), or send Authorization: "
                                          "Bearer TOKEN"}, status_code=401)
        return await call_next(request)
