"""Settings read from the environment, once, into one frozen object.

Every role (broker, processor, worker, gateway) takes a `Settings`; tests build
their own with `Settings.from_env(overrides)` instead of mutating the process
environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from streams.core.domain import Policy
from streams.core.journal import JournalLimits
from streams.observability.settings import ObservabilitySettings

__all__ = ["GatewayLimits", "Settings", "TopicNames"]

DAY_MS = 24 * 60 * 60 * 1000
_LIMITS = JournalLimits()


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The names of Threadline's seven topics, all under one prefix."""
    commands: str
    events: str
    stream: str
    dispatch: str
    dead_letter: str
    threads: str  # the processor's table changelog: the latest state of each thread
    messages: str  # the stored history: one record per message, keyed thread_id/seq

    @classmethod
    def with_prefix(cls, prefix: str) -> TopicNames:
        """The topic names under this prefix."""
        return cls(
            commands=f"{prefix}commands",
            events=f"{prefix}events",
            stream=f"{prefix}stream",
            dispatch=f"{prefix}dispatch",
            dead_letter=f"{prefix}dead-letter",
            threads=f"{prefix}threads",
            messages=f"{prefix}messages",
        )

    def all(self) -> tuple[str, ...]:
        """Every topic name, commands first."""
        return (self.commands, self.events, self.stream, self.dispatch, self.dead_letter,
                self.threads, self.messages)


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """What one tenant may cost a gateway (docs/security.md). 0 turns a limit off."""

    streams_per_tenant: int = 1_000  # open SSE streams, per gateway process
    replays_per_tenant: int = 8  # Kafka replays running at once, per gateway process
    posts_per_s: float = 20.0  # user messages a second, per gateway process (token bucket)
    post_burst: int = 50  # the bucket's size
    active_runs_per_tenant: int = 32  # across the deployment (the read model's count)
    replay_max_records: int = 100_000  # the longest partition span one replay reads
    resume_token_keys: tuple[str, ...] = ()  # first signs, all verify; () derives one

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GatewayLimits:
        """The gateway's limits from THREADLINE_* variables, defaults where unset."""
        keys = tuple(k.strip() for k in env.get("THREADLINE_RESUME_TOKEN_KEYS", "").split(",")
                     if k.strip())
        d = cls()
        return cls(
            streams_per_tenant=_int(env, "THREADLINE_TENANT_MAX_STREAMS", d.streams_per_tenant),
            replays_per_tenant=_int(env, "THREADLINE_TENANT_MAX_REPLAYS", d.replays_per_tenant),
            posts_per_s=_float(env, "THREADLINE_TENANT_POSTS_PER_S", d.posts_per_s),
            post_burst=_int(env, "THREADLINE_TENANT_POST_BURST", d.post_burst),
            active_runs_per_tenant=_int(env, "THREADLINE_TENANT_MAX_ACTIVE_RUNS",
                                        d.active_runs_per_tenant),
            replay_max_records=_int(env, "THREADLINE_REPLAY_MAX_RECORDS", d.replay_max_records),
            resume_token_keys=keys,
        )


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    return default if raw in (None, "") else int(raw)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    return default if raw in (None, "") else float(raw)


