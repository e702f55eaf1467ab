"""The pure parts of the gateway group (gateway.cluster): the hop's signature and
the owner map's rule (the newest generation's claim wins)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from hypothesis import given
from hypothesis import strategies as st

from gateway.cluster.hop import HOP_TTL_S, BadHop, HopSigner
from gateway.cluster.owners import MAX_TENANTS_LISTED, Claim, OwnerBoard, OwnerMap
from gateway.cluster.reads import RemoteReads, merge_pages
from gateway.cluster.remote import (
    Forwarder,
    RemoteEventStream,
    _parse,
    parse_start_param,
    read_lines,
    start_line,
    start_param,
)
from gateway.cluster.sticky import assignors, shares, standbys
from gateway.http.problems import Problem
from gateway.kafka import Offsets, partition_for
from gateway.live.feed import NotOwned, StreamFeed
from gateway.live.sse import SseEvent
from gateway.model.placement import NowHeldHere
from gateway.model.read_model import ReadModel
from gateway.model.read_store import ThreadPage
from streams.config import Settings
from streams.core.domain import ThreadState

NOW = 1_800_000_000.0


def test_a_hop_names_its_tenant_for_that_request_only() -> None:
    """A hop verifies for the method and path it was signed for, and no other."""
    signer = HopSigner([b"deployment key"])
    hop = signer.sign("tenant-a", "GET", "/internal/v1/threads/t1/stream?after=x", NOW)
    assert signer.verify(hop, "GET", "/internal/v1/threads/t1/stream?after=x", NOW) == "tenant-a"
    for method, path in (("POST", "/internal/v1/threads/t1/stream?after=x"),
                         ("GET", "/internal/v1/threads/t2/stream?after=x"),
                         ("GET", "/internal/v1/threads/t1/stream?after=y")):
        with pytest.raises(BadHop):
            signer.verify(hop, method, path, NOW)


def test_a_hop_expires_and_needs_the_deployments_key() -> None:
    """Past its TTL, or under another deployment's key, a hop is refused."""
    signer = HopSigner([b"deployment key"])
    hop = signer.sign("tenant-a", "GET", "/p", NOW)
    with pytest.raises(BadHop, match="expired"):
        signer.verify(hop, "GET", "/p", NOW + HOP_TTL_S + 1)
    with pytest.raises(BadHop, match="not signed"):
        HopSigner([b"another key"]).verify(hop, "GET", "/p", NOW)
    # A rotated key still verifies while it is listed after the new one.
    assert HopSigner([b"new key", b"deployment key"]).verify(hop, "GET", "/p", NOW) == "tenant-a"


@given(st.text(min_size=0, max_size=300))
def test_garbage_is_never_a_hop(value: str) -> None:
    """No text a client could send is taken for a hop."""
    with pytest.raises(BadHop):
        HopSigner([b"k"]).verify(value, "GET", "/p", NOW)


@given(st.text(min_size=1, max_size=40))
def test_any_tenant_name_survives_the_hop(tenant: str) -> None:
    """The tenant comes out as it went in, whatever its characters."""
    signer = HopSigner([b"k"])
    assert signer.verify(signer.sign(tenant, "GET", "/p", NOW), "GET", "/p", NOW) == tenant


def _claim(instance: str, generation: int, *partitions: int) -> Claim:
    return Claim(instance, f"http://{instance}:8080", generation, frozenset(partitions))


def test_the_newest_generation_owns_a_partition() -> None:
    """A dead gateway's claim loses to the next generation's; stale keys are found."""
    owners = OwnerMap()
    dead = _claim("a", 5, 0, 1, 2, 3)
    owners.put(dead.key, dead)
    assert owners.owner(2) == dead
    survivor = _claim("b", 6, 0, 1, 2, 3)
    owners.put(survivor.key, survivor)
    assert all(owners.owner(p) == survivor for p in range(4))
    assert owners.owner(4) is None
    later = _claim("b", 8, 0)
    owners.put(later.key, later)
    assert owners.stale(8) == [dead.key, survivor.key]
    owners.put(survivor.key, None)  # its tombstone
    assert owners.owner(0) == later and owners.owner(1) == dead


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 9),
                          st.frozensets(st.integers(0, 11))), max_size=12))
