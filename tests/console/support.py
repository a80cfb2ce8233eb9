"""What the console's tests share: a console over the test's services, logged in."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from starlette.testclient import TestClient

from asynctier.cli.lag import Readers
from asynctier.console import ConsoleOptions, create_app
from asynctier.console.snapshot import Snapshot
from asynctier.platform.config import Settings
from asynctier.platform.lag import LagReader

TOKEN = "console-test-token-0123456789"


@contextmanager
def console(settings: Settings, **options: object) -> Iterator[TestClient]:
    """A console app (no background sampling: :func:`sample` reads) and a client on it."""
    app = create_app(settings, ConsoleOptions(token=TOKEN, **options),  # type: ignore[arg-type]
                     sample=False)
    with TestClient(app, headers={"accept": "text/html"}) as client:
        yield client


def sample(client: TestClient, timeout_s: float = 10.0) -> Snapshot:
    """Read the platform once, as the sampler does every few seconds."""
    console = client.app.state.console  # type: ignore[attr-defined]
    readers = Readers(console.sampler.settings,
                      LagReader(console.sampler.settings, timeout_s=timeout_s))
    try:
        snapshot: Snapshot = console.sampler.sample(readers)
        return snapshot
    finally:
        readers.close()


def log_in(client: TestClient) -> str:
    """Log in with the token; returns the session's CSRF token (from a page's meta)."""
    response = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return csrf_of(client.get("/").text)


def csrf_of(page: str) -> str:
    """The CSRF token a page carries."""
    found = re.search(r'<meta name="csrf-token" content="([^"]*)"', page)
    assert found and found.group(1), "the page carries no CSRF token"
    return found.group(1)
