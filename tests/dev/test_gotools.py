"""The Go tools of the chart's tests: built once per version or source, then found at once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from asynctier.dev.gotools import HELM, KUBECHECK, GoTool
from asynctier.platform.errors import ServiceError


def test_a_cached_tool_is_found_without_go(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tool = GoTool("helm", package=HELM.package, version=HELM.version, cache_dir=tmp_path)
    tool.path.parent.mkdir(parents=True)
    tool.path.write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", "")
    assert tool.ensure() == tool.path == tmp_path / "go-tools" / "helm-v4.3.2" / "helm"


def test_without_go_the_error_says_what_to_install(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    tool = GoTool("helm", package=HELM.package, version=HELM.version, cache_dir=tmp_path)
    with pytest.raises(ServiceError, match="built with Go, which is not installed"):
        tool.ensure()


def test_a_changed_source_is_built_anew(tmp_path: Path) -> None:
    assert KUBECHECK.source is not None
    source = tmp_path / "kubecheck"
    shutil.copytree(KUBECHECK.source, source)
    tool = GoTool("kubecheck", source=source, cache_dir=tmp_path)
    assert tool.key == KUBECHECK.key
    (source / "main.go").write_text((source / "main.go").read_text() + "\n// changed\n")
    assert tool.key != KUBECHECK.key and tool.path != KUBECHECK.path
