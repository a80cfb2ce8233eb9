"""Finding a binding's function by its ``module:attr`` path, inside allowed modules only.

A path is resolved only when its module equals an allowed prefix or lies under one
(``myapp.jobs`` allows ``myapp.jobs`` and ``myapp.jobs.media``, not ``myapp.jobsx``).
Anything else is refused with :class:`ModuleNotAllowed` before anything is imported.
Modules that can run commands or code (``os``, ``subprocess``, ``builtins`` ...) are
refused even when someone allows them, and so is a path that walks into another module
(``myapp.jobs:os.system``) or reaches a callable that such a module defines.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from asynctier.platform.errors import FunctionNotFound, ModuleNotAllowed

log = logging.getLogger(__name__)

#: Never allowed, whatever ``--allow-module`` says: they run commands, load code or data.
DENIED_MODULES = frozenset({
    "os", "posix", "nt", "sys", "subprocess", "_posixsubprocess", "builtins", "importlib",
    "imp", "shutil", "pickle", "_pickle", "marshal", "ctypes", "_ctypes", "socket",
    "_socket", "ssl", "code", "codeop", "pty", "runpy", "multiprocessing", "concurrent",
    "asyncio", "signal", "gc", "inspect", "types", "io", "_io", "pathlib", "tempfile",
    "webbrowser", "http", "urllib", "ftplib", "smtplib", "shelve", "dbm", "sqlite3",
    "threading", "_thread", "platform", "resource", "fcntl", "mmap", "pdb", "bdb",
    "trace", "sysconfig", "site", "zipimport", "pkgutil",
})

_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
                      r":[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def under(module: str, prefix: str) -> bool:
    """True when ``module`` is ``prefix`` or one of its submodules."""
    return module == prefix or module.startswith(prefix + ".")


def is_denied(module: str) -> bool:
    """True when ``module`` is on (or under) the deny list."""
    return any(under(module, denied) for denied in DENIED_MODULES)


@dataclass(frozen=True)
class Function:
    """A resolved function: the callable and whether it is ``async def``."""

    path: str
    call: Callable[..., Any]
    is_async: bool


class FunctionResolver:
    """Resolves ``module:attr`` paths inside ``allow_modules``; results are cached."""

    def __init__(self, allow_modules: Iterable[str]) -> None:
        allowed = []
        for prefix in dict.fromkeys(m.strip() for m in allow_modules if m.strip()):
            if is_denied(prefix):
                log.warning("--allow-module %s is ignored: it is on the deny list of "
                            "modules that can run commands or load code", prefix)
            else:
                allowed.append(prefix)
        self.allow_modules: tuple[str, ...] = tuple(allowed)
        self._cache: dict[str, Function | Exception] = {}
        self._lock = threading.Lock()

    def allowed(self, module: str) -> bool:
        """True when functions of ``module`` may run here."""
        return not is_denied(module) and any(under(module, p) for p in self.allow_modules)

    def resolve(self, path: str) -> Function:
        """The function at ``path``; ModuleNotAllowed or FunctionNotFound otherwise."""
        found = self._cache.get(path)
        if found is None:
            with self._lock:
                found = self._cache.get(path)
                if found is None:
                    found = self._cache[path] = self._try_resolve(path)
        if isinstance(found, Exception):
            raise found
        return found

    def _try_resolve(self, path: str) -> Function | Exception:
        try:
            return self._resolve(path)
        except (ModuleNotAllowed, FunctionNotFound) as exc:
            return exc

    def _resolve(self, path: str) -> Function:
        if not _PATH_RE.match(path):
            raise FunctionNotFound(f"function not found: {path!r} is not a module:attr path")
        module_name, _, attr = path.partition(":")
        self._check_module(module_name)
        obj = _walk(_import(module_name, path), attr, path)
        owner = getattr(obj, "__module__", None)
        if isinstance(owner, str) and is_denied(owner):
            raise ModuleNotAllowed(f"module not allowed: {path} is {owner}.{attr}, from a "
                                   "module on the deny list")
        if not callable(obj):
            raise FunctionNotFound(f"function not found: {path} is not callable")
        return Function(path, obj, _is_async(obj))

    def _check_module(self, module: str) -> None:
        if is_denied(module):
            raise ModuleNotAllowed(f"module not allowed: {module} can run commands or load "
                                   "code and is never allowed")
        if not any(under(module, p) for p in self.allow_modules):
            allowed = ", ".join(self.allow_modules) or "none"
            raise ModuleNotAllowed(f"module not allowed: {module} (allowed: {allowed}); "
                                   f"start the scheduler with --allow-module {module}")


def _import(module_name: str, path: str) -> types.ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise FunctionNotFound(f"function not found: {path}: no module named "
                               f"{exc.name or module_name}") from exc
    except Exception as exc:  # the module exists but breaks on import
        raise FunctionNotFound(f"function not found: {path}: importing {module_name} "
                               f"raised {type(exc).__name__}: {exc}"[:500]) from exc


def _walk(obj: Any, attr: str, path: str) -> Any:
    for part in attr.split("."):
        if part.startswith("_"):
            raise FunctionNotFound(f"function not found: {path}: private or special "
                                   f"attribute {part!r}")
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise FunctionNotFound(f"function not found: {path}: no attribute "
                                   f"{part!r}") from exc
        if isinstance(obj, types.ModuleType):
            raise ModuleNotAllowed(f"module not allowed: {path} walks into the module "
                                   f"{obj.__name__}; name it with module:attr")
    return obj


def _is_async(obj: Any) -> bool:
    if inspect.iscoroutinefunction(obj):
        return True
    call = getattr(obj, "__call__", None)  # noqa: B004 - an instance with async __call__
    return call is not None and inspect.iscoroutinefunction(call)
