"""The Avro schemas in ``schemas/``, loaded and parsed once per process."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import fastavro


def schema_json(name: str) -> Any:
    """The schema ``schemas/<name>.avsc`` (shipped inside the package) as written: JSON."""
    return json.loads(resources.files("asynctier").joinpath("schemas", f"{name}.avsc")
                      .read_text())


@cache
def load_schema(name: str) -> Any:
    """The parsed schema ``schemas/<name>.avsc``."""
    return fastavro.parse_schema(schema_json(name))
