"""Which function paths a binding may name: one check, at bind time and at run time.

This module owns the ``module:attr`` path pattern, the deny list and the module check.
``asynctier bind`` runs :func:`check_function_allowed` before it stores a binding, and the
scheduler's :class:`~asynctier.scheduler.resolver.FunctionResolver` runs
:func:`check_module` before it imports anything, so a path refused by one is refused by
the other with the same message.

A module is allowed when it equals an allowed prefix or lies under one (``myapp.jobs``
allows ``myapp.jobs`` and ``myapp.jobs.media``, not ``myapp.jobsx``). Modules that can run
commands or load code or data (``os``, ``subprocess``, ``threading`` ...), their
submodules and private top-level modules (``_thread``) are refused even when allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from asynctier.platform.errors import ModuleNotAllowed

#: A function path: a dotted module, ``:``, a dotted attribute (``myapp.jobs:resize``).
FUNCTION_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
                              r":[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

#: Never allowed, whatever ``--allow-module`` says: they run commands, load code or data.
#: A module under one of these (``os.path``, ``asyncio.subprocess``) is refused too.
DENIED_MODULES = frozenset({
    "os", "posix", "nt", "sys", "subprocess", "builtins", "importlib", "imp", "shutil",
    "pickle", "marshal", "ctypes", "socket", "ssl", "code", "codeop", "pty", "runpy",
    "multiprocessing", "concurrent", "asyncio", "signal", "gc", "inspect", "types", "io",
    "pathlib", "tempfile", "webbrowser", "http", "urllib", "ftplib", "smtplib", "shelve",
    "dbm", "sqlite3", "threading", "platform", "resource", "fcntl", "mmap", "pdb", "bdb",
    "trace", "sysconfig", "site", "zipimport", "pkgutil",
})


def under(module: str, prefix: str) -> bool:
    """True when ``module`` is ``prefix`` or one of its submodules."""
    return module == prefix or module.startswith(prefix + ".")


def is_denied(module: str) -> bool:
    """True when ``module`` is on (or under) the deny list, or is a private top-level one."""
    return module.startswith("_") or any(under(module, denied) for denied in DENIED_MODULES)


def allowed_prefixes(allow_modules: Iterable[str]) -> tuple[str, ...]:
    """``allow_modules`` stripped, without blanks, repeats and denied prefixes."""
    prefixes = dict.fromkeys(m.strip() for m in allow_modules if m.strip())
    return tuple(p for p in prefixes if not is_denied(p))


def check_module(module: str, allow_modules: Iterable[str] | None) -> None:
    """Raise ModuleNotAllowed unless functions of ``module`` may run.

    ``allow_modules=None`` skips the allow-list (bind time without a configured list);
    the deny list always applies.
    """
    if is_denied(module):
        raise ModuleNotAllowed(f"module not allowed: {module} can run commands or load "
                               "code and is never allowed; bind a function of your own "
                               "package")
    if allow_modules is None:
        return
    prefixes = allowed_prefixes(allow_modules)
    if not any(under(module, p) for p in prefixes):
        allowed = ", ".join(prefixes) or "none"
        raise ModuleNotAllowed(f"module not allowed: {module} (allowed: {allowed}); "
                               f"start the scheduler with --allow-module {module}")


def check_function_allowed(function: str, allow_modules: Iterable[str] | None) -> None:
    """Raise ModuleNotAllowed unless the module of ``function`` (``module:attr``) may run."""
    check_module(function.partition(":")[0], allow_modules)
