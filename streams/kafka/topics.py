"""Topic management: create the declared topics idempotently and check existing ones.

The declarations are the contract in `streams.topics`; this module talks to the
brokers (admin client) to make them true, and reads the record size limit.
"""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    TopicMetadata,
)

from streams.config import Settings
from streams.kafka.clients import librdkafka_config
from streams.topics import TopicSpec, topic_specs

__all__ = ["TopicMismatch", "ensure_specs", "ensure_topics", "record_limit"]

# librdkafka's own cap on a produced message (message.max.bytes), and room left under
# the broker's cap for the record batch header around a single record.
PRODUCER_MAX_BYTES = 1_000_000
_BATCH_OVERHEAD = 512


class TopicMismatch(RuntimeError):
    """An existing topic disagrees with the declared contract."""


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(librdkafka_config(settings, log_level=0))


class _Progress:
    """A wait bounded by progress, not by the clock: it fails only once `stall_s` went
    by without any of its counts growing. On a loaded machine the brokers create
    topics and elect leaders slowly, but they keep getting somewhere; a broker that
    is gone, or a request that can never succeed, gets nowhere."""

    def __init__(self, stall_s: float) -> None:
        self.stall_s = stall_s
        self._best: dict[str, int] = {}
        self._since = time.monotonic()

    def advance(self, what: str, done: int) -> None:
        """`done` of `what` are done now; more than ever before restarts the clock."""
        if done > self._best.get(what, -1):
            self._best[what] = done
            self._since = time.monotonic()

    def stalled(self) -> bool:
        """Whether `stall_s` passed since the last advance."""
        return time.monotonic() - self._since > self.stall_s

    def remaining(self) -> float:
        """Seconds left before the wait counts as stalled (at least 1, for a request's timeout)."""
        return max(1.0, self.stall_s - (time.monotonic() - self._since))


def ensure_topics(settings: Settings, stall_s: float | None = None) -> list[TopicSpec]:
    """Create missing topics; raise TopicMismatch if an existing one disagrees."""
    return ensure_specs(settings, topic_specs(settings), stall_s)


def ensure_specs(settings: Settings, specs: list[TopicSpec], stall_s: float | None = None) -> list[TopicSpec]:
    """Create the missing topics of `specs`, check the existing ones against them,
    and return once every partition has a serving leader.

    Each wait goes on while the brokers make progress (a topic created, shown in
    metadata or described, a partition given a leader or served) and fails once
    none was made for `stall_s` seconds (default: the `THREADLINE_TOPIC_STALL_S`
    setting)."""
    progress = _Progress(settings.topic_stall_s if stall_s is None else stall_s)
    admin = _admin(settings)
    existing = _metadata(admin, progress)
    missing = [s for s in specs if s.name not in existing]
    while missing:
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=s.config) for s in missing],
            operation_timeout=progress.remaining(),
        )
        again = []
        for spec, fut in zip(missing, futures.values(), strict=True):
            try:
                fut.result()
            except Exception as exc:  # a racing creator is fine
                if "TOPIC_ALREADY_EXISTS" in str(exc):
                    continue
                if not _transient(exc) or progress.stalled():
                    raise
                again.append(spec)  # e.g. a connection to a broker dropped under load
        missing = again
        progress.advance("created", len(specs) - len(missing))
        if missing:
            time.sleep(0.5)
    _verify(admin, specs, progress, settings)
    return specs


def record_limit(settings: Settings, timeout_s: float = 30.0) -> int:
    """The largest record (key and value) that every core topic accepts: the smallest
    `max.message.bytes` among them, the producer's own cap, less batch overhead."""
    admin = _admin(settings)
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in settings.topics.all()]
    limit = PRODUCER_MAX_BYTES
    for future in admin.describe_configs(resources, request_timeout=timeout_s).values():
        entry = future.result(timeout=timeout_s).get("max.message.bytes")
        if entry is not None and entry.value is not None:
            limit = min(limit, int(entry.value))
    return limit - _BATCH_OVERHEAD


def _metadata(admin: AdminClient, progress: _Progress) -> dict[str, TopicMetadata]:
    """The cluster's topics; a request that fails on the way is tried again until the
    wait stalls (a broker just started or under load may not answer at once)."""
    while True:
        try:
            topics: dict[str, TopicMetadata] = admin.list_topics(timeout=progress.remaining()).topics
            return topics
        except KafkaException:
            if progress.stalled():
                raise
            time.sleep(0.5)


