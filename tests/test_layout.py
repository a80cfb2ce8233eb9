"""Imports point one way (docs/design.md, "Rooms, and which way imports point").

``platform`` is the core every room shares (config, names, errors, the binding, metrics, the
wire, the RPC client and server options, the membership directory, Redis scripts) and
imports no room. The rooms are the seeds' components: ``scheduler`` (dispatch, runtime,
queues, admission and limits), ``tailers``, ``delay_streams``, ``queue`` (the store) and
``submitter``; each imports the core and only the rooms below it. ``cli`` sits on top and
may use every room; ``dev`` (the local stack and test support) is used by the CLI, the tests
and the benchmarks only (the CLI passes its fault hook in)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import asynctier

PACKAGE = Path(asynctier.__file__).resolve().parent

#: Per room, the prefixes of the ``asynctier`` modules it may import.
ALLOWED: dict[str, tuple[str, ...]] = {
    "platform": ("asynctier.platform",),
    "scheduler": ("asynctier.scheduler", "asynctier.platform"),
    "delay_streams": ("asynctier.delay_streams", "asynctier.platform"),
    "tailers": ("asynctier.tailers", "asynctier.delay_streams", "asynctier.queue",
                "asynctier.platform"),
    "queue": ("asynctier.queue", "asynctier.platform"),
    "submitter": ("asynctier.submitter", "asynctier.queue", "asynctier.platform"),
    "dev": ("asynctier.dev", "asynctier.platform"),
    "demo": ("asynctier.demo", "asynctier.delay_streams", "asynctier.queue",
             "asynctier.platform"),
}


def _imports(path: Path) -> list[str]:
    """The ``asynctier`` modules ``path`` imports, anywhere in it (also inside functions).
    A name taken from ``asynctier`` itself (``Context``, ``Retry``...) is the platform's."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "asynctier"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "asynctier":
                found += [f"asynctier.{a.name}" if a.name in _SUBPACKAGES
                          else "asynctier.platform" for a in node.names]
            elif node.module.split(".")[0] == "asynctier":
                found.append(node.module)
    return found


_SUBPACKAGES = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def wrong_imports(package: Path) -> list[str]:
    """Every import in ``package`` (an ``asynctier`` tree) that its room may not make."""
    wrong = []
    for room, allowed in ALLOWED.items():
        for path in sorted((package / room).rglob("*.py")):
            for module in _imports(path):
                if not any(_within(module, prefix) for prefix in allowed):
                    wrong.append(f"{path.relative_to(package.parent)} imports {module}")
    return wrong


def test_every_room_imports_only_what_it_may() -> None:
    assert set(ALLOWED) | {"cli"} == _SUBPACKAGES, "a room without a rule here"
    wrong = wrong_imports(PACKAGE)
    assert not wrong, "imports against the layout of docs/design.md:\n" + "\n".join(wrong)


def test_a_planted_wrong_way_import_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "asynctier"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert wrong_imports(copy) == []
    (copy / "platform" / "planted.py").write_text(
        "from asynctier.scheduler.dispatch import Dispatcher\n")
    (copy / "submitter" / "planted.py").write_text(
        "def f():\n    from asynctier.scheduler import queues\n")
    assert wrong_imports(copy) == [
        "asynctier/platform/planted.py imports asynctier.scheduler.dispatch",
        "asynctier/submitter/planted.py imports asynctier.scheduler"]


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from asynctier.tailers.kafka import KafkaTailer\n"
                      "from asynctier import Retry, dev\n")
    assert sorted(_imports(source)) == ["asynctier.dev", "asynctier.platform",
                                        "asynctier.tailers.kafka"]
