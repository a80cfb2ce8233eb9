"""``asynctier demo``: the whole platform on the seed workloads (three streams and one
queue), in under a minute."""

from __future__ import annotations

import os
import sys

import click

from asynctier.cli import settings_of
from asynctier.dev import DevStack, free_port, kafka_answers, postgres_answers
from asynctier.dev.process import HOST
from asynctier.platform.config import Settings


def _stack_settings(settings: Settings, only: tuple[str, ...] | None) -> Settings:
    """Start the dev stack's services (``only`` those) and point ``settings`` at them."""
    stack = DevStack.resolve(settings.data_dir)
    for status in stack.up(only):
        click.echo(status.describe())
    env = dict(line.removeprefix("export ").split("=", 1) for line in stack.env_lines())
    if only is not None:
        env = {k: v for k, v in env.items() if k == "ASYNCTIER_QUEUE_SHARDS"}
    return settings.from_env(env)


@click.command()
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Give up after this many seconds.")
@click.pass_context
def demo(ctx: click.Context, timeout_s: float) -> None:
    """Bring the dev stack up if needed, bind four workloads (three Kafka topics and a
    queue topic), run them, show a summary."""
    from asynctier.demo.run import run_demo

    settings = settings_of(ctx)
    if not os.environ.get("ASYNCTIER_KAFKA_BOOTSTRAP") and not kafka_answers(
            settings.kafka_bootstrap, timeout_s=3.0):
        click.echo("no Kafka configured or answering: starting the dev stack "
                   "(asynctier dev up)")
        settings = _stack_settings(settings, None)
    elif not os.environ.get("ASYNCTIER_QUEUE_SHARDS") and not postgres_answers(
            settings.queue_shards[0], timeout_s=3.0):
        click.echo("no PostgreSQL configured or answering for the queue: starting the dev "
                   "stack's (asynctier dev up)")
        settings = _stack_settings(settings, ("postgres",))
    # ports of its own, so the demo runs beside a platform (or another demo) on this host
    scheduler, submitter = f"{HOST}:{free_port()}", f"{HOST}:{free_port()}"
    settings = settings.from_env({
        "ASYNCTIER_SCHEDULER_LISTEN": scheduler, "ASYNCTIER_SCHEDULERS": scheduler,
        "ASYNCTIER_SUBMITTER_LISTEN": submitter, "ASYNCTIER_SUBMITTERS": submitter})
    sys.exit(run_demo(settings, timeout_s))


COMMANDS = [demo]
