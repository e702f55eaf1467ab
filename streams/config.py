"""Settings read from the environment, once, into one frozen object.

Every role (broker, processor, worker, gateway) takes a `Settings`: what they share
(Kafka, the topics, the run policy, observability) at its top, each role's own in
`settings.processor`, `settings.worker` and `settings.gateway`. Tests build their own
with `Settings.from_env(overrides)` instead of mutating the process environment. The
variables are declared, typed, bounded and given their defaults once, in a section
per role or concern (`streams.env.Section`): `KafkaEnv`, `KafkaSecurityEnv`,
`PolicyEnv`, `ProcessorEnv`, `WorkerEnv`, `GatewayEnv`, and `ObservabilityEnv` beside
the observability settings. Defaults that a runtime object already has (`Policy`,
`JournalLimits`, `GatewayLimits`) are read from it. docs/operations.md lists every
variable.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from streams.core.domain import Policy
from streams.core.journal import JournalLimits
from streams.env import Section, SettingsError, parse_list, parse_pairs
from streams.observability.settings import ObservabilityEnv, ObservabilitySettings

__all__ = ["ENV_SECTIONS", "GatewayEnv", "GatewayLimits", "GatewaySettings", "KafkaEnv",
           "KafkaSecurityEnv", "PolicyEnv", "ProcessingGuarantee", "ProcessorEnv",
           "ProcessorSettings", "Settings", "SettingsError", "TopicNames", "WorkerEnv",
           "WorkerSettings"]


ProcessingGuarantee = Literal["exactly_once", "at_least_once"]
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Port = Annotated[int, Field(ge=0, le=65_535)]  # 0: a free one
Seconds = Annotated[float, Field(gt=0)]
SecondsOrZero = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]  # 0 turns the bound off or means none, as documented


def _ms(seconds: float) -> int:
    """A duration given in (possibly fractional) seconds, kept in milliseconds."""
    return int(seconds * 1000)


def _upper(raw: object) -> object:
    return raw.strip().upper() if isinstance(raw, str) else raw


# `${NAME}` in an agent setting: a reference to the environment variable NAME.
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

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
    @functools.lru_cache(maxsize=64)  # per record on the roles' paths (Settings.topics)
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
    # Thread copies in flight at once, per gateway process: one copies up to 100
    # records of up to the record limit in one transaction, so each costs far more
    # than a post (docs/branches.md, "Copies").
    copies_per_tenant: int = 2
    posts_per_s: float = 20.0  # user messages a second, per gateway process (token bucket)
    post_burst: int = 50  # the bucket's size
    active_runs_per_tenant: int = 32  # across the deployment (the read model's count)
    replay_max_records: int = 100_000  # the longest partition span one replay reads
    resume_token_keys: tuple[str, ...] = ()  # first signs, all verify; () derives one


_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")
_POLICY = Policy()
_JOURNAL = JournalLimits()
_LIMITS = GatewayLimits()


class KafkaEnv(Section):
    """Where every role finds Kafka, the topics' shape and its own identity."""

    keep_empty = frozenset({"THREADLINE_TOPIC_PREFIX"})  # "": topics named without a prefix

    bootstrap_servers: str | None = Field(None, alias="KAFKA_BOOTSTRAP_SERVERS")
    kafka_port: Port = Field(9092, alias="THREADLINE_KAFKA_PORT")
    topic_prefix: str = Field("threadline.", alias="THREADLINE_TOPIC_PREFIX")
    partitions: int = Field(12, gt=0, alias="THREADLINE_PARTITIONS")
    replication_factor: int = Field(1, gt=0, alias="THREADLINE_REPLICATION_FACTOR")
    stream_replay_s: Seconds = Field(30 * 60, alias="THREADLINE_STREAM_REPLAY_S")
    durable_replay_s: SecondsOrZero = Field(7 * 24 * 3600, alias="THREADLINE_DURABLE_REPLAY_S")
    session_timeout_s: Seconds = Field(2.0, alias="THREADLINE_SESSION_TIMEOUT_S")
    topic_stall_s: Seconds = Field(30.0, alias="THREADLINE_TOPIC_STALL_S")
    schema_registry_url: str | None = Field(None, alias="THREADLINE_SCHEMA_REGISTRY_URL")
    data_dir: Path = Field(Path("var"), alias="THREADLINE_DATA_DIR")
    instance_id: str | None = Field(None, alias="THREADLINE_INSTANCE_ID")


