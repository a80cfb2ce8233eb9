"""The README's quickstart, run as written against the session's Kafka and Redis.

The section under ``## Quickstart`` is read as the reader sees it: each ``python`` block is
a file (its first line, ``# greet.py``, names it) written to the test's folder; each ``sh``
block's lines are typed, in order, into one bash process started in that folder (so
``export``, ``$PWD`` and the background ``asynctier run ... &`` behave as in a terminal); a
``text`` block after an ``sh`` block is the output that block must show (every line of it,
in any order, spaces collapsed and times masked).

What the test does not type: ``source .venv/bin/activate`` (the shell's PATH starts with
this interpreter's ``bin``), ``asynctier dev up``, ``eval "$(asynctier dev env)"`` and
``asynctier dev down``: instead of a second Kafka and Redis on the default ports, the shell
gets the session's through ``ASYNCTIER_KAFKA_BOOTSTRAP`` and ``ASYNCTIER_REDIS_URL``, with
``ASYNCTIER_PREFIX`` (its own topics, groups and keys) and ``ASYNCTIER_SCHEDULER_LISTEN`` /
``ASYNCTIER_SCHEDULERS`` on a free port, all documented in docs/operations.md. A block made
only of read-only checks (``grep``, ``asynctier dlq list``...) is typed again until its
output shows what the README says (the reader is told "a few seconds later"), up to a
deadline; every other line is typed once and must exit 0.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from tests.helpers import wait_until
from tests.platform_harness import REPO, free_port

README = REPO / "README.md"
#: Lines the test replaces with the session's services (see the module's docstring).
NOT_TYPED = frozenset({"source .venv/bin/activate", "asynctier dev up",
                       'eval "$(asynctier dev env)"', "asynctier dev down"})
#: Commands that change nothing: a block made only of these may be typed again.
READ_ONLY = ("grep ", "asynctier dlq list ", "asynctier dlq show ", "asynctier lag",
             "asynctier bindings")
#: The topic the quickstart creates (not under the prefix: deleted before and after).
TOPIC = "names"
CHECK_DEADLINE_S = 40.0
COMMAND_TIMEOUT_S = 90.0


@dataclass
class Step:
    """One ``sh`` block: its lines, and the output the README shows after it."""

    lines: list[str]
    expected: list[str] = field(default_factory=list)

    @property
    def read_only(self) -> bool:
        """True when typing it again changes nothing."""
        return all(line.startswith(READ_ONLY) for line in self.lines)


def quickstart(text: str) -> tuple[dict[str, str], list[Step]]:
    """The files and the steps of the README's ``## Quickstart`` section."""
    assert "\n## Quickstart\n" in text, "README.md has no '## Quickstart' section"
    section = text.split("\n## Quickstart\n", 1)[1].split("\n## ", 1)[0]
    files: dict[str, str] = {}
    steps: list[Step] = []
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```$", section, re.S | re.M):
        if lang == "python":
            name = body.splitlines()[0].removeprefix("#").strip()
            files[name] = body
        elif lang == "sh":
            lines = [line for line in body.splitlines()
                     if line.strip() and line.split("#")[0].strip() not in NOT_TYPED]
            steps.append(Step(lines))
        elif lang == "text":
            assert steps, "a text block before any sh block"
            steps[-1].expected = [line for line in body.splitlines() if line.strip()]
    return files, steps


_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?")


def normal(line: str) -> str:
    """A line with its times masked and its spaces collapsed (a table's columns widen
    with the time's digits)."""
    return " ".join(_TIME.sub("<time>", line).split())


def missing(expected: list[str], output: str) -> list[str]:
    """The expected lines that ``output`` does not show."""
    shown = {normal(line) for line in output.splitlines()}
    return [line for line in expected if normal(line) not in shown]


class Shell:
    """One bash process the test types lines into, as a reader would in a terminal."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def type(self, line: str, timeout_s: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
        """Type one line; return its exit code and what it printed."""
        marker = f"__done_{uuid.uuid4().hex}__"
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{line}\necho {marker} $?\n")
        self.proc.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                got = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{line!r} did not finish in {timeout_s:g}s; it "
                                     f"printed:\n{''.join(out)}") from None
            if got is None:
                raise AssertionError(f"the shell exited at {line!r}:\n{''.join(out)}")
            if got.startswith(marker):
                return int(got.split()[1]), "".join(out)
            out.append(got)

    def close(self) -> None:
        """End the shell, then whatever it started that still runs (its process group):
        SIGTERM, and SIGKILL for what does not stop."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # bash exits at the end of its input
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        for sig, wait_s in ((signal.SIGTERM, 60.0), (signal.SIGKILL, 10.0)):
            if not group_members(self.proc.pid):
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not group_members(self.proc.pid), wait_s,
                           "the quickstart's processes to exit")
        self.proc.wait(10)


def group_members(pgid: int, but: int | None = None) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, apart from ``but``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == but:
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _delete_topic(admin: AdminClient) -> None:
    if TOPIC in admin.list_topics(timeout=10).topics:
        admin.delete_topics([TOPIC], operation_timeout=30)[TOPIC].result(timeout=30)
        wait_until(lambda: TOPIC not in admin.list_topics(timeout=10).topics, 30,
                   f"topic {TOPIC} deleted")


def _environment(kafka_bootstrap: str, redis_url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ASYNCTIER_") and k not in ("PYTHONPATH", "COLUMNS")}
    env["COLUMNS"] = "120"  # a terminal wide enough for `dlq list`'s whole table
    scheduler, submitter = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    env.update({
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "ASYNCTIER_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ASYNCTIER_REDIS_URL": redis_url,
        "ASYNCTIER_PREFIX": prefix,
        "ASYNCTIER_SCHEDULER_LISTEN": scheduler,
        "ASYNCTIER_SCHEDULERS": scheduler,
        "ASYNCTIER_SUBMITTER_LISTEN": submitter,
        "ASYNCTIER_SUBMITTERS": submitter,
    })
    return env


def _run_step(shell: Shell, step: Step) -> str:
    """Type a step's lines (again, while a read-only step does not show what it should)."""
    deadline = time.monotonic() + CHECK_DEADLINE_S
    while True:
        output = ""
        for line in step.lines:
            started = time.monotonic()
            code, out = shell.type(line)
            print(f"{time.monotonic() - started:5.1f}s  {line}")
            output += out
            if code != 0 and not step.read_only:
                raise AssertionError(f"{line!r} exited {code}:\n{out}")
        lacking = missing(step.expected, output)
        if not lacking:
            return output
        if not step.read_only or time.monotonic() >= deadline:
            raise AssertionError(f"the README says {step.lines} shows\n"
                                 + "\n".join(lacking) + f"\nbut it printed:\n{output}")
        time.sleep(0.5)  # a reader's pause before typing the check again


def test_the_readme_quickstart_runs_as_written(tmp_path: Path, kafka_bootstrap: str,
                                               redis_url: str, prefix: str,
                                               kafka_admin: AdminClient) -> None:
    files, steps = quickstart(README.read_text())
    assert files and steps, "the quickstart shows no file or no commands"
    assert any(line.startswith("asynctier run") and line.rstrip().endswith("&")
               for step in steps for line in step.lines), "no background `asynctier run`"
    assert any(step.expected for step in steps if step.read_only), "no check shows output"
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    _delete_topic(kafka_admin)
    shell = Shell(tmp_path, _environment(kafka_bootstrap, redis_url, prefix))
    try:
        for step in steps:
            _run_step(shell, step)
        log = (tmp_path / "run.log").read_text()
        assert "Traceback" not in log, log[-4000:]
        left = group_members(shell.proc.pid, but=shell.proc.pid)
        assert not left, f"processes still running after the last step: {left}"
    except AssertionError:
        log_path = tmp_path / "run.log"
        if log_path.exists():
            print(log_path.read_text()[-6000:])
        raise
    finally:
        shell.close()
        _delete_topic(kafka_admin)

