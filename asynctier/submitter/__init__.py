"""The Submitter: one ingestion API (gRPC, batched) in front of every binding's source.

It validates workloads (:mod:`.validation`), protects the platform from overload (a
tenant's enqueue capacity in Redis, a backlog cap per topic, a bounded number of workloads
in process) and writes them durably to the binding's queue topic or Kafka topic before it
answers (:mod:`.service`). :mod:`.protocol` is the wire, shared with the SDK
(``asynctier.client``).
"""