class KafkaSecurityEnv(Section):
    """TLS and SASL of every Kafka client (docs/security.md)."""

    # Unset: SASL_PLAINTEXT with a SASL user, else PLAINTEXT.
    protocol: Annotated[SecurityProtocol | None, BeforeValidator(_upper)] = Field(
        None, alias="THREADLINE_KAFKA_SECURITY_PROTOCOL")
    sasl_username: str = Field("", alias="THREADLINE_KAFKA_SASL_USERNAME")
    sasl_password: str = Field("", alias="THREADLINE_KAFKA_SASL_PASSWORD")
    sasl_mechanism: str = Field("SCRAM-SHA-512", alias="THREADLINE_KAFKA_SASL_MECHANISM")
    ssl_ca_location: str | None = Field(None, alias="THREADLINE_KAFKA_SSL_CA_LOCATION")

    @model_validator(mode="after")
    def _sasl_needs_a_user(self) -> KafkaSecurityEnv:
        if self.security_protocol.startswith("SASL_") and not self.sasl_username:
            raise ValueError(f"security protocol {self.security_protocol} needs "
                             "THREADLINE_KAFKA_SASL_USERNAME")
        return self

    @property
    def security_protocol(self) -> SecurityProtocol:
        """The protocol given, else the one the SASL user implies."""
        return self.protocol or ("SASL_PLAINTEXT" if self.sasl_username else "PLAINTEXT")

    def librdkafka(self) -> dict[str, str]:
        """These settings as librdkafka keys (none for PLAINTEXT)."""
        protocol = self.security_protocol
        config: dict[str, str] = {"security.protocol": protocol} if protocol != "PLAINTEXT" else {}
        if protocol.startswith("SASL_"):
            config["sasl.mechanism"] = self.sasl_mechanism
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password
        if self.ssl_ca_location and protocol.endswith("SSL"):
            config["ssl.ca.location"] = self.ssl_ca_location
        return config


class PolicyEnv(Section):
    """A run's retries, timeouts and bounds: the processor decides by them."""

    max_attempts: int = Field(_POLICY.max_attempts, gt=0, alias="THREADLINE_MAX_ATTEMPTS")
    retry_initial_s: SecondsOrZero = Field(_POLICY.backoff_initial_ms / 1000,
                                           alias="THREADLINE_RETRY_INITIAL_S")
    retry_multiplier: float = Field(_POLICY.backoff_multiplier, ge=1,
                                    alias="THREADLINE_RETRY_MULTIPLIER")
    retry_max_s: SecondsOrZero = Field(_POLICY.backoff_max_ms / 1000, alias="THREADLINE_RETRY_MAX_S")
    heartbeat_timeout_s: Seconds = Field(_POLICY.heartbeat_timeout_ms / 1000,
                                         alias="THREADLINE_HEARTBEAT_TIMEOUT_S")
    attempt_timeout_s: Seconds = Field(_POLICY.attempt_timeout_ms / 1000,
                                       alias="THREADLINE_ATTEMPT_TIMEOUT_S")
    max_input_chars: int = Field(_POLICY.max_input_chars, gt=0, alias="THREADLINE_MAX_INPUT_CHARS")
    max_output_bytes: int = Field(_POLICY.max_output_bytes, gt=0, alias="THREADLINE_MAX_OUTPUT_BYTES")
    idempotency_window_s: SecondsOrZero = Field(_POLICY.idempotency_window_ms / 1000,
                                                alias="THREADLINE_IDEMPOTENCY_WINDOW_S")
    max_idempotency_keys: Count = Field(_POLICY.max_idempotency_keys,
                                        alias="THREADLINE_MAX_IDEMPOTENCY_KEYS")
    interrupt_timeout_s: SecondsOrZero = Field(_POLICY.interrupt_timeout_ms / 1000,
                                               alias="THREADLINE_INTERRUPT_TIMEOUT_S")
    max_steps: int = Field(_JOURNAL.max_steps, gt=0, alias="THREADLINE_MAX_STEPS")
    max_tool_calls: Count = Field(_JOURNAL.max_tool_calls, alias="THREADLINE_MAX_TOOL_CALLS")
    max_step_bytes: int = Field(_JOURNAL.max_entry_bytes, gt=0, alias="THREADLINE_MAX_STEP_BYTES")
    max_journal_bytes: int = Field(_JOURNAL.max_journal_bytes, gt=0,
                                   alias="THREADLINE_MAX_JOURNAL_BYTES")

    def policy(self) -> Policy:
        """The run policy these variables describe (durations in milliseconds)."""
        return Policy(
            max_attempts=self.max_attempts,
            backoff_initial_ms=_ms(self.retry_initial_s),
            backoff_multiplier=self.retry_multiplier,
            backoff_max_ms=_ms(self.retry_max_s),
            heartbeat_timeout_ms=_ms(self.heartbeat_timeout_s),
            attempt_timeout_ms=_ms(self.attempt_timeout_s),
            max_input_chars=self.max_input_chars,
            max_output_bytes=self.max_output_bytes,
            idempotency_window_ms=_ms(self.idempotency_window_s),
            max_idempotency_keys=self.max_idempotency_keys,
            interrupt_timeout_ms=_ms(self.interrupt_timeout_s),
            journal=JournalLimits(max_steps=self.max_steps, max_tool_calls=self.max_tool_calls,
                                  max_entry_bytes=self.max_step_bytes,
                                  max_journal_bytes=self.max_journal_bytes),
        )


