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
    "schedules": ("asynctier.schedules", "asynctier.queue", "asynctier.platform"),
    "dev": ("asynctier.dev", "asynctier.platform"),
    # the operator console: a page over the rooms, the reading `asynctier lag` makes
    "console": ("asynctier.console", "asynctier.cli.lag", "asynctier.cli.quota",
                "asynctier.cli.tenant",
                "asynctier.delay_streams", "asynctier.queue", "asynctier.schedules",
                "asynctier.scheduler.queues", "asynctier.platform"),
    "demo": ("asynctier.demo", "asynctier.delay_streams", "asynctier.queue",
             "asynctier.schedules", "asynctier.platform"),
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


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_imports(path: Path, known: set[str]) -> set[str]:
    """The ``asynctier`` modules ``path`` imports when it is loaded (module level, outside
    ``if TYPE_CHECKING``), each resolved to a module of ``known``."""
    found: set[str] = set()
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from pkg import sub`` loads the submodule; any other name, the module itself
            subs = {f"{node.module}.{a.name}" for a in node.names} & known
            found |= subs
            if len(subs) < len(node.names) and node.module in known:
                found.add(node.module)
    return found


def import_circles(package: Path) -> list[list[str]]:
    """The circles of module-level imports in ``package`` (strongly connected groups)."""
    paths = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph = {m: _top_imports(p, set(paths)) - {m} for m, p in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in graph[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while True:
                n = stack.pop()
                group.append(n)
                if n == m:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return circles


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert import_circles(PACKAGE) == []


def test_a_planted_circle_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "asynctier"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tailers" / "one.py").write_text("from asynctier.tailers import two\n")
    (copy / "tailers" / "two.py").write_text("from asynctier.tailers.one import X\n")
    assert import_circles(copy) == [["asynctier.tailers.one", "asynctier.tailers.two"]]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_room_holds_more_than_a_quarter_of_the_code() -> None:
    """The heart of the platform is found by its name, not hidden in a room that holds
    everything (issue 42): no room over 25% of the package's lines."""
    total = sum(_lines(p) for p in PACKAGE.rglob("*.py"))
    sizes = {room: sum(_lines(p) for p in (PACKAGE / room).rglob("*.py"))
             for room in _SUBPACKAGES}
    over = {room: f"{n / total:.0%}" for room, n in sizes.items() if n > total / 4}
    assert not over, f"rooms over a quarter of {total} lines: {over}"


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > 60:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                f"{node.name} ({length} lines)")
    assert not long, "functions over 60 lines:\n" + "\n".join(long)