def test_the_map_is_the_newest_claim_of_each_partition_whatever_the_order(
        claims: list[tuple[str, int, frozenset[int]]]) -> None:
    """Per partition, the map names a claim of the newest generation that claims it."""
    owners = OwnerMap()
    latest: dict[bytes, Claim] = {}
    for instance, generation, partitions in claims:
        claim = Claim(instance, "http://x", generation, partitions)
        owners.put(claim.key, claim)
        latest[claim.key] = claim
    for p in range(12):
        newest = max((c.generation for c in latest.values() if p in c.partitions), default=None)
        owner = owners.owner(p)
        assert (owner.generation if owner else None) == newest


def test_a_claims_record_round_trips_and_refuses_junk() -> None:
    """A claim reads back as written; a record that is not one raises."""
    claim = _claim("a", 3, 7, 1)
    assert Claim.from_json(claim.to_json()) == claim
    for junk in (b"{}", b'{"instance": 1, "url": "u", "generation": 1, "partitions": []}',
                 b'{"instance": "a", "url": "u", "generation": 1, "partitions": [-1]}', b"[]"):
        with pytest.raises((ValueError, KeyError, TypeError)):
            Claim.from_json(junk)


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]


async def test_the_owners_lines_are_read_whole_past_aiohttps_readline_buffer() -> None:
    """A window's catch-up is one line of thousands of events (past 512 KiB aiohttp's
    readline raised LineTooLong, which ended the forwarded stream's reader): read
    whole, in order, however the chunks fall."""
    lines = [b'{"events":[' + b"x" * 1_000_000 + b"]}", b'{"live":1}', b'{"end":"done"}']
    data = b"\n".join(lines) + b"\n"
    for size in (1_000, 65_536, len(data)):
        assert [line async for line in read_lines(_chunks(data, size))] == lines


async def test_a_line_past_the_cap_is_refused() -> None:
    """A line longer than the cap is an error, not a buffer that grows without end."""
    with pytest.raises(ValueError, match="over"):
        async for _ in read_lines(_chunks(b"y" * (9 * 1024 * 1024), 1 << 16)):
            pass


def test_a_grouped_feed_owns_nothing_before_its_first_assignment() -> None:
    """A gateway restarted with a dead one's URL is asked for that one's streams before
    it joins the group: it must not take them for its own (it answered 200 as if
    ungrouped, then its feed started past the position asked, and a browser's stream
    stalled); ungrouped, it owns every partition."""
    grouped = Settings.from_env({"THREADLINE_GATEWAY_URL": "http://127.0.0.1:1"})
    feed = StreamFeed(grouped, cast(ReadModel, None), cast(Offsets, None))
    assert feed.group is not None
    assert not any(feed.owns(p) for p in range(grouped.partitions))
    alone = StreamFeed(Settings.from_env({}), cast(ReadModel, None), cast(Offsets, None))
    assert all(alone.owns(p) for p in range(grouped.partitions))


async def test_a_feed_asked_to_catch_up_on_a_partition_it_does_not_own_says_so() -> None:
    """A rebalance can take a partition away while a stream is being opened on it: the
    feed's catch-up raises NotOwned (the hop answers 421, the entry forwards) instead
    of aiokafka's IllegalStateError (a 500 in the gateways chaos run)."""
    grouped = Settings.from_env({"THREADLINE_GATEWAY_URL": "http://127.0.0.1:1"})
    feed = StreamFeed(grouped, cast(ReadModel, None), cast(Offsets, None))
    with pytest.raises(NotOwned):
        await feed.catch_up(0)


def test_the_group_counts_the_gateways_of_the_newest_generation() -> None:
    """`members`: the gateways with a claim of the newest generation (a dead one's
    older claim, not yet tombstoned, is not one); at least 1."""
    owners = OwnerMap()
    assert owners.members() == 1
    for instance, generation, partitions in (("a", 3, {0}), ("b", 3, {1}), ("c", 2, {2}),
                                             ("d", 3, set())):
        claim = Claim(instance, f"http://{instance}", generation, frozenset(partitions))
        owners.put(claim.key, claim)
    assert owners.members() == 3


