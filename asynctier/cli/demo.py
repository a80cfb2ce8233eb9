"""``asynctier demo``: the whole platform on the seed workloads (three streams and one
queue), in under a minute."""

from __future__ import annotations

import os
import sys

import click

from asynctier.cli import settings_of
from asynctier.dev import DevStack, ServiceStatus, free_port, kafka_answers, postgres_answers
from asynctier.dev.process import HOST
from asynctier.platform.config import Settings


def _stack_settings(settings: Settings, only: tuple[str, ...] | None,
                    left: list[ServiceStatus]) -> Settings:
    """Start the dev stack's services (``only`` those) and point ``settings`` at them;
    their states go to ``left`` (the demo leaves them running)."""
    stack = DevStack.resolve(settings.data_dir)
    for status in stack.up(only):
        click.echo(status.describe())
        left.append(status)
    env = dict(line.removeprefix("export ").split("=", 1) for line in stack.env_lines())
    if only is not None:
        env = {k: v for k, v in env.items() if k == "ASYNCTIER_QUEUE_SHARDS"}
    return settings.from_env(env)


def left_running(left: list[ServiceStatus], data_dir: str) -> str:
    """What the demo leaves running, and the command that stops it ("" when it used
    services it did not start)."""
    if not left:
        return ""
    where = "" if data_dir == ".asynctier" else f"ASYNCTIER_DATA_DIR={data_dir} "
    names = ", ".join(f"{s.name} ({s.address}, {'started now' if s.started_now else 'already up'})"
                      for s in left)
    return (f"left running: {names}. Stop them with `{where}asynctier dev down` "
            "(the data is kept; `asynctier dev reset` wipes it).")


@click.command()
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Give up after this many seconds.")
@click.pass_context
def demo(ctx: click.Context, timeout_s: float) -> None:
    """Bring the dev stack up if needed, bind four workloads (three Kafka topics and a
    queue topic), run them, show a summary."""
    from asynctier.demo.run import run_demo

    settings = settings_of(ctx)
    left: list[ServiceStatus] = []
    if not os.environ.get("ASYNCTIER_KAFKA_BOOTSTRAP") and not kafka_answers(
            settings.kafka_bootstrap, timeout_s=3.0):
        click.echo("no Kafka configured or answering: starting the dev stack "
                   "(asynctier dev up)")
        settings = _stack_settings(settings, None, left)
    elif not os.environ.get("ASYNCTIER_QUEUE_SHARDS") and not postgres_answers(
            settings.queue_shards[0], timeout_s=3.0):
        click.echo("no PostgreSQL configured or answering for the queue: starting the dev "
                   "stack's (asynctier dev up)")
        settings = _stack_settings(settings, ("postgres",), left)
    # ports of its own, so the demo runs beside a platform (or another demo) on this host
    scheduler, submitter = f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"
    settings = settings.from_env({
        "ASYNCTIER_SCHEDULER_LISTEN": scheduler, "ASYNCTIER_SCHEDULERS": scheduler,
        "ASYNCTIER_SUBMITTER_LISTEN": submitter, "ASYNCTIER_SUBMITTERS": submitter})
    code = 1
    try:
        code = run_demo(settings, timeout_s)
    finally:
        if not left:  # the dev stack's services from an earlier `dev up` or demo, if any
            left = [status for status in DevStack.resolve(settings.data_dir).status()
                    if status.running]
        said = left_running(left, str(settings.data_dir))
        if said:
            click.echo(said)
    sys.exit(code)


COMMANDS = [demo]
