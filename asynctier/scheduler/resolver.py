"""Finding a binding's function by its ``module:attr`` path, inside allowed modules only.

The module is checked by :func:`asynctier.platform.allowlist.check_module` (the check
``asynctier bind`` runs too) before anything is imported: refused with
:class:`ModuleNotAllowed` unless it lies under an allowed prefix and off the deny list.
After the import, a path that walks into another module (``myapp.jobs:os.system``) or
reaches a callable that a denied module defines is refused as well.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from asynctier.platform.allowlist import (
    FUNCTION_PATH_RE,
    allowed_prefixes,
    check_module,
    is_denied,
)
from asynctier.platform.errors import FunctionNotFound, ModuleNotAllowed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Function:
    """A resolved function: the callable and whether it is ``async def``."""

    path: str
    call: Callable[..., Any]
    is_async: bool


class FunctionResolver:
    """Resolves ``module:attr`` paths inside ``allow_modules``; results are cached."""

    def __init__(self, allow_modules: Iterable[str]) -> None:
        given = [m.strip() for m in allow_modules]
        self.allow_modules: tuple[str, ...] = allowed_prefixes(given)
        for prefix in dict.fromkeys(m for m in given if m and m not in self.allow_modules):
            log.warning("--allow-module %s is ignored: it is on the deny list of "
                        "modules that can run commands or load code", prefix)
        self._cache: dict[str, Function | Exception] = {}
        self._lock = threading.Lock()

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
        if not FUNCTION_PATH_RE.match(path):
            raise FunctionNotFound(f"function not found: {path!r} is not a module:attr path")
        module_name, _, attr = path.partition(":")
        check_module(module_name, self.allow_modules)
        obj = _walk(_import(module_name, path), attr, path)
        owner = getattr(obj, "__module__", None)
        if isinstance(owner, str) and is_denied(owner):
            raise ModuleNotAllowed(f"module not allowed: {path} is {owner}.{attr}, from a "
                                   "module on the deny list")
        if not callable(obj):
            raise FunctionNotFound(f"function not found: {path} is not callable")
        return Function(path, obj, _is_async(obj))


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