class ProcessorEnv(Section):
    """The command processor's own options."""

    processing_guarantee: ProcessingGuarantee = Field("exactly_once",
                                                      alias="THREADLINE_PROCESSING_GUARANTEE")
    max_record_bytes: Count = Field(0, alias="THREADLINE_MAX_RECORD_BYTES")  # 0: the topics' own
    # 0 was taken as 1 before the variables were typed, and still is.
    migration_batch: Count = Field(200, alias="THREADLINE_MIGRATION_BATCH")


class WorkerEnv(Section):
    """The agent worker's options (the agent's own are THREADLINE_AGENT_*, in `Settings.worker.extra`)."""

    agent: str = Field("builtin", alias="THREADLINE_AGENT")
    heartbeat_interval_s: Seconds = Field(10.0, alias="THREADLINE_HEARTBEAT_INTERVAL_S")
    delta_coalesce_ms: Count = Field(5, alias="THREADLINE_DELTA_COALESCE_MS")
    context_chars: Count = Field(100_000, alias="THREADLINE_CONTEXT_CHARS")
    worker_concurrency: int = Field(16, gt=0, alias="THREADLINE_WORKER_CONCURRENCY")


class GatewayEnv(Section):
    """The gateway's listener, keys and per-tenant limits (its SSE knobs: gateway.keys)."""

    keep_empty = frozenset({"THREADLINE_HTTP_HOST"})  # "": every interface

    http_host: str = Field("127.0.0.1", alias="THREADLINE_HTTP_HOST")
    http_port: Port = Field(8080, alias="THREADLINE_HTTP_PORT")
    api_keys: Annotated[dict[str, str], BeforeValidator(parse_pairs)] = Field(
        default_factory=dict, alias="THREADLINE_API_KEYS")
    decision_timeout_s: Seconds = Field(5.0, alias="THREADLINE_DECISION_TIMEOUT_S")
    tenant_max_streams: Count = Field(_LIMITS.streams_per_tenant, alias="THREADLINE_TENANT_MAX_STREAMS")
    tenant_max_replays: Count = Field(_LIMITS.replays_per_tenant, alias="THREADLINE_TENANT_MAX_REPLAYS")
    tenant_max_copies: Count = Field(_LIMITS.copies_per_tenant, alias="THREADLINE_TENANT_MAX_COPIES")
    tenant_posts_per_s: float = Field(_LIMITS.posts_per_s, ge=0, alias="THREADLINE_TENANT_POSTS_PER_S")
    tenant_post_burst: Count = Field(_LIMITS.post_burst, alias="THREADLINE_TENANT_POST_BURST")
    tenant_max_active_runs: Count = Field(_LIMITS.active_runs_per_tenant,
                                          alias="THREADLINE_TENANT_MAX_ACTIVE_RUNS")
    replay_max_records: Count = Field(_LIMITS.replay_max_records, alias="THREADLINE_REPLAY_MAX_RECORDS")
    resume_token_keys: Annotated[tuple[str, ...], BeforeValidator(parse_list)] = Field(
        _LIMITS.resume_token_keys, alias="THREADLINE_RESUME_TOKEN_KEYS")
    # Browser apps served from these origins may call the gateway (CORS); none by default.
    cors_origins: Annotated[tuple[str, ...], BeforeValidator(parse_list)] = Field(
        (), alias="THREADLINE_CORS_ORIGINS")
    # Where the other gateways reach this one (as Kafka Streams' application.server):
    # set, the gateways of a deployment share the stream's partitions (docs/scaling.md);
    # unset, this gateway reads every partition, alone or beside others.
    advertised_url: str | None = Field(None, alias="THREADLINE_GATEWAY_URL")
    # In a group: how many other gateways keep a standby copy of each partition's read
    # model, so that a dead gateway's partitions serve again at once (docs/scaling.md).
    standbys: Count = Field(1, alias="THREADLINE_GATEWAY_STANDBYS")
    # Under sustained traffic the gateway's consumers batch their fetches for up to
    # this long (gateway.kafka.FetchBatching); 0: every fetch returns at the first record.
    fetch_batch_ms: Count = Field(5, le=100, alias="THREADLINE_GATEWAY_FETCH_BATCH_MS")

    @field_validator("advertised_url")
    @classmethod
    def _advertised(cls, url: str | None) -> str | None:
        if url is None or url == "":
            return None
        if not _ORIGIN.fullmatch(url.rstrip("/")):
            raise ValueError(f"{url!r} is not a gateway URL: scheme://host[:port], no path")
        return url.rstrip("/")

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: tuple[str, ...]) -> tuple[str, ...]:
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin: scheme://host[:port], no path "
                                 "(or * for any, in development)")
        return tuple(origin.lower() for origin in origins)

    def limits(self) -> GatewayLimits:
        """What one tenant may cost this gateway."""
        return GatewayLimits(
            streams_per_tenant=self.tenant_max_streams,
            replays_per_tenant=self.tenant_max_replays,
            copies_per_tenant=self.tenant_max_copies,
            posts_per_s=self.tenant_posts_per_s,
            post_burst=self.tenant_post_burst,
            active_runs_per_tenant=self.tenant_max_active_runs,
            replay_max_records=self.replay_max_records,
            resume_token_keys=self.resume_token_keys,
        )


