"""``python -m asynctier.dev fetch``: prefetch Kafka's jars and the schema registry, and
build the Go tools (helm, kubecheck, jaeger) when missing (scripts/setup.sh)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from asynctier.dev.gotools import HELM, JAEGER, KUBECHECK
from asynctier.dev.kafka import KafkaJars
from asynctier.dev.registry import RegistryApp
from asynctier.platform.errors import ServiceError

log = logging.getLogger(__name__)




def _main(argv: Sequence[str]) -> int:
    """``python -m asynctier.dev fetch``: prefetch Kafka's jars and the schema registry,
    build helm, kubecheck and jaeger."""
    if list(argv) != ["fetch"]:
        print("usage: python -m asynctier.dev fetch", file=sys.stderr)
        return 2
    try:
        libs = KafkaJars().ensure()
        print(f"Kafka jars ready in {libs}")
        registry = RegistryApp().ensure()
        print(f"Apicurio Registry ready in {registry.parent}")
        for tool in (HELM, KUBECHECK, JAEGER):
            print(f"{tool.name} ready: {tool.ensure()}")
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
