"""Resolving functions: allowed modules only, a deny list, nothing imported when refused."""

from __future__ import annotations

import os
import sys

import pytest

from asynctier.platform.allowlist import is_denied, under
from asynctier.platform.errors import FunctionNotFound, ModuleNotAllowed
from asynctier.scheduler.resolver import FunctionResolver
from tests.funcs import basic


def test_prefix_matching_is_by_module_boundaries() -> None:
    assert under("myapp.jobs", "myapp.jobs") and under("myapp.jobs.media", "myapp.jobs")
    assert not under("myapp.jobsx", "myapp.jobs") and not under("myapp", "myapp.jobs")


def test_resolves_sync_and_async_functions_inside_allowed_modules() -> None:
    resolver = FunctionResolver(["tests.funcs"])
    sync = resolver.resolve("tests.funcs.basic:record")
    assert sync.call is basic.record and not sync.is_async
    assert resolver.resolve("tests.funcs.basic:async_record").is_async
    assert resolver.resolve("tests.funcs.basic:record") is sync  # cached


def test_a_refused_module_is_never_imported() -> None:
    os.environ.pop("ASYNCTIER_TEST_EVIL_IMPORTED", None)
    sys.modules.pop("tests.funcs.evil", None)
    resolver = FunctionResolver(["tests.funcs.basic", "tests.funcs.eviler"])
    with pytest.raises(ModuleNotAllowed, match=r"module not allowed: tests\.funcs\.evil "
                       r".*--allow-module tests\.funcs\.evil"):
        resolver.resolve("tests.funcs.evil:run")
    assert "tests.funcs.evil" not in sys.modules
    assert "ASYNCTIER_TEST_EVIL_IMPORTED" not in os.environ


@pytest.mark.parametrize("path", ["os:system", "builtins:eval", "subprocess:run",
                                  "pickle:loads", "importlib:import_module", "sys:exit",
                                  "shutil:rmtree", "ctypes:CDLL", "socket:socket",
                                  "os.path:join", "marshal:loads"])
def test_dangerous_modules_are_refused_even_when_allowed(path: str) -> None:
    module = path.partition(":")[0]
    resolver = FunctionResolver([module, "tests.funcs"])
    assert resolver.allow_modules == ("tests.funcs",)
    with pytest.raises(ModuleNotAllowed, match="module not allowed"):
        resolver.resolve(path)


def test_the_deny_list_covers_submodules() -> None:
    assert is_denied("os") and is_denied("os.path") and is_denied("importlib.util")
    assert not is_denied("osmosis") and not is_denied("myapp.os")


def test_paths_that_walk_into_other_modules_are_refused() -> None:
    resolver = FunctionResolver(["tests.funcs"])
    with pytest.raises(ModuleNotAllowed, match="walks into the module time"):
        resolver.resolve("tests.funcs.basic:time.sleep")
    with pytest.raises(ModuleNotAllowed, match="walks into the module asyncio"):
        resolver.resolve("tests.funcs.basic:asyncio.create_subprocess_exec")


def test_private_and_special_attributes_are_refused() -> None:
    resolver = FunctionResolver(["tests.funcs"])
    with pytest.raises(FunctionNotFound, match="private or special"):
        resolver.resolve("tests.funcs.basic:__builtins__")
    with pytest.raises(FunctionNotFound, match="private or special"):
        resolver.resolve("tests.funcs.basic:_LOCK")


def test_unknown_modules_and_attributes() -> None:
    resolver = FunctionResolver(["tests.funcs"])
    with pytest.raises(FunctionNotFound, match=r"no module named tests\.funcs\.nothing"):
        resolver.resolve("tests.funcs.nothing:run")
    with pytest.raises(FunctionNotFound, match="no attribute 'nothing'"):
        resolver.resolve("tests.funcs.basic:nothing")
    with pytest.raises(FunctionNotFound, match="not callable"):
        resolver.resolve("tests.funcs.basic:SEEN")
    with pytest.raises(FunctionNotFound, match="not a module:attr path"):
        resolver.resolve("tests.funcs.basic")


def test_nothing_is_allowed_by_default() -> None:
    with pytest.raises(ModuleNotAllowed, match=r"\(allowed: none\)"):
        FunctionResolver([]).resolve("tests.funcs.basic:record")
