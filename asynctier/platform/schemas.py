"""The Avro schemas in ``schemas/``, loaded and parsed once per process."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import fastavro


@cache
def load_schema(name: str) -> Any:
    """The parsed schema ``schemas/<name>.avsc`` (shipped inside the package)."""
    text = resources.files("asynctier").joinpath("schemas", f"{name}.avsc").read_text()
    return fastavro.parse_schema(json.loads(text))
