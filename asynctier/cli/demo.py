"""``asynctier demo``: the whole platform on three seed workloads, in under a minute."""

from __future__ import annotations

import os
import sys

import click

from asynctier.cli import settings_of
from asynctier.dev import DevStack, kafka_answers


@click.command()
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Give up after this many seconds.")
@click.pass_context
def demo(ctx: click.Context, timeout_s: float) -> None:
    """Bring the dev stack up if needed, bind three workloads, run them, show a summary."""
    from asynctier.demo.run import run_demo

    settings = settings_of(ctx)
    if not os.environ.get("ASYNCTIER_KAFKA_BOOTSTRAP") and not kafka_answers(
            settings.kafka_bootstrap, timeout_s=3.0):
        click.echo("no Kafka configured or answering: starting the dev stack "
                   "(asynctier dev up)")
        stack = DevStack.resolve(settings.data_dir)
        for status in stack.up():
            click.echo(status.describe())
        env = dict(line.removeprefix("export ").split("=", 1) for line in stack.env_lines())
        settings = settings.from_env(env)
    sys.exit(run_demo(settings, timeout_s))


COMMANDS = [demo]