def test_claims_of_a_group_that_died_whole_stop_counting_when_not_written_again() -> None:
    """Every gateway killed at once: Kafka forgets the group, and the next one starts
    at generation 1. The dead gateways' claims (generation 57) win while they may
    still be alive, then, not written again within the TTL, count no more: the new
    claims, written again on time, own the partitions, and the old keys are stale."""
    now = [1000.0]
    owners = OwnerMap(ttl_s=7.0, clock=lambda: now[0])
    dead = [Claim(f"dead-{n}", f"http://dead-{n}", 57, frozenset({2 * n, 2 * n + 1}))
            for n in range(2)]
    for claim in dead:
        owners.put(claim.key, claim)
    new = Claim("new", "http://new", 1, frozenset(range(4)))
    owners.put(new.key, new)
    assert owners.owner(0) == dead[0] and owners.members() == 2
    for _ in range(4):  # the new gateway writes its claim again every 2 s; the dead do not
        now[0] += 2.0
        owners.put(new.key, new)
    assert all(owners.owner(p) == new for p in range(4))
    assert owners.members() == 1
    assert sorted(owners.stale(1)) == sorted(c.key for c in dead)
    assert owners.owner(5) is None


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.floats(0, 20)),
                max_size=30))
def test_a_claim_read_within_the_ttl_is_never_passed_over_for_an_older_generation(
        writes: list[tuple[int, int, float]]) -> None:
    """Whatever the order and timing of the writes: the owner is the newest generation
    among the claims read within the TTL, and none of those is stale."""
    now = [0.0]
    owners = OwnerMap(ttl_s=5.0, clock=lambda: now[0])
    read_at: dict[bytes, tuple[float, Claim]] = {}
    for instance, generation, wait in writes:
        now[0] += wait
        claim = Claim(f"g{instance}", f"http://g{instance}", generation, frozenset({0}))
        owners.put(claim.key, claim)
        read_at[claim.key] = (now[0], claim)
    live = [c for at, c in read_at.values() if at >= now[0] - 5.0]
    owner = owners.owner(0)
    if not live:
        assert owner is None
    else:
        assert owner is not None and owner.generation == max(c.generation for c in live)
        assert not set(owners.stale(-10)) & {c.key for c in live}


def test_a_claim_carries_its_gateways_stream_counts_the_busiest_tenants_first() -> None:
    """A claim's value lists its gateway's open streams by tenant (the
    MAX_TENANTS_LISTED busiest); a claim of an earlier version, without them, reads
    as none; counts that are not counts make it no claim."""
    counts = {f"t{n}": n for n in range(MAX_TENANTS_LISTED + 20)}
    claim = Claim("a", "http://a", 3, frozenset({0, 1}), counts)
    read = Claim.from_json(claim.to_json())
    assert read == claim and len(read.streams) == MAX_TENANTS_LISTED
    assert read.streams == {t: n for t, n in counts.items() if n >= 20}
    earlier = json.loads(claim.to_json())
    del earlier["streams"]
    assert Claim.from_json(json.dumps(earlier).encode()).streams == {}
    for bad in ({"t": -1}, {"t": "2"}, ["t"]):
        with pytest.raises(ValueError):
            Claim.from_json(json.dumps(earlier | {"streams": bad}).encode())
    # Long tenant names: as many as fit, the busiest, and the claim stays readable.
    long_names = {f"{n:04d}" + "t" * 996: n + 1 for n in range(MAX_TENANTS_LISTED)}
    partitions = frozenset(range(2048))
    read = Claim.from_json(Claim("a", "http://a", 3, partitions, long_names).to_json())
    assert read.partitions == partitions and 20 <= len(read.streams) < MAX_TENANTS_LISTED
    assert min(read.streams.values()) > max(n for n in long_names.values()
                                            if n not in read.streams.values())


