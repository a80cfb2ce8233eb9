"""The local stack and test support: real services started by the project itself.

``asynctier dev up`` runs them for development (:class:`DevStack`); the tests and the
benchmarks start their own on free loopback ports (:mod:`asynctier.dev.testing`). The
fault-injection hook of the fault tests is here too (:mod:`asynctier.dev.faults`). Nothing
in the runtime imports this package: the CLI composes it in.
"""

from asynctier.dev.jaeger import JaegerNode
from asynctier.dev.kafka import (
    KafkaJars,
    KafkaNode,
    kafka_answers,
    kafka_cluster_id,
    pom_kafka_version,
)
from asynctier.dev.postgres import PostgresNode, postgres_answers
from asynctier.dev.process import (
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_KAFKA_PORT,
    DEFAULT_POSTGRES_PORT,
    DEFAULT_REDIS_PORT,
    Daemon,
    default_cache_dir,
    default_pom,
    free_port,
    process_cmdline,
    require_binary,
)
from asynctier.dev.redis import RedisNode, redis_answers
from asynctier.dev.registry import RegistryApp, RegistryNode, registry_answers
from asynctier.dev.stack import DevStack, ServiceStatus, round_trip
from asynctier.dev.testing import (
    postgres_data_root,
    random_password,
    start_test_jaeger,
    start_test_kafka,
    start_test_postgres,
    start_test_redis,
    start_test_registry,
)

__all__ = [
    "DEFAULT_CONTROLLER_PORT",
    "DEFAULT_KAFKA_PORT",
    "DEFAULT_POSTGRES_PORT",
    "DEFAULT_REDIS_PORT",
    "Daemon",
    "DevStack",
    "JaegerNode",
    "KafkaJars",
    "KafkaNode",
    "PostgresNode",
    "RedisNode",
    "RegistryApp",
    "RegistryNode",
    "ServiceStatus",
    "default_cache_dir",
    "default_pom",
    "free_port",
    "kafka_answers",
    "kafka_cluster_id",
    "pom_kafka_version",
    "postgres_answers",
    "postgres_data_root",
    "process_cmdline",
    "random_password",
    "redis_answers",
    "registry_answers",
    "require_binary",
    "round_trip",
    "start_test_jaeger",
    "start_test_kafka",
    "start_test_postgres",
    "start_test_redis",
    "start_test_registry",
]
