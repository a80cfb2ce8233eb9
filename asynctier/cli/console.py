"""``asynctier console`` (also ``asynctier run console``): the operator's web page."""

from __future__ import annotations

import os
from collections.abc import Mapping

import click

from asynctier.cli import settings_of
from asynctier.console.options import DEFAULT_LISTEN, ConsoleOptions

_TRUE = ("1", "true", "yes")


def options_from_env(env: Mapping[str, str] | None = None) -> ConsoleOptions:
    """The console's options from ``ASYNCTIER_CONSOLE_*`` (what ``asynctier run console``
    reads: it takes no console flags)."""
    env = os.environ if env is None else env
    return ConsoleOptions(
        listen=env.get("ASYNCTIER_CONSOLE_LISTEN") or DEFAULT_LISTEN,
        token=env.get("ASYNCTIER_CONSOLE_TOKEN") or None,
        insecure_local=env.get("ASYNCTIER_CONSOLE_INSECURE_LOCAL", "").lower() in _TRUE,
        read_only=env.get("ASYNCTIER_CONSOLE_READ_ONLY", "").lower() in _TRUE)


@click.command()
@click.option("--listen", envvar="ASYNCTIER_CONSOLE_LISTEN", default=DEFAULT_LISTEN,
              show_default=True, help="host:port to serve on (env ASYNCTIER_CONSOLE_LISTEN).")
@click.option("--token", envvar="ASYNCTIER_CONSOLE_TOKEN",
              help="The login token, 16 characters or more (env ASYNCTIER_CONSOLE_TOKEN).")
@click.option("--insecure-local", is_flag=True, envvar="ASYNCTIER_CONSOLE_INSECURE_LOCAL",
              help="No login: on a loopback --listen only.")
@click.option("--read-only", is_flag=True, envvar="ASYNCTIER_CONSOLE_READ_ONLY",
              help="Offer no action and refuse every one posted.")
@click.option("--sample-every", "sample_every_s", type=click.FloatRange(0.5, 3600),
              default=5.0, show_default=True,
              help="Seconds between the console's reads of lag and state (its charts).")
@click.pass_context
def console(ctx: click.Context, listen: str, token: str | None, insecure_local: bool,
            read_only: bool, sample_every_s: float) -> None:
    """Serve the operator console: bindings, lag history, dead letters, the queue, and
    their actions (see docs/console.md)."""
    from asynctier.console import serve

    serve(settings_of(ctx), ConsoleOptions(listen, token, insecure_local, read_only,
                                           sample_every_s))


COMMANDS = [console]