def test_a_tenants_streams_elsewhere_are_the_other_live_gateways_newest_counts() -> None:
    """The sum, over the other gateways whose claims are live, of each one's newest
    claim's count (a gateway's older key, not yet tombstoned, is not counted again; a
    dead gateway's, past the TTL, not at all; this gateway's own, never)."""
    now = [0.0]
    owners = OwnerMap(ttl_s=7.0, clock=lambda: now[0])
    for claim in (Claim("here", "http://h", 4, frozenset({0}), {"t": 5}),
                  Claim("b", "http://b", 3, frozenset({1}), {"t": 9}),  # b's older key
                  Claim("b", "http://b", 4, frozenset({1}), {"t": 2, "u": 1}),
                  Claim("c", "http://c", 4, frozenset({2}), {"t": 3})):
        owners.put(claim.key, claim)
    assert owners.streams_elsewhere("t", "here") == 5
    assert owners.streams_elsewhere("u", "here") == 1
    assert owners.streams_elsewhere("v", "here") == 0
    now[0] += 5.0
    refreshed = Claim("b", "http://b", 4, frozenset({1}), {"t": 1})  # c writes no more
    owners.put(refreshed.key, refreshed)
    now[0] += 5.0
    assert owners.streams_elsewhere("t", "here") == 1


def _event(offset: int, name: str, sub: int = 0) -> SseEvent:
    frame = f"id: t{offset}.{sub}\nevent: {name}\ndata: {{}}\n\n".encode()
    return SseEvent(0, offset, sub, 0, "run-1", name, frame, len(frame) - 4)


class _NoOwnerElsewhere:
    """An owner map that names no other gateway (the partition is this one's)."""

    def owner(self, partition: int) -> None:
        return None

    async def changed(self, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)


@dataclass
class _FeedStream:
    caught_up: list[SseEvent]
    live_events: list[SseEvent]

    async def catch_up(self) -> AsyncIterator[list[SseEvent]]:
        yield self.caught_up

    async def live(self) -> AsyncIterator[list[SseEvent]]:
        yield self.live_events

    def end_reason(self) -> str:
        return "done"


@dataclass
class _LocalFeed:
    """This gateway's feed: unavailable (503) `refusals` times, then the stream."""

    refusals: int
    stream: _FeedStream
    opened_after: list[str | None] = field(default_factory=list)
    opened_start: list[tuple[int, int, int, str | None] | None] = field(default_factory=list)

    def owns(self) -> bool:
        return True

    @contextlib.asynccontextmanager
    async def open(self, after: str | None,
                   start: tuple[int, int, int, str | None] | None = None) -> AsyncIterator[_FeedStream]:
        self.opened_after.append(after)
        self.opened_start.append(start)
        if self.refusals > 0:
            self.refusals -= 1
            raise Problem(503, "read-model-behind", "not yet read")
        yield self.stream


async def test_a_forwarded_stream_asks_its_own_feed_again_while_it_is_unavailable() -> None:
    """A forwarded stream whose partition came to this gateway, whose feed answers
    503 for a moment (its read model behind, under load): it asks again, as an
    owner's 503 is asked again, and goes on to the run's `done`; it is not ended as if
    the run were over (seen in `make test`: the client's one response closed before
    `run_completed`)."""
    events = [_event(1, "text_delta"), _event(2, "run_completed"), _event(2, "done", 1)]
    local = _LocalFeed(3, _FeedStream(events[:1], events[1:]))
    forwarder = Forwarder(cast(OwnerBoard, _NoOwnerElsewhere()), cast(HopSigner, None),
                          owner_wait_s=30.0, keepalive_s=1.0)
    async with forwarder.open("tenant", "thread", 0, "run-1", "t0", None, local) as stream:
        got = [event for batch in [b async for b in stream] if isinstance(batch, list)
               for event in batch]
    assert [e.name for e in got] == ["text_delta", "run_completed", "done"]
    assert local.opened_after == ["t0"] * 4


async def test_a_forwarded_stream_its_own_feed_refuses_for_good_ends() -> None:
    """A refusal that is not for now (the position gone: 410, say) ends the stream."""
    local = _LocalFeed(0, _FeedStream([], []))

    @contextlib.asynccontextmanager
    async def refuse(after: str | None, start: object = None) -> AsyncIterator[_FeedStream]:
        local.opened_after.append(after)
        raise Problem(410, "gone", "trimmed")
        yield local.stream

    local.open = refuse  # type: ignore[method-assign]
    forwarder = Forwarder(cast(OwnerBoard, _NoOwnerElsewhere()), cast(HopSigner, None),
                          owner_wait_s=30.0, keepalive_s=1.0)
    async with forwarder.open("tenant", "thread", 0, "run-1", "t0", None, local) as stream:
        got = [b async for b in stream]
    assert got == [] and local.opened_after == ["t0"]




