"""``asynctier run``'s tailer options: checked at the command line, and passed on to the
component processes a plain ``asynctier run`` starts."""

from __future__ import annotations

import signal
import subprocess
import sys

from click.testing import CliRunner

from asynctier.cli import main as cli
from asynctier.cli.run import _child_args
from asynctier.tailers.options import TailerOptions


def test_out_of_range_tailer_options_are_refused_with_the_range() -> None:
    runner = CliRunner()
    for argv, says in ((["--max-in-flight", "0"], "--max-in-flight': 0 is not in the range"),
                       (["--batch-size", "0"], "--batch-size': 0 is not in the range")):
        result = runner.invoke(cli, ["run", "tailers", *argv])
        assert result.exit_code == 2, result.output
        assert says in result.output


def test_a_plain_run_passes_the_tailer_options_to_its_components() -> None:
    args = _child_args("tailers", ("myapp",), None, None,
                       TailerOptions(batch_size=500, max_in_flight=3))
    assert args[args.index("--batch-size") + 1] == "500"
    assert args[args.index("--max-in-flight") + 1] == "3"
    assert args[args.index("--allow-module") + 1] == "myapp"


STUCK = """
import threading
from asynctier.cli.run import stop_on_signals

def stuck_where_it_waits(stop):
    print("ready", flush=True)
    stop.wait(60)

stop = threading.Event()
stop_on_signals(stop)
stuck_where_it_waits(stop)
"""


def test_sigusr1_prints_every_threads_stack_and_sigterm_still_stops() -> None:
    """A process of ``asynctier run`` that does not stop can be asked where it is
    (``kill -USR1``): the stacks go to stderr, and the process goes on until SIGTERM."""
    proc = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGUSR1)
        assert proc.stderr is not None
        dump = [proc.stderr.readline()]  # the operator reads the stacks, then stops it
        while "stuck_where_it_waits" not in dump[-1] and dump[-1]:
            dump.append(proc.stderr.readline())
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=30)
        err = "".join(dump) + rest
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "most recent call first" in err, err
    assert "stuck_where_it_waits" in err, err
