"""The owner map: which gateway serves which partition of the stream, learned
through Kafka.

The gateways that advertise a URL (`THREADLINE_GATEWAY_URL`) form one consumer
group on the stream topic (`StreamFeed`): each consumes the partitions the group
assigns it, and serves the live streams of their threads. On every assignment a
gateway writes what it owns to the compacted `gateways` topic (one partition): key
`<instance>/<generation>`, value JSON `{"instance", "url", "generation",
"partitions", "at_ms", "streams"}` (`streams`: its open SSE streams by tenant, the
`MAX_TENANTS_LISTED` tenants with most; absent in claims of earlier versions); it
then tombstones its own previous key. Every such
gateway reads the whole topic and keeps `OwnerMap`: per partition, the claim of the
newest group generation wins, so a dead gateway's claims lose to the next
assignment's. Keys two generations old are tombstoned by whoever sees them after
writing its own: their writer left the group (a crash leaves no tombstone). Each
gateway writes its claim again every session timeout (at least 1 s); one not read
again for three of those and a second is a dead gateway's and counts no more (after
every gateway died at once, the group starts again at generation 1). The refresh
carries the gateway's stream counts of that moment: each gateway admits a tenant's
stream against the tenant's streams here plus those the other live gateways last
wrote (`OwnerMap.streams_elsewhere`), so the cap holds across the group, give or take
the streams opened elsewhere since their last refresh.

Nothing here is static configuration: a gateway added or removed is in the map after
the group's next rebalance.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from gateway.cluster.sticky import standbys
from gateway.kafka import new_consumer, run_forever, stop_client, stop_task
from streams.aio import within
from streams.config import Settings
from streams.kafka.clients import aiokafka_config
from streams.topics import TopicSpec

__all__ = ["MAX_TENANTS_LISTED", "Claim", "OwnerBoard", "OwnerMap", "owners_topic"]

log = logging.getLogger("threadline.gateway")

_MAX_VALUE_BYTES = 64 * 1024  # a claim names at most a few thousand partitions
# Tenants whose stream counts a claim lists at most (those with most streams), and the
# bytes their names may take: inside the value's bound beside the partitions.
MAX_TENANTS_LISTED = 500
_MAX_TENANT_BYTES = 32 * 1024


def owners_topic(settings: Settings) -> TopicSpec:
    """The `gateways` topic: one partition (a few records per rebalance), compacted."""
    return TopicSpec(f"{settings.topic_prefix}gateways", 1, settings.replication_factor,
                     {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                      "min.insync.replicas": "2" if settings.replication_factor >= 3 else "1"})


@dataclass(frozen=True, slots=True)
class Claim:
    """One gateway's partitions as of one group generation."""

    instance: str
    url: str
    generation: int
    partitions: frozenset[int]
    # Its gateway's open SSE streams by tenant when written (not part of its identity).
    streams: Mapping[str, int] = field(default_factory=dict, compare=False)
    # The active runs of the partitions it holds, by tenant, when written.
    runs: Mapping[str, int] = field(default_factory=dict, compare=False)
    # The partitions of other gateways it keeps a standby copy of, when written.
    standbys: frozenset[int] = field(default_factory=frozenset, compare=False)

    @property
    def key(self) -> bytes:
        """Its record's key in the `gateways` topic."""
        return f"{self.instance}/{self.generation}".encode()

    def to_json(self) -> bytes:
        """Its record's value."""
        return json.dumps({"instance": self.instance, "url": self.url,
                           "generation": self.generation, "partitions": sorted(self.partitions),
                           "at_ms": int(time.time() * 1000), "streams": _most(self.streams),
                           "runs": _most(self.runs), "standbys": sorted(self.standbys)}).encode()

    @classmethod
    def from_json(cls, value: bytes) -> Claim:
        """A claim from its record's value; ValueError if it is not one."""
        if len(value) > _MAX_VALUE_BYTES:
            raise ValueError("claim too large")
        data = json.loads(value)
        partitions, standbys = data["partitions"], data.get("standbys", [])
        streams, runs = data.get("streams", {}), data.get("runs", {})
        if not isinstance(data["instance"], str) or not isinstance(data["url"], str) or \
                not isinstance(data["generation"], int) or not isinstance(partitions, list) or \
                not all(isinstance(p, int) and p >= 0 for p in (*partitions, *standbys)) or \
                not isinstance(standbys, list) or \
                not all(isinstance(counts, dict) and
                        all(isinstance(n, int) and n >= 0 for n in counts.values())
                        for counts in (streams, runs)):
            raise ValueError("not a claim")
        return cls(data["instance"], data["url"], data["generation"], frozenset(partitions),
                   streams, runs, frozenset(standbys))


