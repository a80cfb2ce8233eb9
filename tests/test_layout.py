"""Imports point one way (docs/design.md, "Layout, and which way imports point"):
``cli -> tailers -> delay_streams -> platform``; ``platform`` imports none of the others;
``queue`` (the store) uses ``platform``; ``dev`` (the local stack and test support) is used by
the CLI, the tests and the benchmarks only (the CLI passes its fault hook in)."""

from __future__ import annotations

import ast
from pathlib import Path

import asynctier

PACKAGE = Path(asynctier.__file__).resolve().parent

#: Per subpackage, the prefixes of the ``asynctier`` modules it may import.
ALLOWED: dict[str, tuple[str, ...]] = {
    "platform": ("asynctier.platform",),
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


def test_every_subpackage_imports_only_what_it_may() -> None:
    assert set(ALLOWED) | {"cli"} == _SUBPACKAGES, "a subpackage without a rule here"
    wrong = []
    for sub, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / sub).rglob("*.py")):
            for module in _imports(path):
                if not any(_within(module, prefix) for prefix in allowed):
                    wrong.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert not wrong, "imports against the layout of docs/design.md:\n" + "\n".join(wrong)


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from asynctier.tailers.kafka import KafkaTailer\n"
                      "from asynctier import Retry, dev\n")
    assert sorted(_imports(source)) == ["asynctier.dev", "asynctier.platform",
                                        "asynctier.tailers.kafka"]
