"""What every page and action of one console shares."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from asynctier.console.history import History
from asynctier.console.jobs import Jobs
from asynctier.console.options import ConsoleOptions
from asynctier.console.security import csrf_token
from asynctier.console.snapshot import Sampler
from asynctier.platform.config import Settings
from asynctier.queue.items import TopicCounts
from asynctier.queue.shards import ShardedQueue


@dataclass
class Console:
    """The settings, options, sampler, jobs and templates of one console."""

    settings: Settings
    options: ConsoleOptions
    history: History
    sampler: Sampler
    jobs: Jobs
    templates: Jinja2Templates
    _queue: ShardedQueue | None = field(default=None, repr=False)
    #: namespace -> (when counted, the counts): counting reads every item of a namespace,
    #: so a count is kept ``options.sample_every_s`` and shown with its time.
    _counts: dict[str, tuple[float, list[TopicCounts]]] = field(default_factory=dict,
                                                                 repr=False)
    _counting: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def queue_counts(self, namespace: str) -> tuple[float, list[TopicCounts]]:
        """(when counted, the counts) of ``namespace``'s topics, at most
        ``sample_every_s`` old (one count at a time: a page waits for the one under way)."""
        with self._counting:
            kept = self._counts.get(namespace)
            if kept is None or time.time() - kept[0] > self.options.sample_every_s:
                kept = (time.time(), self.queue.counts(namespace))
                self._counts[namespace] = kept
                if len(self._counts) > 100:  # namespaces typed in: keep memory bounded
                    self._counts.pop(next(iter(self._counts)))
            return kept

    @property
    def queue(self) -> ShardedQueue:
        """The queue's shards (opened on first use: a console without queue bindings never
        connects to PostgreSQL)."""
        if self._queue is None:
            self._queue = ShardedQueue.from_settings(self.settings, pool_size=2)
        return self._queue

    def close(self) -> None:
        """Stop sampling and the jobs; close the shards."""
        self.sampler.stop()
        self.jobs.stop_all()
        if self._queue is not None:
            self._queue.close()


def console_of(request: Request) -> Console:
    """The console serving ``request``."""
    console: Console = request.app.state.console
    return console


def render(request: Request, template: str, status_code: int = 200,
           **context: Any) -> Response:
    """A page: ``template`` with ``context``, the user, the CSRF token and the mode."""
    console = console_of(request)
    base = {"user": getattr(request.state, "user", None), "csrf": csrf_token(request),
            "read_only": console.options.read_only, "snapshot": console.sampler.latest,
            "trace_link": console.settings.tracing.trace_link}
    return console.templates.TemplateResponse(request, template, {**base, **context},
                                              status_code=status_code)