class _MovingBoard:
    """An owner map in a rebalance: partition 1, the dead gateway's, has no owner
    until the map has changed `moves` times; then gateway B claims it."""

    def __init__(self, moves: int) -> None:
        self.moves = moves
        self.a = Claim("a", "http://a", 2, frozenset({0}))
        self.b = Claim("b", "http://b", 2, frozenset({1}))

    def owner(self, partition: int) -> Claim | None:
        if partition == 0:
            return self.a
        return self.b if partition == 1 and self.moves <= 0 else None

    async def changed(self, timeout_s: float) -> None:
        self.moves -= 1
        await asyncio.sleep(0)


class _AskedReads(RemoteReads):
    """RemoteReads whose hops are answered "no such run" and recorded."""

    asked: list[str]

    async def _get(self, claim: Claim, tenant: str, op: str,
                   query: dict[str, str]) -> tuple[int, bytes]:
        self.asked.append(claim.instance)
        return 200, json.dumps({"state": None}).encode()


def _reads(board: _MovingBoard, owner_wait_s: float) -> _AskedReads:
    forwarder = Forwarder(cast(OwnerBoard, board), cast(HopSigner, None),
                          owner_wait_s=owner_wait_s, keepalive_s=1.0)
    reads = _AskedReads(forwarder, cast(Any, None), 3, lambda partition: partition == 2)
    reads.asked = []
    return reads


async def test_a_run_asked_of_every_gateway_waits_out_a_rebalance() -> None:
    """A run named by its id alone is asked of every other gateway; while a killed
    gateway's partition has no owner yet, the read waits for the map to name one
    (as a thread's read does) and asks it too, instead of a 503 at once (seen in CI:
    the cluster REST test's `/v1/runs/{id}/events` got a 503 right after the kill)."""
    reads = _reads(_MovingBoard(moves=3), owner_wait_s=60.0)
    assert await reads.run("tenant", "run-1", None, (False, None, None)) is None
    assert sorted(reads.asked) == ["a", "b"]


async def test_a_partition_left_without_an_owner_past_the_wait_is_a_503() -> None:
    """Past the owner wait, a partition nobody holds is a 503 (Retry-After), not an
    answer that silently misses its threads (the owners there are were asked, once)."""
    reads = _reads(_MovingBoard(moves=10**9), owner_wait_s=0.0)
    with pytest.raises(Problem) as refused:
        await reads.run("tenant", "run-1", None, (False, None, None))
    assert refused.value.status == 503 and reads.asked == ["a"]


class _ScriptedBoard:
    """An owner map that moves on a script: each `changed()` takes the next step,
    (owners by partition, the partitions held here); the last step stays."""

    def __init__(self, *steps: tuple[dict[int, Claim], set[int]]) -> None:
        self.steps, self.step = list(steps), 0

    @property
    def now(self) -> tuple[dict[int, Claim], set[int]]:
        return self.steps[min(self.step, len(self.steps) - 1)]

    def owner(self, partition: int) -> Claim | None:
        return self.now[0].get(partition)

    def here(self, partition: int) -> bool:
        return partition in self.now[1]

    async def changed(self, timeout_s: float) -> None:
        self.step += 1
        await asyncio.sleep(0)


class _DeadAware(RemoteReads):
    """RemoteReads whose hops to `dead` gateways fail to connect; the others answer
    "no such run" (or `runs[instance]`), each hop recorded."""

    asked: list[str]
    dead: set[str]
    runs: dict[str, dict[str, Any]]

    async def _get(self, claim: Claim, tenant: str, op: str,
                   query: dict[str, str]) -> tuple[int, bytes]:
        self.asked.append(claim.instance)
        if claim.instance in self.dead:
            raise ConnectionRefusedError(f"{claim.url} is gone")
        return 200, json.dumps(self.runs.get(claim.instance, {"state": None})).encode()


