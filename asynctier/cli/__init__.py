"""The ``asynctier`` command: thin click commands that call library functions.

The CLI composes everything (platform, tailers, delay streams), so it lives beside them
rather than inside ``platform``, which imports neither. Each command group is a module
here; :data:`COMMAND_MODULES` lists them and :func:`main` registers them all.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

import click
import redis

from asynctier.platform.config import REDIS_AUTH_HINT, Settings
from asynctier.platform.errors import AsynctierError

COMMAND_MODULES = ("dev", "bindings", "run", "produce", "dlq", "lag", "quota", "demo", "queue",
                   "submit", "tenant", "schedulers", "console", "schedule")


class _Group(click.Group):
    """Turns AsynctierError (and Redis refusing the credentials) into a one-line message and
    exit code 2, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AsynctierError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except redis.AuthenticationError as exc:  # the message names the setting, not its value
            click.echo(f"error: {REDIS_AUTH_HINT} ({exc})", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.option("--config", "config_path", envvar="ASYNCTIER_CONFIG", type=click.Path(),
              help="asynctier.toml to read (env ASYNCTIER_CONFIG).")
@click.option("--log-level", envvar="ASYNCTIER_LOG_LEVEL", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@click.option("--log-format", envvar="ASYNCTIER_LOG_FORMAT", default="text", show_default=True,
              type=click.Choice(["text", "json"]), help="json: one JSON object per line.")
@click.version_option(package_name="asynctier")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, log_level: str, log_format: str) -> None:
    """Run Python functions on the records that already sit in Kafka topics."""
    from asynctier.platform.logs import setup_logging

    setup_logging(log_level.upper(), log_format)
    if config_path:  # child processes of `asynctier run` read the same file
        os.environ["ASYNCTIER_CONFIG"] = str(config_path)
    ctx.obj = Settings.load(config_path)


def settings_of(ctx: click.Context) -> Settings:
    """The Settings the root command loaded."""
    obj = ctx.find_root().obj
    assert isinstance(obj, Settings)
    return obj


def _register() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"asynctier.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"asynctier.cli.{name}":
                continue  # that command group is not built yet
            raise
        for command in getattr(module, "COMMANDS", ()):
            main.add_command(command)


_register()
logging.getLogger("asynctier").addHandler(logging.NullHandler())
