"""The registry-framed Avro no-op drain against the JSON drain of the same records, in the
same run.

    python -m bench.registry_drain [--records 100000] [--rounds 2]

One Kafka, one Redis and one Apicurio Registry (the dev-stack code). The same documents
(``{"id", "t0", "pad"}``, about 100 bytes as JSON) go to two topics: as JSON, and framed
by confluent-kafka's ``AvroSerializer`` (writer schema registered in the registry). Each
round drains both with the default ``asynctier run`` on ``bench.noop:noop``, JSON and Avro
in alternating order; the Avro binding decodes in the scheduler through the registry's
serdes. Prints each drain's rate and the Avro/JSON ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from asynctier import dev as devstack
from bench.records import PARTITIONS, create_topic
from bench.scenarios import drain_asynctier, platform
from bench.stack import Services, machine, services

SCHEMA = {"type": "record", "name": "Row", "namespace": "bench",
          "fields": [{"name": "id", "type": "long"}, {"name": "t0", "type": "double"},
                     {"name": "pad", "type": "string"}]}


def _load(svc: Services, url: str, json_topic: str, avro_topic: str, n: int) -> None:
    ser = AvroSerializer(SchemaRegistryClient({"url": url}), json.dumps(SCHEMA))
    ctx = SerializationContext(avro_topic, MessageField.VALUE)
    producer = Producer({"bootstrap.servers": svc.kafka_bootstrap, "linger.ms": 50,
                         "batch.size": 1_000_000})
    for topic in (json_topic, avro_topic):
        create_topic(svc.kafka_bootstrap, topic)
    for i in range(n):
        doc = {"id": i, "t0": round(time.time(), 6), "pad": "x" * 60}
        for topic, value in ((json_topic, json.dumps(doc, separators=(",", ":")).encode()),
                             (avro_topic, ser(doc, ctx))):
            while True:
                try:
                    producer.produce(topic, value, partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.05)
    if producer.flush(120) != 0:
        raise RuntimeError("records left undelivered")


def _drain(svc: Services, folder: Path, label: str, topic: str, n: int,
           *extra: str) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    with platform(svc, folder, label) as run:
        run.bind("noop", topic, "noop", *extra)
        return drain_asynctier(svc, run, topic, n, "noop").rate


def main() -> None:
    """Run the rounds and print the rates."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(machine())
    with services() as svc, tempfile.TemporaryDirectory(prefix="bench-registry-") as tmp:
        folder = Path(tmp)
        registry = devstack.start_test_registry(folder)
        try:
            rates: dict[str, list[float]] = {"json": [], "avro": []}
            for r in range(args.rounds):
                topics = {"json": f"bench.reg{r}.json", "avro": f"bench.reg{r}.avro"}
                _load(svc, registry.url, topics["json"], topics["avro"], args.records)
                order = ("json", "avro") if r % 2 == 0 else ("avro", "json")
                for kind in order:
                    extra = (("--format", "avro", "--schema-registry", registry.url)
                             if kind == "avro" else ())
                    rate = _drain(svc, folder / f"{kind}{r}", f"{kind}{r}", topics[kind],
                                  args.records, *extra)
                    rates[kind].append(rate)
                    print(f"round {r + 1} {kind:>4}: {rate:,.0f} records/s", flush=True)
        finally:
            registry.stop()
    j, a = statistics.median(rates["json"]), statistics.median(rates["avro"])
    print(f"median json {j:,.0f}/s, avro (registry-framed) {a:,.0f}/s: {a / j:.2f}x")


if __name__ == "__main__":
    main()