def _dead_aware(board: _ScriptedBoard, dead: set[str]) -> _DeadAware:
    forwarder = Forwarder(cast(OwnerBoard, board), cast(HopSigner, None), owner_wait_s=60.0,
                          keepalive_s=1.0)
    reads = _DeadAware(forwarder, cast(Any, None), 4, board.here)
    reads.asked, reads.dead, reads.runs = [], dead, {}
    return reads


async def test_a_killed_owners_partition_that_comes_here_is_read_here() -> None:
    """A run by its id, asked of every other gateway while the thread's owner was just
    killed: its partition then comes to this gateway (the group gave it here). The
    read is handed back to be read here (NowHeldHere), not left waiting for another
    owner of it until a 503 (CI, make test on 6909abf: the cluster REST test's
    `/v1/runs/{id}/events` answered 503 after 12 s, the run in a partition this
    gateway had held for 10 s); a thread's read likewise."""
    a, dead = Claim("a", "http://a", 4, frozenset({0, 1})), Claim("x", "http://x", 4,
                                                                     frozenset({2}))
    board = _ScriptedBoard(({0: a, 1: a, 2: dead}, {3}), ({0: a, 1: a, 2: dead}, {3}),
                           ({0: a, 1: a}, {2, 3}))
    reads = _dead_aware(board, dead={"x"})
    with pytest.raises(NowHeldHere) as moved:
        await reads.run("tenant", "run-1", None, (False, None, None))
    assert moved.value.partition == 2 and reads.asked.count("a") == 1 and "x" in reads.asked
    board.step = 0
    with pytest.raises(NowHeldHere):
        await reads.thread("tenant", _thread_on(2, 4), (False, None, None))


async def test_a_killed_owners_partitions_are_each_asked_of_their_new_owner() -> None:
    """The killed gateway held two partitions, which go to two others: both are asked,
    not only the new owner of its smallest partition (the run is on the other)."""
    a = Claim("a", "http://a", 5, frozenset({0}))
    dead = Claim("x", "http://x", 4, frozenset({1, 2}))
    a2, b2 = Claim("a", "http://a", 5, frozenset({0, 1})), Claim("b", "http://b", 5,
                                                                 frozenset({2}))
    board = _ScriptedBoard(({0: a, 1: dead, 2: dead}, {3}),
                           ({0: a2, 1: a2, 2: b2}, {3}))
    reads = _dead_aware(board, dead={"x"})
    reads.runs["b"] = {"state": "found-on-b"}
    answers = await reads._gather("tenant", "run", {"run_id": "run-1"},
                                  lambda answer: answer.get("state") is not None)
    assert answers[-1] == {"state": "found-on-b"}
    # a once for its own partition, then again for the one it took; b for the other.
    assert reads.asked == ["a", "x", "a", "b"]


def _thread_on(partition: int, partitions: int) -> str:
    """A thread id whose partition is `partition` (of `partitions`)."""
    return next(t for t in (f"thread-{i}" for i in range(10_000))
                if partition_for(t, partitions) == partition)


@given(st.integers(1, 48), st.lists(st.text("abcdefgh", min_size=1, max_size=2), min_size=1,
                                    max_size=9, unique=True),
       st.dictionaries(st.integers(0, 47), st.text("abcdefghij", min_size=1, max_size=2)),
       st.dictionaries(st.integers(0, 47), st.sets(st.text("abcdefghij", min_size=1,
                                                           max_size=2), max_size=3)))
def test_sticky_shares_are_balanced_whole_and_move_only_what_balance_needs(
        count: int, members: list[str], owners: dict[int, str],
        warm: dict[int, set[str]]) -> None:
    """Every partition to exactly one member, counts within one of each other, and
    each member keeps as many of the partitions it owns as its share allows, the
    larger shares going to those that hold most: no assignment keeps more (standby
    copies change where moved partitions go, not how many stay)."""
    partitions = list(range(count))
    dealt = shares(partitions, members, owners, warm)
    assert sorted(p for share in dealt.values() for p in share) == partitions
    sizes = sorted(len(share) for share in dealt.values())
    assert sizes[-1] - sizes[0] <= 1 and set(dealt) == set(members)
    held = {m: {p for p in partitions if owners.get(p) == m} for m in members}
    for m, share in dealt.items():
        assert len(set(share) & held[m]) == min(len(held[m]), len(share)), (m, share, held[m])
    # the most any balanced assignment keeps: the larger shares to the largest holders
    base, extra = divmod(count, len(members))
    ranked = sorted((len(h) for h in held.values()), reverse=True)
    best = sum(min(h, base + (i < extra)) for i, h in enumerate(ranked))
    assert sum(len(set(share) & held[m]) for m, share in dealt.items()) == best


