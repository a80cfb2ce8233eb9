"""Replays the console started and runs in the background: the server does the work, the
page shows how far it got (a replay of thousands at a rate takes minutes)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from asynctier.delay_streams.dlq import ReplayOptions, ReplayReport, replay
from asynctier.platform.config import Settings
from asynctier.platform.membership import default_client

log = logging.getLogger(__name__)

#: Finished jobs kept for the page.
KEEP_DONE = 50


@dataclass
class Job:
    """One replay: what it is, who started it, how far it got."""

    id: int
    what: str
    user: str
    started_s: float
    report: ReplayReport = field(default_factory=ReplayReport)
    state: str = "running"  # running | done | stopped | failed
    error: str = ""
    stop: threading.Event = field(default_factory=threading.Event)


class Jobs:
    """The console's replays, newest first."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self._ids = itertools.count(1)
        self._jobs: list[Job] = []
        self._lock = threading.Lock()

    def all(self) -> list[Job]:
        """Every job kept, newest first."""
        with self._lock:
            return list(reversed(self._jobs))

    def get(self, job_id: int) -> Job | None:
        """The job ``job_id``, if kept."""
        return next((j for j in self.all() if j.id == job_id), None)

    def replay_dead_letters(self, binding: str, options: ReplayOptions, user: str,
                            what: str) -> Job:
        """Start replaying ``binding``'s dead letters (the same call as ``asynctier dlq
        replay``) in a thread; returns the job at once."""
        job = Job(next(self._ids), what, user, self.clock())
        with self._lock:
            self._jobs.append(job)
            done = [j for j in self._jobs if j.state != "running"]
            for old in done[:-KEEP_DONE]:
                self._jobs.remove(old)
        threading.Thread(target=self._run, args=(job, binding, options),
                         name=f"console replay {job.id}", daemon=True).start()
        return job

    def _run(self, job: Job, binding: str, options: ReplayOptions) -> None:
        client = default_client(self.settings, wait_for_scheduler=False)
        try:
            job.report = replay(self.settings, binding, options, client, job.stop,
                                lambda report: setattr(job, "report", report))
            job.state = "stopped" if job.report.stopped else "done"
        except Exception as exc:  # the page says why; the console goes on
            job.state, job.error = "failed", str(exc)
            log.error("console replay %d (%s) failed: %s", job.id, job.what, exc)
        finally:
            client.close()

    def stop_all(self) -> None:
        """Ask every running job to stop (at its next batch)."""
        for job in self.all():
            job.stop.set()