# Every section `Settings.from_env` reads, for docs/operations.md's check. The gateway's
# `Options` and the connector's `ConnectorConfig` have their own, beside them.
ENV_SECTIONS: tuple[type[Section], ...] = (KafkaEnv, KafkaSecurityEnv, PolicyEnv, ProcessorEnv,
                                           WorkerEnv, GatewayEnv, ObservabilityEnv)

@dataclass(frozen=True, slots=True)
class ProcessorSettings:
    """The command processor's own settings (`ProcessorEnv`)."""

    processing_guarantee: ProcessingGuarantee  # at_least_once: benchmarks only
    max_record_bytes: int | None  # records written, at most; None: the topics' own limit
    migration_batch: int  # legacy threads migrated per transaction, at most

    @classmethod
    def from_section(cls, env: ProcessorEnv) -> ProcessorSettings:
        """These settings from their section."""
        return cls(processing_guarantee=env.processing_guarantee,
                   max_record_bytes=env.max_record_bytes or None,
                   migration_batch=max(1, env.migration_batch))


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """The agent worker's own settings (`WorkerEnv`), and its agent's (`extra`)."""

    agent: str
    heartbeat_interval_ms: int
    delta_coalesce_ms: int
    context_chars: int  # history handed to an agent with a dispatch, at most (newest first)
    concurrency: int  # attempts one worker process runs at once
    extra: Mapping[str, str]  # THREADLINE_AGENT_*: the agent's own settings
    # The variables the agent's settings name as `${NAME}` (secrets by reference, e.g.
    # an MCP server's header), read here so that no agent module reads the environment.
    referenced: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_section(cls, env: WorkerEnv, extra: Mapping[str, str],
                     environ: Mapping[str, str] | None = None) -> WorkerSettings:
        """These settings from their section and the agent's variables (and from
        `environ`, the variables those name as `${NAME}`)."""
        names = {m for v in extra.values() for m in _REFERENCE.findall(v)}
        referenced = {n: (environ or {})[n] for n in sorted(names) if n in (environ or {})}
        return cls(agent=env.agent, heartbeat_interval_ms=_ms(env.heartbeat_interval_s),
                   delta_coalesce_ms=env.delta_coalesce_ms, context_chars=env.context_chars,
                   concurrency=env.worker_concurrency, extra=extra, referenced=referenced)


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The gateway's own settings (`GatewayEnv`; its SSE knobs: gateway.keys)."""

    http_host: str
    http_port: int
    api_keys: Mapping[str, str]  # api key -> tenant
    decision_timeout_ms: int
    limits: GatewayLimits
    cors_origins: tuple[str, ...] = ()  # origins whose browser apps may call (CORS)
    advertised_url: str | None = None  # set: this gateway shares partitions (GatewayEnv)
    standbys: int = 1  # standby copies of each partition's read model, in a group
    fetch_batch_ms: int = 5  # a consumer's fetch wait under sustained traffic (0: off)

    @classmethod
    def from_section(cls, env: GatewayEnv) -> GatewaySettings:
        """These settings from their section."""
        return cls(http_host=env.http_host, http_port=env.http_port, api_keys=env.api_keys,
                   decision_timeout_ms=_ms(env.decision_timeout_s), limits=env.limits(),
                   cors_origins=env.cors_origins, advertised_url=env.advertised_url,
                   standbys=env.standbys, fetch_batch_ms=env.fetch_batch_ms)


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting of a Threadline deployment, read once from the environment: what
    every role shares (Kafka, the topics, the run policy, observability), and each
    role's own (`processor`, `worker`, `gateway`).

    Build it with `from_env`: its defaults are the sections' (above), not written here."""
    # Kafka and the topics (KafkaEnv, KafkaSecurityEnv)
    bootstrap_servers: str | None  # None: start or use the embedded broker
    kafka_port: int
    topic_prefix: str
    partitions: int
    replication_factor: int
    stream_retention_ms: int  # replay window of live output (and its compaction lag)
    durable_compaction_lag_ms: int  # replay window of the other topics
    schema_registry_url: str | None
    data_dir: Path  # RocksDB tables, broker storage
    instance_id: str | None  # stable per instance; default derived from data_dir
    session_timeout_ms: int  # consumer-group liveness: how fast a dead member's partitions move
    # Topic creation and leader election wait while the brokers make progress, and
    # fail once they made none for this long (streams/kafka/topics.py).
    topic_stall_s: float
    # TLS and SASL settings of every Kafka client, as librdkafka keys (streams/kafka/clients.py)
    kafka_security: Mapping[str, str]
    # A run's rules (PolicyEnv): the processor decides by them, the worker keeps to them
    policy: Policy
    # Every role (ObservabilityEnv)
    observability: ObservabilitySettings
    # Each role's own
    processor: ProcessorSettings
    worker: WorkerSettings
    gateway: GatewaySettings

    @property
    def topics(self) -> TopicNames:
        """The topic names under this deployment's prefix."""
        return TopicNames.with_prefix(self.topic_prefix)

    def group_id(self, role: Literal["processor", "worker", "connector", "gateway"]) -> str:
        """The consumer group of a role's instances (part of the contract: operators
        and autoscalers read its lag)."""
        return f"{self.topic_prefix}{role}"

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
        """Settings from THREADLINE_* environment variables (plus overrides), defaults where unset.

        Raises `SettingsError` (a `ValueError`) naming each variable whose value is refused."""
        env: dict[str, str] = dict(os.environ)
        env.update(overrides or {})
        kafka = KafkaEnv.read(env)
        return cls(
            bootstrap_servers=kafka.bootstrap_servers,
            kafka_port=kafka.kafka_port,
            topic_prefix=kafka.topic_prefix,
            partitions=kafka.partitions,
            replication_factor=kafka.replication_factor,
            stream_retention_ms=_ms(kafka.stream_replay_s),
            durable_compaction_lag_ms=_ms(kafka.durable_replay_s),
            schema_registry_url=kafka.schema_registry_url,
            data_dir=kafka.data_dir.resolve(),
            instance_id=kafka.instance_id,
            session_timeout_ms=_ms(kafka.session_timeout_s),
            topic_stall_s=kafka.topic_stall_s,
            kafka_security=KafkaSecurityEnv.read(env).librdkafka(),
            policy=PolicyEnv.read(env).policy(),
            observability=ObservabilitySettings.from_env(env),
            processor=ProcessorSettings.from_section(ProcessorEnv.read(env)),
            worker=WorkerSettings.from_section(
                WorkerEnv.read(env), {k: v for k, v in env.items() if k.startswith("THREADLINE_AGENT_")},
                env),
            gateway=GatewaySettings.from_section(GatewayEnv.read(env)),
        )