def test_a_third_member_takes_its_share_from_the_two_and_they_keep_the_rest() -> None:
    """Twelve partitions: the third of three takes four, two from each; when it leaves,
    its four go back and the two keep what they had."""
    two = shares(range(12), ["a", "b"], {})
    assert sorted(map(len, two.values())) == [6, 6]
    owners = {p: m for m, share in two.items() for p in share}
    three = shares(range(12), ["a", "b", "c"], owners)
    assert set(three["a"]) <= set(two["a"]) and set(three["b"]) <= set(two["b"])
    assert len(three["c"]) == 4
    back = shares(range(12), ["a", "b"], {p: m for m, share in three.items() for p in share})
    assert set(three["a"]) <= set(back["a"]) and set(three["b"]) <= set(back["b"])


def test_a_member_joins_with_the_same_metadata_every_time() -> None:
    """Its instance id, nothing that changes with an assignment: the coordinator starts
    a new rebalance when a member joins with changed metadata (KIP-54's carries the
    last assignment, and kept three gateways rebalancing for a minute). The leader
    reads ownership from the owner map instead. One protocol, round robin's name: with
    two, aiokafka 0.14 sends a JoinGroup per assignor (#1168), each with other
    metadata, and gateways starting together rebalanced for minutes."""
    (sticky,) = assignors("instance-a", lambda: {0: "instance-b"})
    (other,) = assignors("instance-b", dict)
    assert sticky.name == other.name == RoundRobinPartitionAssignor.name
    assert sticky.metadata(["stream"]).user_data == b"instance-a"
    sticky.on_assignment(cast(Any, None))
    assert sticky.metadata(["stream"]).user_data == b"instance-a"
    assert other.metadata(["stream"]).user_data == b"instance-b"


@given(st.dictionaries(st.integers(0, 47), st.text("abcdef", min_size=1, max_size=1)),
       st.lists(st.text("abcdef", min_size=1, max_size=1), min_size=1, max_size=6, unique=True),
       st.integers(0, 4))
def test_each_partition_has_its_standby_copies_never_at_its_owner(
        owners: dict[int, str], members: list[str], copies: int) -> None:
    """A partition of a live owner has min(copies, members - 1) keepers, all distinct
    and none its owner; a partition whose owner is not a member has none."""
    kept = standbys(owners, members, copies)
    assert set(kept) == set(members)
    for partition, owner in owners.items():
        keepers = [m for m, share in kept.items() if partition in share]
        if owner in members:
            assert len(keepers) == min(copies, len(members) - 1) and owner not in keepers
        else:
            assert keepers == []


def test_a_dead_members_partitions_go_to_their_standby_keepers() -> None:
    """Three members with one standby copy each; one leaves: each of its partitions
    goes to the member that kept its copy, as balance allows (round robin over the
    rest would have sent about half of them cold)."""
    three = shares(range(12), ["a", "b", "c"], {})
    owners = {p: m for m, share in three.items() for p in share}
    warm: dict[int, set[str]] = {}
    for member, share in standbys(owners, ["a", "b", "c"], 1).items():
        for partition in share:
            warm.setdefault(partition, set()).add(member)
    two = shares(range(12), ["a", "c"], owners, warm)
    moved = three["b"]
    assert all(p in two[next(iter(warm[p]))] for p in moved), (moved, two, warm)


def test_a_claim_carries_its_active_runs_and_standby_copies() -> None:
    """The runs by tenant and the standby partitions read back as written; a claim of
    an earlier version (neither) reads as none."""
    claim = Claim("a", "http://a", 3, frozenset({1}), {}, {"t": 2}, frozenset({4, 5}))
    back = Claim.from_json(claim.to_json())
    assert back.runs == {"t": 2} and back.standbys == {4, 5}
    old = Claim.from_json(b'{"instance": "a", "url": "u", "generation": 1, "partitions": [0]}')
    assert old.runs == {} and old.standbys == frozenset()
    owners = OwnerMap()
    owners.put(claim.key, claim)
    other = Claim("b", "http://b", 3, frozenset({0}), {}, {"t": 3}, frozenset({1}))
    owners.put(other.key, other)
    assert owners.runs_elsewhere("t", "a") == 3 and owners.warm() == {4: {"a"}, 5: {"a"}, 1: {"b"}}