def _ms(env: Mapping[str, str], name: str, default_seconds: float) -> int:
    """A duration given in (possibly fractional) seconds, kept in milliseconds."""
    return int(_float(env, name, default_seconds) * 1000)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of a Threadline deployment, read once from the environment."""
    bootstrap_servers: str | None  # None: start or use the embedded broker
    kafka_port: int
    topic_prefix: str
    partitions: int
    replication_factor: int
    stream_retention_ms: int  # replay window of live output (and its compaction lag)
    durable_compaction_lag_ms: int  # replay window of the other topics
    http_host: str
    http_port: int
    api_keys: Mapping[str, str]  # api key -> tenant
    data_dir: Path  # RocksDB tables, broker storage
    schema_registry_url: str | None
    policy: Policy
    heartbeat_interval_ms: int
    delta_coalesce_ms: int
    decision_timeout_ms: int
    context_chars: int  # history handed to an agent with a dispatch, at most (newest first)
    max_record_bytes: int | None  # records written, at most; None: the topics' own limit
    agent: str
    instance_id: str | None  # stable per instance; default derived from data_dir
    session_timeout_ms: int  # consumer-group liveness: how fast a dead member's partitions move
    processing_guarantee: str  # "exactly_once" (default) | "at_least_once" (benchmarks only)
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    extra: Mapping[str, str] = field(default_factory=dict)
    # TLS and SASL settings of every Kafka client, as librdkafka keys (streams/kafka/clients.py)
    kafka_security: Mapping[str, str] = field(default_factory=dict)
    worker_concurrency: int = 16  # attempts one worker process runs at once
    migration_batch: int = 200  # legacy threads migrated per transaction, at most
    # Topic creation and leader election wait while the brokers make progress, and
    # fail once they made none for this long (streams/kafka/topics.py).
    topic_stall_s: float = 30.0
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)

    @property
    def topics(self) -> TopicNames:
        """The topic names under this deployment's prefix."""
        return TopicNames.with_prefix(self.topic_prefix)

    @property
    def bootstrap(self) -> str:
        """The Kafka bootstrap servers: the configured ones, else the embedded broker's port."""
        if self.bootstrap_servers:
            return self.bootstrap_servers
        return f"127.0.0.1:{self.kafka_port}"

    def with_(self, **changes: object) -> Settings:
        """A copy of these settings with some fields changed."""
        return replace(self, **changes)  # type: ignore[arg-type]

    @classmethod
    def from_env(cls, overrides: Mapping[str, str] | None = None) -> Settings:
        """Settings from THREADLINE_* environment variables (plus overrides), defaults where unset."""
        from streams.kafka.clients import security_from_env

        env: dict[str, str] = dict(os.environ)
        env.update(overrides or {})
        policy = Policy(
            max_attempts=_int(env, "THREADLINE_MAX_ATTEMPTS", 2),
            backoff_initial_ms=_ms(env, "THREADLINE_RETRY_INITIAL_S", 2.0),
            backoff_multiplier=_float(env, "THREADLINE_RETRY_MULTIPLIER", 2.0),
            backoff_max_ms=_ms(env, "THREADLINE_RETRY_MAX_S", 30.0),
            heartbeat_timeout_ms=_ms(env, "THREADLINE_HEARTBEAT_TIMEOUT_S", 60.0),
            attempt_timeout_ms=_ms(env, "THREADLINE_ATTEMPT_TIMEOUT_S", 300.0),
            max_input_chars=_int(env, "THREADLINE_MAX_INPUT_CHARS", 32_000),
            max_output_bytes=_int(env, "THREADLINE_MAX_OUTPUT_BYTES", 512 * 1024),
            idempotency_window_ms=_ms(env, "THREADLINE_IDEMPOTENCY_WINDOW_S", 24 * 3600),
            max_idempotency_keys=_int(env, "THREADLINE_MAX_IDEMPOTENCY_KEYS", 256),
            interrupt_timeout_ms=_ms(env, "THREADLINE_INTERRUPT_TIMEOUT_S", 0),
            journal=JournalLimits(
                max_steps=_int(env, "THREADLINE_MAX_STEPS", _LIMITS.max_steps),
                max_tool_calls=_int(env, "THREADLINE_MAX_TOOL_CALLS", _LIMITS.max_tool_calls),
                max_entry_bytes=_int(env, "THREADLINE_MAX_STEP_BYTES", _LIMITS.max_entry_bytes),
                max_journal_bytes=_int(env, "THREADLINE_MAX_JOURNAL_BYTES",
                                       _LIMITS.max_journal_bytes),
            ),
        )
        guarantee = env.get("THREADLINE_PROCESSING_GUARANTEE", "exactly_once")
        if guarantee not in ("exactly_once", "at_least_once"):
            raise ValueError(f"THREADLINE_PROCESSING_GUARANTEE={guarantee!r}: exactly_once or at_least_once")
        keys: dict[str, str] = {}
        for pair in filter(None, (p.strip() for p in env.get("THREADLINE_API_KEYS", "").split(","))):
            key, _, tenant = pair.partition("=")
            if not key or not tenant:
                raise ValueError(f"THREADLINE_API_KEYS entry {pair!r} is not key=tenant")
            keys[key] = tenant
        return cls(
            bootstrap_servers=env.get("KAFKA_BOOTSTRAP_SERVERS") or None,
            kafka_port=_int(env, "THREADLINE_KAFKA_PORT", 9092),
            topic_prefix=env.get("THREADLINE_TOPIC_PREFIX", "threadline."),
            partitions=_int(env, "THREADLINE_PARTITIONS", 12),
            replication_factor=_int(env, "THREADLINE_REPLICATION_FACTOR", 1),
            stream_retention_ms=_ms(env, "THREADLINE_STREAM_REPLAY_S", 30 * 60),
            durable_compaction_lag_ms=_ms(env, "THREADLINE_DURABLE_REPLAY_S", 7 * 24 * 3600),
            http_host=env.get("THREADLINE_HTTP_HOST", "127.0.0.1"),
            http_port=_int(env, "THREADLINE_HTTP_PORT", 8080),
            api_keys=keys,
            data_dir=Path(env.get("THREADLINE_DATA_DIR", "var")).resolve(),
            schema_registry_url=env.get("THREADLINE_SCHEMA_REGISTRY_URL") or None,
            policy=policy,
            heartbeat_interval_ms=_ms(env, "THREADLINE_HEARTBEAT_INTERVAL_S", 10.0),
            delta_coalesce_ms=_int(env, "THREADLINE_DELTA_COALESCE_MS", 5),
            decision_timeout_ms=_ms(env, "THREADLINE_DECISION_TIMEOUT_S", 5.0),
            context_chars=_int(env, "THREADLINE_CONTEXT_CHARS", 100_000),
            max_record_bytes=_int(env, "THREADLINE_MAX_RECORD_BYTES", 0) or None,
            agent=env.get("THREADLINE_AGENT", "builtin"),
            instance_id=env.get("THREADLINE_INSTANCE_ID") or None,
            session_timeout_ms=_ms(env, "THREADLINE_SESSION_TIMEOUT_S", 2.0),
            processing_guarantee=guarantee,
            limits=GatewayLimits.from_env(env),
            extra={k: v for k, v in env.items() if k.startswith("THREADLINE_AGENT_")},
            kafka_security=security_from_env(env),
            worker_concurrency=_int(env, "THREADLINE_WORKER_CONCURRENCY", 16),
            migration_batch=max(1, _int(env, "THREADLINE_MIGRATION_BATCH", 200)),
            topic_stall_s=_float(env, "THREADLINE_TOPIC_STALL_S", 30.0),
            observability=ObservabilitySettings.from_env(env),
        )
