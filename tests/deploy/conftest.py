"""The chart's tests: helm, built once by the set-up (python -m asynctier.dev fetch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asynctier.dev.gotools import HELM


@pytest.fixture(scope="session")
def helm() -> Path:
    return HELM.ensure()