@given(st.lists(st.tuples(st.integers(0, 20), st.text("abc", min_size=1, max_size=3),
                          st.integers(0, 2)), max_size=30, unique_by=lambda t: t[1]),
       st.integers(1, 7))
def test_gathered_thread_pages_walk_the_whole_list_in_order(
        threads: list[tuple[int, str, int]], limit: int) -> None:
    """Threads spread over three gateways (updated_at, id, which gateway): each answers
    the first `limit` of its own after the cursor, and the merged pages, walked by the
    cursor of each page's last thread, give every thread once, in the listing order."""
    states = {tid: ThreadState(tid, "t", "", 0, updated_at_ms=at) for at, tid, _ in threads}
    where = {tid: g for _, tid, g in threads}

    def order(state: ThreadState) -> tuple[int, bytes]:
        return -state.updated_at_ms, state.thread_id.encode()

    def page_of(gateway: int, after: tuple[int, bytes] | None) -> ThreadPage:
        mine = sorted((s for s in states.values() if where[s.thread_id] == gateway), key=order)
        mine = [s for s in mine if after is None or order(s) > after]
        return ThreadPage(mine[:limit], len(mine) > limit)

    walked: list[str] = []
    after = None
    while True:
        page = merge_pages([page_of(g, after) for g in range(3)], limit)
        assert len(page.states) <= limit
        walked += [s.thread_id for s in page.states]
        if not page.more:
            break
        after = order(page.states[-1])
    assert walked == [s.thread_id for s in sorted(states.values(), key=order)]


async def test_a_forwarded_stream_with_no_event_yet_goes_on_from_where_it_began() -> None:
    """The owner's first line says where its stream began; if it ends before any event
    (its partition moved a moment after the client subscribed), the stream opens again
    from there, on the next owner or this gateway's feed, not anew: a fresh start there
    could come after a run begun meanwhile, which the client would never see (chaos
    seed 103: two watchers missed a whole run). Once an event came, its id is where."""
    local = _LocalFeed(0, _FeedStream([], [_event(9, "done", 1)]))
    forwarder = Forwarder(cast(OwnerBoard, _NoOwnerElsewhere()), cast(HopSigner, None),
                          owner_wait_s=30.0, keepalive_s=1.0)
    stream = RemoteEventStream(forwarder, "tenant", "thread", 0, "run-1", None, None, local)
    await stream._put(_parse(start_line((7, -1, 7, "run-1"))))
    assert "start=7.-1.7.run-1" in stream._path()
    async with local.open(stream._after, stream._start):
        pass
    assert local.opened_start == [(7, -1, 7, "run-1")]
    await stream._put([_event(8, "text_delta")])
    assert "start=" not in stream._path() and "after=" in stream._path()


_starts = st.tuples(st.integers(-1, 1 << 62), st.integers(-1, 1 << 30), st.integers(0, 1 << 62),
                    st.one_of(st.none(), st.uuids().map(str)))


@given(_starts)
def test_a_streams_start_goes_to_the_next_owner_as_it_began(start: tuple[int, int, int, str | None]) -> None:
    """The `start` a re-open sends (`start_param`) reads back as the same start on the
    owner, a run or none; the owner's first line carries it to the asking gateway."""
    assert parse_start_param(start_param(start)) == start
    assert _parse(start_line(start).rstrip(b"\n")).start == start  # type: ignore[attr-defined]


@pytest.mark.parametrize("raw", ["1.2", "x.1.2.run", "1.2.3", "1..3.run"])
def test_a_start_that_is_not_one_is_a_400(raw: str) -> None:
    """Whatever a hop sends as `start` is read, or refused: never a 500."""
    with pytest.raises(Problem) as refused:
        parse_start_param(raw)
    assert refused.value.status == 400
