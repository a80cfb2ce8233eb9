"""The demo's functions (three stream workloads, one queue workload). Each appends one
line per call to ``$ASYNCTIER_DEMO_LEDGER``:
``workload id attempt started_s record_s status``."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from typing import Any

from asynctier import Context, Reject

RESOLUTIONS = (240, 480, 720, 1080)
_fd: int | None = None
_lock = threading.Lock()


def _note(workload: str, payload: Any, ctx: Context, started: float, status: str) -> None:
    global _fd
    if _fd is None:
        with _lock:
            if _fd is None:
                _fd = os.open(os.environ["ASYNCTIER_DEMO_LEDGER"],
                              os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{workload} {payload['id']} {ctx.attempt} {started:.6f} "
                  f"{ctx.record_time:.6f} {status}\n".encode())


def encode_upload(payload: Any, ctx: Context) -> dict[str, str]:
    """Encode an uploaded video into several resolutions (a digest stands in for the work).

    ``flaky_until`` makes it fail until that attempt (a transcoder that is briefly down);
    ``corrupt`` makes it reject the upload for good.
    """
    started = time.time()
    if payload.get("corrupt"):
        _note("upload", payload, ctx, started, "rejected")
        raise Reject(f"upload {payload['id']} is not a video")
    if ctx.attempt < int(payload.get("flaky_until", 0)):
        _note("upload", payload, ctx, started, "failed")
        raise RuntimeError(f"transcoder unavailable for upload {payload['id']}")
    source = str(payload).encode()
    renditions = {f"{r}p": hashlib.sha256(source + str(r).encode()).hexdigest()[:12]
                  for r in RESOLUTIONS}
    _note("upload", payload, ctx, started, "ok")
    return renditions


def notify_live(payload: Any, ctx: Context) -> None:
    """Tell followers that a live stream started: worth something only if it is quick."""
    _note("live", payload, ctx, time.time(), "ok")


def suggest_friends(payload: Any, ctx: Context) -> list[int]:
    """Compute friend suggestions: fine tomorrow, useless only if never."""
    started = time.time()
    user = int(payload["id"])
    suggestions = sorted({(user * 7919 + k * 104729) % 100_000 for k in range(20)})[:5]
    _note("suggest", payload, ctx, started, "ok")
    return suggestions


def transcode_video(payload: Any, ctx: Context) -> dict[str, str]:
    """Transcode a whole video (a queue item: it takes a while, and its priority says how
    soon it is wanted). ``seconds`` of work are slept; ``busy`` fails the first attempt
    (no transcoder free: the item is nacked and leased again after the ladder's first
    step); ``corrupt`` rejects it for good (a dead item, kept in the queue)."""
    started = time.time()
    if payload.get("corrupt"):
        _note("transcode", payload, ctx, started, "rejected")
        raise Reject(f"video {payload['id']} cannot be decoded")
    if payload.get("busy") and ctx.attempt == 1:
        _note("transcode", payload, ctx, started, "failed")
        raise RuntimeError(f"no transcoder free for video {payload['id']}")
    time.sleep(float(payload.get("seconds", 0.05)))
    digest = hashlib.sha256(str(payload).encode()).hexdigest()[:12]
    _note("transcode", payload, ctx, started, "ok")
    return {f"{r}p": f"{digest}-{r}" for r in RESOLUTIONS}


def encode_resolution(payload: Any, ctx: Context) -> dict[str, str]:
    """Encode one resolution of an upload (a node of the upload graph); ``broken`` rejects
    it for good, so the upload's publish dies ``parent_failed``."""
    if payload.get("broken"):
        raise Reject(f"upload {payload['video']} cannot be encoded at {payload['resolution']}p")
    time.sleep(0.01)
    return {"video": str(payload["video"]), "resolution": str(payload["resolution"])}


def publish_video(payload: Any, ctx: Context) -> dict[str, str]:
    """Publish an upload: runs only once its three encodes succeeded."""
    return {"published": str(payload["video"])}


def nightly_report(payload: Any, ctx: Context) -> dict[str, str]:
    """The demo's "nightly" job, fired by a schedule every few seconds."""
    return {"report_for": str(payload["tick"])}
