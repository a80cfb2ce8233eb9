"""Settings: one typed value, read from ``asynctier.toml`` and the environment, passed in.

Nothing here is global. A process builds one :class:`Settings` at start (the CLI does it
from ``--config`` / ``ASYNCTIER_CONFIG``) and hands it to what it runs.

The file::

    [asynctier]
    prefix = "asynctier"                 # topic / group / Redis key prefix
    data_dir = ".asynctier"              # the dev stack's data
    allow_modules = ["myapp.jobs"]       # the scheduler runs functions from these only
    schedulers = ["127.0.0.1:50051"]     # used when Redis membership is unavailable
    scheduler_listen = "127.0.0.1:50051"
    submitter_listen = "127.0.0.1:50061"  # asynctier run submitter
    submitters = ["127.0.0.1:50061"]     # the Submitters the SDK spreads calls over
    metrics_port = 0                     # 0: no metrics endpoint
    run_once_window = "15m"              # how long a success is remembered (run once)
    topic_replication_factor = 0         # the platform's topics; 0: 3 on 3+ brokers
    topic_min_insync_replicas = 0        # 0: 2 with 3 replicas or more
    region = "local"                     # this process's region (placement.py)
    spill_share = 0.5                    # at most this share of calls leaves a full region
    spill_window = 100                   # ... over the last this many calls
    spill_order = ["eu-west", "us-east"] # regions to spill to first (others after, by name)
    restarts = "first_s=1,max_s=60"      # a failed loop's restarts (supervise.py)
    delay_headers = "packed"             # "separate": while upgrading from a version
                                         # that reads only separate delay headers

    [kafka]                              # passed to librdkafka as is
    "bootstrap.servers" = "127.0.0.1:9092"
    "security.protocol" = "SASL_PLAINTEXT"

    [redis]
    url = "redis://127.0.0.1:6379/0"

    [schema_registry]                    # confluent-kafka's SchemaRegistryClient keys,
    "basic.auth.user.info" = "user:secret"  # for every --schema-registry URL
    "ssl.ca.location" = "certs/ca.pem"

    [tracing]                            # OpenTelemetry spans over OTLP (gRPC); off by
    enabled = true                       # default, OTEL_* variables win over these
    endpoint = "http://127.0.0.1:4317"
    sample_ratio = 0.01                  # the share of new traces kept

    [queue]                              # the queue source's PostgreSQL shards
    shards = ["postgresql://asynctier@127.0.0.1:5432/asynctier"]

    [scheduler]                          # asynctier run scheduler
    workers = 8                          # chunks running at once
    max_queued_items = 20000             # items it holds: its capacity in the membership
    tier_weights = { urgent = 8, normal = 4, batch = 1 }   # shares under contention
    cpu_bound_item_ms = 0.1              # CPU-bound sync functions above it: processes (0: never)
    stop_grace = "30s"                   # on SIGTERM, how long runs under way may finish
    [rpc]                                # the platform's own gRPC: see rpcsecurity.py
    ca = "certs/ca.pem"
    cert = "certs/server.pem"
    key = "certs/server-key.pem"
    token = "..."                        # optional
    insecure = false                     # true: plaintext (loopback development)

Environment overrides: ``ASYNCTIER_KAFKA_BOOTSTRAP``, ``ASYNCTIER_KAFKA_SASL_USERNAME``
and ``_PASSWORD`` (``[kafka]`` ``sasl.username`` and ``sasl.password``, kept out of the
file), ``ASYNCTIER_REDIS_URL``,
``ASYNCTIER_QUEUE_SHARDS`` (comma separated; a shard's own hosts keep theirs),
``ASYNCTIER_PREFIX``, ``ASYNCTIER_ALLOW_MODULES`` (comma separated),
``ASYNCTIER_SCHEDULERS`` (comma separated), ``ASYNCTIER_DATA_DIR``,
``ASYNCTIER_TOPIC_REPLICATION_FACTOR``, ``ASYNCTIER_TOPIC_MIN_INSYNC_REPLICAS``,
``ASYNCTIER_REGION``, ``ASYNCTIER_SPILL_SHARE``, ``ASYNCTIER_SPILL_ORDER`` (comma separated),
``ASYNCTIER_RESTARTS`` (as ``restarts``), and
``ASYNCTIER_RPC_CA``, ``_CERT``, ``_KEY``, ``_TOKEN``, ``_INSECURE`` for ``[rpc]``.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from asynctier.platform.durations import parse_duration
from asynctier.platform.errors import ConfigError, refuse_unknown_keys
from asynctier.platform.names import DEFAULT_PREFIX, Names
from asynctier.platform.rpcsecurity import RpcSecurity
from asynctier.platform.rpcsecurity import from_mapping as rpc_from_mapping
from asynctier.platform.rpcsecurity import with_env as rpc_with_env
from asynctier.platform.supervise import RestartPolicy
from asynctier.platform.tracing import TracingSettings

DEFAULT_KAFKA_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_SCHEDULER = "127.0.0.1:50051"
DEFAULT_SUBMITTER = "127.0.0.1:50061"
#: The dev stack's PostgreSQL (``asynctier dev up``).
DEFAULT_QUEUE_SHARD = "postgresql://asynctier@127.0.0.1:5432/asynctier"

#: How long the scheduler remembers a record's success for the run-once guard (``15m``): a
#: record is read again after a crash within the group's session timeout and a restart,
#: minutes at most; two delay copies of one record come back within that window of each
#: other.
DEFAULT_RUN_ONCE_WINDOW_S = 900.0


def _delay_headers(value: object) -> str:
    """``delay_headers``: ``packed`` or ``separate``."""
    if value not in ("packed", "separate"):
        raise ValueError(f"delay_headers = {value!r}: say \"packed\" (the default) or "
                         "\"separate\" (while tailers of a version that reads only separate "
                         "delay headers still run)")
    return str(value)


def _window(value: Any) -> float:
    """``run_once_window``: a duration (``15m``, ``1h``) of at least 1 minute."""
    seconds = parse_duration(str(value))
    if seconds < 60:
        raise ValueError(f"run_once_window = {value!r} is too short: a record read again "
                         "after a crash comes back within a minute or more; use 1m or longer")
    return seconds


#: The ``[kafka]`` keys that may come from the environment instead of the file: secrets,
#: which a deployment keeps apart from the configuration (a Kubernetes Secret).
KAFKA_ENV = {"ASYNCTIER_KAFKA_SASL_USERNAME": "sasl.username",
             "ASYNCTIER_KAFKA_SASL_PASSWORD": "sasl.password"}
#: The longest ``[scheduler] stop_grace``.
MAX_STOP_GRACE_S = 7200.0


def redact_url(url: str) -> str:
    """``url`` without its password (``redis://user:***@host``), for logs and errors."""
    scheme, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in auth:
        return url
    return f"{scheme}://{auth.split(':', 1)[0]}:***@{host}"


REDIS_AUTH_HINT = ("Redis refused the credentials: fix the user and password in [redis] url "
                   "(env ASYNCTIER_REDIS_URL), redis://USER:PASSWORD@host:port/db")


def _split(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def split_shards(value: str) -> tuple[str, ...]:
    """``ASYNCTIER_QUEUE_SHARDS``: shards separated by commas, where a comma inside one
    shard's address (its hosts: ``postgresql://u@a:5432,b:5432/db``, or ``host=a,b``)
    does not separate: a new shard starts at ``postgres(ql)://`` or ``key=``."""
    parts = re.split(r",(?=\s*(?:postgres(?:ql)?://|[A-Za-z_]+=))", value)
    return tuple(p.strip() for p in parts if p.strip())


#: The region of a process that names none (``[asynctier] region``, ``ASYNCTIER_REGION``).
DEFAULT_REGION = "local"
#: The share of calls a tailer sends out of its full region at most (``spill_share``)...
DEFAULT_SPILL_SHARE = 0.5
#: ... over its last this many calls (``spill_window``).
DEFAULT_SPILL_WINDOW = 100
#: What a region name may hold.
_REGION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def check_region(value: Any, what: str = "region") -> str:
    """A region name (letters, digits, ``.``, ``-``, ``_``; at most 63), else ValueError."""
    if not isinstance(value, str) or not _REGION_RE.fullmatch(value):
        raise ValueError(f"{what} = {value!r} is not a region name: use letters, digits, "
                         "'.', '-', '_' (at most 63), such as \"eu-west\"")
    return value


def check_spill_share(value: Any) -> float:
    """``spill_share``: a number from 0 (never leave a live region) to 1, else ValueError."""
    share = float(value)
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"spill_share = {value!r}: give a share from 0 (calls leave the "
                         "region only when it has no live scheduler) to 1 (no cap)")
    return share


def _spill_window(value: Any) -> int:
    window = int(value)
    if not 1 <= window <= 100_000:
        raise ValueError(f"spill_window = {value!r}: give 1 to 100000 calls")
    return window


def _spill_order(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = _split(value)
    if not isinstance(value, list | tuple):
        raise ValueError(f"spill_order = {value!r}: give a list of regions, such as "
                         '["eu-west", "us-east"]')
    return tuple(check_region(v, "spill_order entry") for v in value)


#: The tiers a ``[scheduler] tier_weights`` table may weigh.
TIER_NAMES = ("urgent", "normal", "batch")


def _scheduler_table(table: dict[str, Any], source: str) -> tuple[int | None,
                                                                  dict[str, float]]:
    """``[scheduler]``: (workers or None, tier weights named there)."""
    known = {"workers", "tier_weights", "max_queued_items", "cpu_bound_item_ms",
             "stop_grace"}
    refuse_unknown_keys(table, known, "scheduler", source)
    workers = table.get("workers")
    if workers is not None and (not isinstance(workers, int) or not 1 <= workers <= 1024):
        raise ConfigError(f"{source}: [scheduler] workers = {workers!r}: give 1 to 1024")
    weights = table.get("tier_weights", {})
    if not isinstance(weights, dict) or set(weights) - set(TIER_NAMES):
        raise ConfigError(f"{source}: [scheduler] tier_weights must be a table of "
                          f"{', '.join(TIER_NAMES)}, such as "
                          "{ urgent = 8, normal = 4, batch = 1 }")
    for tier, weight in weights.items():
        if not isinstance(weight, int | float) or not 0 < weight <= 1000:
            raise ConfigError(f"{source}: [scheduler] tier_weights.{tier} = {weight!r}: "
                              "give a number above 0, at most 1000")
    return workers, {str(t): float(w) for t, w in weights.items()}


def _queue_shards(queue: dict[str, Any], source: str) -> tuple[str, ...]:
    """``[queue] shards``: a non-empty list of postgresql:// DSNs."""
    refuse_unknown_keys(queue, {"shards"}, "queue", source)
    shards = queue.get("shards", [DEFAULT_QUEUE_SHARD])
    if (not isinstance(shards, list) or not shards
            or not all(isinstance(s, str) and s.strip() for s in shards)):
        raise ConfigError(f"{source}: [queue] shards must be a non-empty list of "
                          'PostgreSQL URLs, such as ["postgresql://user@host:5432/db"]')
    return tuple(s.strip() for s in shards)


@dataclass(frozen=True)
class Settings:
    """Everything a process needs to reach Kafka and Redis and to name things."""

    kafka: Mapping[str, str] = field(
        default_factory=lambda: {"bootstrap.servers": DEFAULT_KAFKA_BOOTSTRAP}
    )
    redis_url: str = DEFAULT_REDIS_URL
    prefix: str = DEFAULT_PREFIX
    data_dir: Path = Path(".asynctier")
    allow_modules: tuple[str, ...] = ()
    schedulers: tuple[str, ...] = (DEFAULT_SCHEDULER,)
    scheduler_listen: str = DEFAULT_SCHEDULER
    #: Where ``asynctier run submitter`` serves, and the Submitters clients spread over.
    submitter_listen: str = DEFAULT_SUBMITTER
    submitters: tuple[str, ...] = (DEFAULT_SUBMITTER,)
    metrics_port: int = 0
    #: How long the scheduler remembers a record's success for the run-once guard.
    run_once_window_s: float = DEFAULT_RUN_ONCE_WINDOW_S
    #: How a delay record carries its platform headers: ``packed`` in one, or
    #: ``separate`` (docs/operations.md, Upgrades). Both are read.
    delay_headers: str = "packed"
    #: The queue source's PostgreSQL databases (``[queue] shards``), one per shard.
    queue_shards: tuple[str, ...] = (DEFAULT_QUEUE_SHARD,)
    #: ``[scheduler] workers``: chunks a scheduler runs at once (None: its default).
    scheduler_workers: int | None = None
    #: ``[scheduler] tier_weights``: the tiers' shares (the ones not named keep 8:4:1).
    tier_weights: Mapping[str, float] = field(default_factory=dict)
    #: Replication of the topics the platform creates (0: chosen from the broker count,
    #: see :func:`asynctier.platform.kafka.replication_for`).
    topic_replication_factor: int = 0
    topic_min_insync_replicas: int = 0
    #: How the platform's own gRPC (scheduler, Submitter) is secured (``[rpc]``).
    rpc: RpcSecurity = field(default_factory=RpcSecurity)
    #: ``[scheduler] max_queued_items``: the items a scheduler holds (None: its default);
    #: the capacity it registers, full when its queued and running items reach it.
    scheduler_max_queued: int | None = None
    #: ``[scheduler] cpu_bound_item_ms``: a sync function measured CPU-bound above this
    #: much CPU an item runs in worker processes (0: never; None: the scheduler's default).
    cpu_bound_item_ms: float | None = None
    #: ``[scheduler] stop_grace``: how long a stopping scheduler lets the calls under way
    #: finish (None: its default); runs cut then are read again.
    scheduler_stop_grace_s: float | None = None
    #: This process's region: a scheduler registers in it, a tailer prefers it.
    region: str = DEFAULT_REGION
    #: The share of its calls a tailer sends out of its region while that region is full
    #: (0: only when it has no live scheduler; 1: no cap), over ``spill_window`` calls.
    spill_share: float = DEFAULT_SPILL_SHARE
    spill_window: int = DEFAULT_SPILL_WINDOW
    #: The regions a tailer spills to first, in this order (the others after, by name).
    spill_order: tuple[str, ...] = ()
    #: How a failed tailer or background loop is restarted, and when it is failing
    #: (``restarts``, :class:`~asynctier.platform.supervise.RestartPolicy`).
    restarts: RestartPolicy = field(default_factory=RestartPolicy)
    #: ``[schema_registry]``: credentials, TLS files and timeouts of the schema registries
    #: that registry-framed bindings name (confluent-kafka's SchemaRegistryClient keys).
    schema_registry: Mapping[str, str] = field(default_factory=dict)
    #: ``[tracing]``: OpenTelemetry spans, and where they are exported (off by default).
    tracing: TracingSettings = field(default_factory=TracingSettings)

    @property
    def names(self) -> Names:
        """Topic, group and key names under this prefix."""
        return Names(self.prefix)

    @property
    def kafka_bootstrap(self) -> str:
        """The bootstrap servers (``host:port,...``)."""
        return self.kafka.get("bootstrap.servers", DEFAULT_KAFKA_BOOTSTRAP)

    @property
    def redis_display(self) -> str:
        """The Redis URL for messages: its password replaced by ``***``."""
        return redact_url(self.redis_url)

    def kafka_config(self, **extra: Any) -> dict[str, Any]:
        """A librdkafka configuration: the ``[kafka]`` table plus ``extra``."""
        conf: dict[str, Any] = dict(self.kafka)
        conf.update(extra)
        return conf

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None,
             env: Mapping[str, str] | None = None) -> Settings:
        """Settings from a TOML file (``path``, else ``$ASYNCTIER_CONFIG``, else
        ``./asynctier.toml`` when present), then the environment on top."""
        env = os.environ if env is None else env
        chosen = path or env.get("ASYNCTIER_CONFIG")
        if chosen is None and Path("asynctier.toml").is_file():
            chosen = "asynctier.toml"
        settings = cls.from_file(chosen) if chosen else cls()
        return settings.from_env(env)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Settings:
        """Settings from one TOML file; a bad file raises ConfigError saying what to fix."""
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        return cls.from_mapping(doc, source=str(path))

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], source: str = "config") -> Settings:
        """Settings from a parsed TOML document."""
        unknown = set(doc) - {"asynctier", "kafka", "redis", "queue", "scheduler", "rpc",
                              "schema_registry", "tracing"}
        if unknown:
            raise ConfigError(
                f"{source}: unknown table(s) {sorted(unknown)}; expected [asynctier], "
                "[kafka], [redis], [queue], [scheduler], [rpc], [schema_registry], [tracing]"
            )
        workers, tier_weights = _scheduler_table(dict(doc.get("scheduler", {})), source)
        main = dict(doc.get("asynctier", {}))
        kafka = {str(k): str(v) for k, v in dict(doc.get("kafka", {})).items()}
        kafka.setdefault("bootstrap.servers", DEFAULT_KAFKA_BOOTSTRAP)
        redis = dict(doc.get("redis", {}))
        queue_shards = _queue_shards(dict(doc.get("queue", {})), source)
        rpc = rpc_from_mapping(dict(doc.get("rpc", {})), source)
        known = {"prefix", "data_dir", "allow_modules", "schedulers", "scheduler_listen",
                 "submitter_listen", "submitters", "metrics_port", "run_once_window",
                 "topic_replication_factor", "topic_min_insync_replicas", "region",
                 "spill_share", "spill_window", "spill_order", "restarts", "delay_headers"}
        refuse_unknown_keys(main, known, "asynctier", source)
        try:
            return cls(
                kafka=kafka,
                redis_url=str(redis.get("url", DEFAULT_REDIS_URL)),
                prefix=str(main.get("prefix", DEFAULT_PREFIX)),
                data_dir=Path(main.get("data_dir", ".asynctier")),
                allow_modules=tuple(main.get("allow_modules", ())),
                schedulers=tuple(main.get("schedulers", (DEFAULT_SCHEDULER,))),
                scheduler_listen=str(main.get("scheduler_listen", DEFAULT_SCHEDULER)),
                submitter_listen=str(main.get("submitter_listen", DEFAULT_SUBMITTER)),
                submitters=tuple(main.get("submitters", (DEFAULT_SUBMITTER,))),
                metrics_port=int(main.get("metrics_port", 0)),
                run_once_window_s=_window(main.get("run_once_window",
                                                   DEFAULT_RUN_ONCE_WINDOW_S)),
                queue_shards=queue_shards,
                scheduler_workers=workers,
                tier_weights=tier_weights,
                topic_replication_factor=int(main.get("topic_replication_factor", 0)),
                topic_min_insync_replicas=int(main.get("topic_min_insync_replicas", 0)),
                rpc=rpc,
                scheduler_max_queued=_max_queued(doc.get("scheduler", {})),
                cpu_bound_item_ms=_cpu_bound_item_ms(doc.get("scheduler", {})),
                scheduler_stop_grace_s=_stop_grace(doc.get("scheduler", {})),
                region=check_region(main.get("region", DEFAULT_REGION)),
                spill_share=check_spill_share(main.get("spill_share", DEFAULT_SPILL_SHARE)),
                spill_window=_spill_window(main.get("spill_window", DEFAULT_SPILL_WINDOW)),
                spill_order=_spill_order(main.get("spill_order", [])),
                restarts=RestartPolicy.parse(str(main.get("restarts", ""))),
                delay_headers=_delay_headers(main.get("delay_headers", "packed")),
                schema_registry=_registry_table(dict(doc.get("schema_registry", {})), source),
                tracing=TracingSettings.from_table(dict(doc.get("tracing", {})), source),
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    def from_env(self, env: Mapping[str, str] | None = None) -> Settings:
        """A copy with the ``ASYNCTIER_*`` environment variables applied."""
        env = os.environ if env is None else env
        changes: dict[str, Any] = {}
        if env.get("ASYNCTIER_KAFKA_BOOTSTRAP"):
            kafka = dict(self.kafka)
            kafka["bootstrap.servers"] = env["ASYNCTIER_KAFKA_BOOTSTRAP"]
            changes["kafka"] = kafka
        secret_kafka = {key: env[name] for name, key in KAFKA_ENV.items() if env.get(name)}
        if secret_kafka:
            changes["kafka"] = {**changes.get("kafka", self.kafka), **secret_kafka}
        if env.get("ASYNCTIER_REDIS_URL"):
            changes["redis_url"] = env["ASYNCTIER_REDIS_URL"]
        if env.get("ASYNCTIER_PREFIX"):
            changes["prefix"] = env["ASYNCTIER_PREFIX"]
        if env.get("ASYNCTIER_DATA_DIR"):
            changes["data_dir"] = Path(env["ASYNCTIER_DATA_DIR"])
        if env.get("ASYNCTIER_ALLOW_MODULES"):
            changes["allow_modules"] = _split(env["ASYNCTIER_ALLOW_MODULES"])
        if env.get("ASYNCTIER_SCHEDULERS"):
            changes["schedulers"] = _split(env["ASYNCTIER_SCHEDULERS"])
        if env.get("ASYNCTIER_QUEUE_SHARDS"):
            changes["queue_shards"] = split_shards(env["ASYNCTIER_QUEUE_SHARDS"])
        if env.get("ASYNCTIER_SUBMITTERS"):
            changes["submitters"] = _split(env["ASYNCTIER_SUBMITTERS"])
        if env.get("ASYNCTIER_SUBMITTER_LISTEN"):
            changes["submitter_listen"] = env["ASYNCTIER_SUBMITTER_LISTEN"]
        if env.get("ASYNCTIER_SCHEDULER_LISTEN"):
            changes["scheduler_listen"] = env["ASYNCTIER_SCHEDULER_LISTEN"]
        for name in ("topic_replication_factor", "topic_min_insync_replicas"):
            value = env.get(f"ASYNCTIER_{name.upper()}")
            if value:
                try:
                    changes[name] = int(value)
                except ValueError as exc:
                    raise ConfigError(f"ASYNCTIER_{name.upper()}={value!r} is not a whole "
                                      "number") from exc
        changes.update(_region_env(env))
        if env.get("ASYNCTIER_RESTARTS"):
            try:
                changes["restarts"] = RestartPolicy.parse(env["ASYNCTIER_RESTARTS"])
            except ValueError as exc:
                raise ConfigError(f"ASYNCTIER_RESTARTS: {exc}") from exc
        rpc = rpc_with_env(self.rpc, env)
        if rpc is not self.rpc:
            changes["rpc"] = rpc
        traced = self.tracing.with_env(env)
        if traced != self.tracing:
            changes["tracing"] = traced
        return replace(self, **changes) if changes else self


#: The ``[schema_registry]`` keys a process passes to its registry clients.
REGISTRY_KEYS = frozenset({
    "basic.auth.user.info", "basic.auth.credentials.source", "ssl.ca.location",
    "ssl.certificate.location", "ssl.key.location", "ssl.key.password", "timeout",
    "max.retries", "retries.wait.ms", "retries.max.wait.ms", "proxy"})


def _registry_table(table: dict[str, Any], source: str) -> dict[str, str]:
    refuse_unknown_keys(table, REGISTRY_KEYS, "schema_registry", source)
    for key in ("timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms"):
        try:
            if key in table and float(table[key]) < 0:
                raise ValueError
        except (TypeError, ValueError):
            raise ConfigError(f"{source}: [schema_registry] {key} = {table[key]!r} is not "
                              "a number of 0 or more") from None
    return {str(k): str(v) for k, v in table.items()}


def _max_queued(table: Any) -> int | None:
    value = dict(table).get("max_queued_items")
    if value is None:
        return None
    if not isinstance(value, int) or not 1 <= value <= 10_000_000:
        raise ValueError(f"[scheduler] max_queued_items = {value!r}: give 1 to 10000000")
    return value


def _cpu_bound_item_ms(table: Any) -> float | None:
    value = dict(table).get("cpu_bound_item_ms")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e6:
        raise ValueError(f"[scheduler] cpu_bound_item_ms = {value!r}: give a number of "
                         "milliseconds, 0 to keep CPU-bound functions in threads")
    return float(value)


def _stop_grace(table: Any) -> float | None:
    value = dict(table).get("stop_grace")
    if value is None:
        return None
    seconds = parse_duration(str(value))
    if not 1 <= seconds <= MAX_STOP_GRACE_S:
        raise ValueError(f"[scheduler] stop_grace = {value!r}: give 1s to 2h (the longest "
                         "binding timeout is 1h)")
    return seconds


def _region_env(env: Mapping[str, str]) -> dict[str, Any]:
    """``ASYNCTIER_REGION``, ``ASYNCTIER_SPILL_SHARE``, ``ASYNCTIER_SPILL_ORDER``."""
    changes: dict[str, Any] = {}
    try:
        if env.get("ASYNCTIER_REGION"):
            changes["region"] = check_region(env["ASYNCTIER_REGION"], "ASYNCTIER_REGION")
        if env.get("ASYNCTIER_SPILL_SHARE"):
            changes["spill_share"] = check_spill_share(env["ASYNCTIER_SPILL_SHARE"])
        if env.get("ASYNCTIER_SPILL_ORDER"):
            changes["spill_order"] = _spill_order(env["ASYNCTIER_SPILL_ORDER"])
    except ValueError as exc:
        raise ConfigError(f"environment: {exc}") from exc
    return changes