def _most(counts: Mapping[str, int]) -> dict[str, int]:
    """The tenants with most, as many as `MAX_TENANTS_LISTED` and their names' bytes allow."""
    listed, size = {}, 0
    for tenant, count in heapq.nlargest(MAX_TENANTS_LISTED, counts.items(), key=lambda kv: kv[1]):
        size += len(json.dumps(tenant)) + 12
        if size > _MAX_TENANT_BYTES:
            break
        listed[tenant] = count
    return listed


class OwnerMap:
    """The claims read so far; per partition the newest generation's claim wins (on a
    tie, which can only be two records of one gateway, the later one read). With
    `ttl_s`, a claim not read again within that long is a dead gateway's and counts
    no more: a group whose every member died starts again at generation 1 (Kafka
    forgets a group with no members and no offsets), and the dead members' claims of
    higher generations would otherwise win for good."""

    def __init__(self, ttl_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.claims: dict[bytes, Claim] = {}
        self.ttl_s, self.clock = ttl_s, clock
        self._read_at: dict[bytes, float] = {}

    def put(self, key: bytes, claim: Claim | None) -> None:
        """A record read: a claim (or its refresh), or a tombstone (None) of the key."""
        if claim is None:
            self.claims.pop(key, None)
            self._read_at.pop(key, None)
        else:
            self.claims[key] = claim
            self._read_at[key] = self.clock()

    def _live(self) -> list[Claim]:
        if self.ttl_s is None:
            return list(self.claims.values())
        floor = self.clock() - self.ttl_s
        return [c for key, c in self.claims.items() if self._read_at[key] >= floor]

    def owner(self, partition: int) -> Claim | None:
        """The gateway that owns `partition` as far as the map knows, or None."""
        best: Claim | None = None
        for claim in self._live():
            if partition in claim.partitions and (best is None or
                                                  claim.generation >= best.generation):
                best = claim
        return best

    def newest_generation(self) -> int:
        """The newest generation any claim names (-1 if none)."""
        return max((c.generation for c in self.claims.values()), default=-1)

    def members(self) -> int:
        """The gateways in the group now: those with a live claim of the newest live
        generation (at least 1)."""
        live = self._live()
        newest = max((c.generation for c in live), default=-1)
        return max(1, len({c.instance for c in live if c.generation == newest}))

    def _newest_elsewhere(self, here: str) -> list[Claim]:
        """The other live gateways' newest claims (a gateway's older key may linger
        until tombstoned)."""
        newest: dict[str, Claim] = {}
        for claim in self._live():
            if claim.instance != here and (claim.instance not in newest or
                                           claim.generation >= newest[claim.instance].generation):
                newest[claim.instance] = claim
        return list(newest.values())

    def warm(self) -> dict[int, set[str]]:
        """Who keeps a standby copy of each partition, as the live gateways last wrote."""
        kept: dict[int, set[str]] = {}
        for claim in self._newest_elsewhere(""):
            for partition in claim.standbys:
                kept.setdefault(partition, set()).add(claim.instance)
        return kept

    def instances(self) -> list[str]:
        """The live gateways of the newest live generation."""
        live = self._live()
        newest = max((c.generation for c in live), default=-1)
        return sorted({c.instance for c in live if c.generation == newest})

    def streams_elsewhere(self, tenant: str, here: str) -> int:
        """The tenant's open streams at the other live gateways, as each last wrote them."""
        return sum(claim.streams.get(tenant, 0) for claim in self._newest_elsewhere(here))

    def runs_elsewhere(self, tenant: str, here: str) -> int:
        """The tenant's active runs in the partitions the other live gateways hold, as
        each last wrote them."""
        return sum(claim.runs.get(tenant, 0) for claim in self._newest_elsewhere(here))

    def stale(self, generation: int) -> list[bytes]:
        """Keys of claims at least two generations older than `generation`, or not read
        again within the TTL."""
        floor = None if self.ttl_s is None else self.clock() - self.ttl_s
        return [key for key, c in self.claims.items() if c.generation <= generation - 2
                or (floor is not None and self._read_at[key] < floor)]


class OwnerBoard:
    """Writes this gateway's claims and reads everyone's (the `gateways` topic)."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings, self.url = settings, url
        self.instance = secrets.token_hex(8)  # this process
        self.topic = owners_topic(settings).name
        # The claim is written again as often as a member heartbeats its session out;
        # missing three of those, it is a dead gateway's.
        self.refresh_s = max(1.0, settings.session_timeout_ms / 1000)
        self.map = OwnerMap(ttl_s=3 * self.refresh_s + 1.0)
        self._mine: Claim | None = None
        # This gateway's open streams and its partitions' active runs by tenant, written
        # with each refresh of its claim.
        self.streams: Callable[[], Mapping[str, int]] = dict
        self.runs: Callable[[], Mapping[str, int]] = dict
        # Standby copies (THREADLINE_GATEWAY_STANDBYS): how many each partition has, and
        # who is told this gateway's share of them whenever the map changes.
        self.standby_copies = settings.gateway.standbys
        self.on_standbys: Callable[[set[int]], None] | None = None
        self.standbys: frozenset[int] = frozenset()
        self._changed = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start writing, and reading the topic from its start."""
        self._producer = AIOKafkaProducer(**aiokafka_config(self.settings), acks="all",
                                          enable_idempotence=True)
        await self._producer.start()
        consumer = self._consumer = new_consumer(self.settings, isolation_level="read_uncommitted")
        await consumer.start()
        tp = TopicPartition(self.topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        self._task = asyncio.create_task(run_forever("gateways topic", self._step))
        self._refresher = asyncio.create_task(run_forever("gateways claim", self._refresh))

    async def _refresh(self) -> None:
        await asyncio.sleep(self.refresh_s)
        mine = self._mine
        if mine is not None and self._producer is not None:
            self._place_standbys()
            mine = self._mine = replace(mine, streams=dict(self.streams()), runs=dict(self.runs()),
                                        standbys=self.standbys)
            self.map.put(mine.key, mine)  # as claim() does: its own view needs no round trip
            await self._producer.send_and_wait(self.topic, mine.to_json(), key=mine.key)

    async def stop(self) -> None:
        """Tombstone this gateway's claim (it leaves), then close."""
        await stop_task(self._refresher)
        if self._producer is not None and self._mine is not None:
            with contextlib.suppress(Exception):
                await within(self._producer.send_and_wait(self.topic, None, key=self._mine.key),
                             5.0)
        await stop_task(self._task)
        for client in (self._consumer, self._producer):
            if client is not None:
                await stop_client(client)

    async def claim(self, generation: int, partitions: Iterable[int]) -> None:
        """Say that this gateway owns `partitions` as of `generation`."""
        assert self._producer is not None, "OwnerBoard.start() first"
        claim = Claim(self.instance, self.url, generation, frozenset(partitions),
                      dict(self.streams()), dict(self.runs()), self.standbys)
        previous, self._mine = self._mine, claim
        self.map.put(claim.key, claim)  # at once: this gateway's own view needs no round trip
        self._place_standbys()
        self._changed.set()
        await self._producer.send_and_wait(self.topic, claim.to_json(), key=claim.key)
        stale = set(self.map.stale(generation))
        if previous is not None and previous.key != claim.key:
            stale.add(previous.key)
        for key in stale:
            await self._producer.send_and_wait(self.topic, None, key=key)
        log.info("gateway %s owns %s (generation %d)", self.instance, sorted(partitions),
                 generation)

    def _place_standbys(self) -> None:
        """This gateway's standby partitions as the map stands now, to `on_standbys`."""
        if self.standby_copies <= 0 or self._mine is None:
            return
        owners, live = self.partition_owners(), self.map.instances()
        mine = standbys(owners, live, self.standby_copies).get(self.instance, set())
        # A copy whose owner left stays until the partition has a new owner: it may be
        # this gateway, which then serves it at once.
        mine |= {p for p in self.standbys if owners.get(p) not in live}
        mine -= self._mine.partitions
        if mine != self.standbys:
            self.standbys = frozenset(mine)
            if self.on_standbys is not None:
                self.on_standbys(set(mine))

    def partition_owners(self) -> dict[int, str]:
        """Each partition's owner now, as far as the map knows (its instance id)."""
        return {p: claim.instance for p in range(self.settings.partitions)
                if (claim := self.map.owner(p)) is not None}

    def streams_elsewhere(self, tenant: str) -> int:
        """The tenant's open streams at the other gateways of the group."""
        return self.map.streams_elsewhere(tenant, self.instance)

    def runs_elsewhere(self, tenant: str) -> int:
        """The tenant's active runs in the partitions the other gateways hold."""
        return self.map.runs_elsewhere(tenant, self.instance)

    def owner(self, partition: int) -> Claim | None:
        """Another gateway's claim on `partition`, or None (unknown, or this one's)."""
        claim = self.map.owner(partition)
        return None if claim is None or claim.instance == self.instance else claim

    async def changed(self, timeout_s: float) -> None:
        """Until the map changes, or `timeout_s`."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await within(self._changed.wait(), timeout_s)

    async def _step(self) -> None:
        assert self._consumer is not None
        batch = await self._consumer.getmany(timeout_ms=1000, max_records=500)
        for records in batch.values():
            for record in records:
                if record.key is None:
                    continue
                if record.value is None:
                    self.map.put(record.key, None)
                    continue
                try:
                    self.map.put(record.key, Claim.from_json(record.value))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("gateways topic: skipping %r: %s", record.key, exc)
        if batch:
            self._place_standbys()
            self._changed.set()
