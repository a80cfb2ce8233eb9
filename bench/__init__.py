"""Benchmarks: asynctier against the raw Kafka loop, Celery and Dramatiq (``make bench``)."""