def _transient(exc: Exception) -> bool:
    """A creation that failed on the way (the connection, not the request): retry it."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (err.retriable() or err.code() in (
        KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT, KafkaError._TIMED_OUT))


def _cleanup_policies(admin: AdminClient, names: list[str], progress: _Progress) -> dict[str, str]:
    """Each topic's `cleanup.policy`, all asked in one request (a role's start asked
    ten times in a row: 35 ms of a restart, issue #22)."""
    # A broker that has not yet heard of a new topic answers UNKNOWN_TOPIC_OR_PART.
    found: dict[str, str] = {}
    pending = list(names)
    while True:
        resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in pending]
        futures = admin.describe_configs(resources, request_timeout=progress.remaining())
        again = []
        for resource, future in futures.items():
            try:
                found[resource.name] = future.result()["cleanup.policy"].value
            except KafkaException as exc:
                if not (exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART or _transient(exc)) \
                        or progress.stalled():
                    raise
                again.append(resource.name)
        progress.advance("described", len(found))
        if not again:
            return found
        pending = again
        time.sleep(0.2)


def _verify(admin: AdminClient, specs: list[TopicSpec], progress: _Progress, settings: Settings) -> None:
    while True:
        topics = _metadata(admin, progress)
        shown = [s for s in specs if s.name in topics and not topics[s.name].error]
        progress.advance("in metadata", len(shown))
        if len(shown) == len(specs):
            break
        if progress.stalled():
            absent = [s.name for s in specs if s not in shown]
            raise TopicMismatch(f"{len(absent)} topics not in metadata, none appeared in "
                                f"{progress.stall_s:.0f}s, e.g. {absent[0]}. {_brokers(admin, set())}")
        time.sleep(0.1)
    problems = []
    for s in specs:
        n = len(topics[s.name].partitions)
        if n != s.partitions:
            problems.append(f"{s.name}: has {n} partitions, the contract says {s.partitions}")
    policies = _cleanup_policies(admin, [spec.name for spec in specs], progress)
    for spec in specs:
        actual = policies[spec.name]
        if set(actual.split(",")) != set(spec.config["cleanup.policy"].split(",")):
            problems.append(f"{spec.name}: cleanup.policy={actual}, the contract says "
                            f"{spec.config['cleanup.policy']}")
    if problems:
        raise TopicMismatch("existing topics disagree with the contract:\n  " + "\n  ".join(problems))
    _wait_until_served(admin, settings, specs, progress)


def _probe(settings: Settings) -> Consumer:
    """A client for the watermark queries of `_wait_until_served`."""
    return Consumer(librdkafka_config(settings, **{"group.id": "threadline-topics", "log_level": 0}))


def _wait_until_served(admin: AdminClient, settings: Settings, specs: list[TopicSpec],
                       progress: _Progress) -> None:
    """Wait until every partition's leader has created its log. Metadata shows a new
    topic before that; a produce in the gap fails and, seen on a loaded machine,
    librdkafka's idempotent producer can then take the retry for a duplicate and
    report success for records never written. Progress: a partition given a leader
    (metadata), or served (its leader answers a watermark query).

    A probe that failed is replaced by a new client. A broker that has not yet
    applied a topic's creation answers that the topic is unknown; librdkafka caches
    that answer, and the entry expires only after every entry cached before it
    (`metadata.max.age.ms`, 15 min): until then each query of the topic fails at once
    from the cache (_UNKNOWN_PARTITION) without asking a broker. So a three-node
    cluster's start in a suite run failed: 9 partitions (three topics' worth) "without
    a serving leader" for 90 s, while each broker had created their logs and led its
    share (tests/streams/kafka/test_topics_served.py)."""
    probe: Consumer | None = None  # made when a partition must be asked alone
    why: dict[tuple[str, int], str] = {}  # the last reason a partition was not served
    try:
        pending = [TopicPartition(s.name, p) for s in specs for p in range(s.partitions)]
        served = 0
        while pending:
            led = _with_leader(admin, pending, progress)
            progress.advance("with a leader", served + len(led))
            waiting, failed = [], False
            at_once = _served_at_once(admin, [tp for tp in pending
                                              if (tp.topic, tp.partition) in led], progress)
            for tp in pending:
                if (tp.topic, tp.partition) not in led:
                    why[tp.topic, tp.partition] = "no leader in the metadata"
                    waiting.append(tp)
                    continue
                if (tp.topic, tp.partition) not in at_once:
                    probe = probe or _probe(settings)
                    try:
                        probe.get_watermark_offsets(tp, timeout=min(5.0, progress.remaining()))
                    except KafkaException as exc:
                        why[tp.topic, tp.partition] = f"its offsets not answered: {_error_name(exc)}"
                        waiting.append(tp)
                        failed = True
                        continue
                served += 1
                progress.advance("served", served)
            pending = waiting
            if pending and progress.stalled():
                raise TopicMismatch(
                    f"{len(pending)} partitions have no serving leader, and none got one in "
                    f"{progress.stall_s:.0f}s; {_diagnosis(admin, pending, why)}")
            if failed and probe is not None:
                probe.close()
                probe = None
            if pending:
                time.sleep(0.2)
    finally:
        if probe is not None:
            probe.close()


