"""The gateway group's partition assignor: sticky, so a gateway joining or leaving
moves only the partitions it must.

A moved partition costs its streams: the old owner ends them ("moved"), every
gateway forwarding one opens it again on the new owner, and the new owner finds
the start of each active run and rebuilds the windows from Kafka. aiokafka's
default assignor (round robin over the sorted member ids) deals every partition out
afresh at each rebalance: a third gateway joining two moved about two thirds of the
partitions, not the third that balance needs.

Where each partition is now, the group leader reads from the owner map (the claims
on the `gateways` topic, `gateway.cluster.owners`), not from the members' join
metadata as KIP-54's sticky assignor does. A member's metadata is its instance id
alone, the same at every join. That matters: the group coordinator starts a new
rebalance whenever a member joins with metadata that differs from its last join, and
KIP-54's metadata (the member's last assignment and generation) differs after every
rebalance. aiokafka's port of it (which also keeps its state on the class, shared by
every consumer of a process, aio-libs/aiokafka#1175, and is never told the
generation, #1176) kept three gateways started together rebalancing for a minute in
the gateways chaos preset (seed 71: generations 2 to 348, two partitions unowned),
one member's late join forcing the next rebalance each time. A leader whose map is a
moment stale only moves more than it had to; the assignment is balanced either way.

A partition that must move (its owner left) goes, where balance allows, to a member
that keeps a standby copy of its read model (the claims name them,
`THREADLINE_GATEWAY_STANDBYS`): it serves again without reading the partition anew.

One protocol, named `roundrobin`: a gateway of an earlier version (aiokafka's round
robin only) shares it, so a group of both still forms while they are replaced one by
one (whichever member leads assigns, each by its own rule, both balanced). Not two
protocols, sticky first and round robin second: aiokafka 0.14 then sends a JoinGroup
per assignor, the first with the first protocol alone and the next with both
(aio-libs/aiokafka#1168, open), so every join changes the member's metadata and starts
another rebalance. Two or three gateways starting together rebalanced for minutes
that way (generation 856 after two minutes in `bench.gateway_group`), and one gave up
without an assignment.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

__all__ = ["assignors", "shares", "standbys"]

Owners = Callable[[], Mapping[int, str]]  # partition -> the instance that owns it now
Warm = Callable[[], Mapping[int, Collection[str]]]  # partition -> who keeps a standby copy


def shares(partitions: Iterable[int], members: Iterable[str],
           owners: Mapping[int, str],
           warm: Mapping[int, Collection[str]] | None = None) -> dict[str, list[int]]:
    """Each member's partitions: every partition to one member, the counts differing
    by at most one, and as many partitions as that allows left with their owner (the
    larger shares go to the members that hold most now). A partition that moves goes,
    where balance allows, to a member that keeps a standby copy of it (`warm`)."""
    names = sorted(set(members))
    if not names:
        return {}
    pool = sorted(set(partitions))
    held = {m: [p for p in pool if owners.get(p) == m] for m in names}
    base, extra = divmod(len(pool), len(names))
    ranked = sorted(names, key=lambda m: (-len(held[m]), m))
    quota = {m: base + (rank < extra) for rank, m in enumerate(ranked)}
    result = {m: held[m][:quota[m]] for m in names}
    kept = {p for share in result.values() for p in share}
    for p in (p for p in pool if p not in kept):
        room = [m for m in names if len(result[m]) < quota[m]]
        copies = (warm or {}).get(p, ())
        result[next((m for m in room if m in copies), room[0])].append(p)
    return result


def standbys(owners: Mapping[int, str], members: Iterable[str],
             copies: int) -> dict[str, set[int]]:
    """Each member's standby partitions: a partition's `copies` copies are kept by as
    many other members (fewer when the group is smaller), never by its owner. One
    owner's partitions spread their copies over all the others, in turn, so that
    when it leaves, the members that keep its copies can take its partitions
    evenly."""
    ring = sorted(set(members))
    kept: dict[str, set[int]] = {m: set() for m in ring}
    count = min(copies, len(ring) - 1)
    by_owner: dict[str, list[int]] = {}
    for partition, owner in sorted(owners.items()):
        if owner in kept:
            by_owner.setdefault(owner, []).append(partition)
    for owner, share in by_owner.items():
        at = ring.index(owner)
        others = ring[at + 1:] + ring[:at]
        for rank, partition in enumerate(share):
            for step in range(count):
                kept[others[(rank + step) % len(others)]].add(partition)
    return kept


def assignors(instance: str, owners: Owners,
              warm: Warm = dict) -> tuple[type[AbstractPartitionAssignor], ...]:
    """The assignor of this gateway's group consumer (a class of its own: aiokafka calls
    assignors on the class), alone, under round robin's protocol name (see the module)."""

    class ClaimStickyAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
        name = RoundRobinPartitionAssignor.name  # "roundrobin": what earlier gateways propose
        version = 0

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(cls.version, list(topics), instance.encode())

        @classmethod
        def assign(cls, cluster: ClusterMetadata,
                   members: Mapping[str, ConsumerProtocolMemberMetadata]) \
                -> dict[str, ConsumerProtocolMemberAssignment]:
            return _assign(cluster, members, owners(), warm())

        @classmethod
        def on_assignment(cls, assignment: ConsumerProtocolMemberAssignment) -> None:
            """Nothing to keep: the owner map says where partitions are."""

    return (ClaimStickyAssignor,)


def _assign(cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata],
            owners: Mapping[int, str], warm: Mapping[int, Collection[str]] | None = None) \
        -> dict[str, ConsumerProtocolMemberAssignment]:
    # A member is known by its instance id; two with one id (never, short of a bug)
    # or none are known by their member ids instead.
    ids = collections.Counter(meta.user_data for meta in members.values())
    name = {member: (meta.user_data.decode("utf-8", "replace")
                     if meta.user_data and ids[meta.user_data] == 1 else member)
            for member, meta in members.items()}
    assigned: dict[str, list[tuple[str, list[int]]]] = {member: [] for member in members}
    for topic in sorted({t for meta in members.values() for t in meta.subscription}):
        partitions: Sequence[int] = sorted(cluster.partitions_for_topic(topic) or ())
        subscribed = [m for m, meta in members.items() if topic in meta.subscription]
        dealt = shares(partitions, (name[m] for m in subscribed), owners, warm)
        for member in subscribed:
            assigned[member].append((topic, dealt[name[member]]))
    return {member: ConsumerProtocolMemberAssignment(0, topics, b"")
            for member, topics in assigned.items()}
