"""Which function paths a binding may name: only inside allowed modules, never dangerous ones.

Checked at bind time (against the config's ``allow_modules`` when set) and again by the
scheduler before anything is imported.
"""

from __future__ import annotations

from collections.abc import Sequence

from asynctier.platform.errors import ModuleNotAllowed

#: Modules whose functions would let a record run commands or code; refused even when
#: listed in allow_modules.
DENIED_MODULES = frozenset({
    "os", "posix", "nt", "sys", "subprocess", "builtins", "importlib", "shutil", "pickle",
    "marshal", "ctypes", "socket", "pty", "code", "codeop", "runpy", "multiprocessing",
    "signal", "asyncio.subprocess", "pdb", "webbrowser", "eval", "exec",
})


def module_within(module: str, prefix: str) -> bool:
    """True when ``module`` is ``prefix`` or inside it (``a.b`` is within ``a``)."""
    return module == prefix or module.startswith(prefix + ".")


def check_function_allowed(function: str, allow_modules: Sequence[str] | None) -> None:
    """Raise ModuleNotAllowed unless ``function``'s module may be run.

    ``allow_modules=None`` skips the allow-list (bind time without a configured list);
    the deny-list always applies.
    """
    module = function.partition(":")[0]
    root = module.split(".")[0]
    if root in DENIED_MODULES or module in DENIED_MODULES or root.startswith("_"):
        raise ModuleNotAllowed(
            f"module not allowed: {module!r} can run commands or code and is never allowed; "
            "bind a function of your own package")
    if allow_modules is None:
        return
    if not any(module_within(module, prefix) for prefix in allow_modules):
        allowed = ", ".join(allow_modules) or "none"
        raise ModuleNotAllowed(
            f"module not allowed: {module!r} is outside the allowed modules ({allowed}); "
            f"start the scheduler with --allow-module {module.split('.')[0]} "
            "or add it to allow_modules in asynctier.toml")