def _served_at_once(admin: AdminClient, tps: list[TopicPartition], progress: _Progress) \
        -> set[tuple[str, int]]:
    """The partitions of `tps` whose leaders answered one end-offset query for them all,
    on the admin client already connected (a request per broker: a role's start asked
    each of 120 partitions in turn, 48 ms of a restart, issue #22; a new client's first
    query, at once, sometimes waited 0.7 s for its leaders). The others are then asked
    alone on a probe of their own, as before, to learn which and why."""
    if not tps:
        return set()
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    try:
        futures = admin.list_offsets(
            {TopicPartition(tp.topic, tp.partition): latest for tp in tps},
            request_timeout=min(5.0, progress.remaining()))
    except KafkaException:
        return set()
    answered = set()
    for tp, future in futures.items():
        try:
            future.result()
        except Exception:  # a partition not served: asked alone below
            continue
        answered.add((tp.topic, tp.partition))
    return answered


def _error_name(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.name() if isinstance(err, KafkaError) else str(exc)


def _diagnosis(admin: AdminClient, pending: list[TopicPartition],
               why: dict[tuple[str, int], str], shown: int = 6) -> str:
    """Why `pending` are not served, for the error: each one's last failure, its
    leader, replicas and ISR, and the brokers (`_brokers`)."""
    try:
        topics = admin.list_topics(timeout=5).topics
    except KafkaException:
        topics = {}
    parts, replicas = [], set()
    for tp in pending[:shown]:
        topic = topics.get(tp.topic)
        meta = topic.partitions.get(tp.partition) if topic is not None else None
        where = "not in the metadata" if meta is None else \
            f"leader {meta.leader}, replicas {meta.replicas}, ISR {meta.isrs}"
        replicas |= set(meta.replicas if meta is not None else ())
        reason = why.get((tp.topic, tp.partition), "not asked yet")
        parts.append(f"{tp.topic}[{tp.partition}]: {reason} ({where})")
    more = f"; and {len(pending) - shown} more" if len(pending) > shown else ""
    return f"{'; '.join(parts)}{more}. {_brokers(admin, replicas)}"


def _brokers(admin: AdminClient, replicas: set[int]) -> str:
    """The brokers the cluster counts, for an error: those registered with the controller
    and unfenced (only those are in a KRaft broker's metadata), and which of `replicas`
    are not among them."""
    try:
        cluster = admin.describe_cluster(request_timeout=5).result()
    except KafkaException as exc:
        return f"The cluster did not describe itself: {_error_name(exc)}"
    serving = sorted(n.id for n in cluster.nodes)
    absent = sorted(replicas - set(serving))
    return (f"Brokers registered and unfenced: {serving}"
            + (f"; replicas not among them (fenced or down): {absent}" if absent else ""))


def _with_leader(admin: AdminClient, partitions: list[TopicPartition], progress: _Progress,
                 ) -> set[tuple[str, int]]:
    """Which of `partitions` the cluster metadata shows with a leader."""
    try:
        topics = admin.list_topics(timeout=progress.remaining()).topics
    except KafkaException:
        return set()
    led = set()
    for tp in partitions:
        topic = topics.get(tp.topic)
        meta = topic.partitions.get(tp.partition) if topic is not None else None
        if meta is not None and meta.error is None and meta.leader >= 0:
            led.add((tp.topic, tp.partition))
    return led
