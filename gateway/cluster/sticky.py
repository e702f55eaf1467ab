"""The gateway group's partition assignor: sticky, so a gateway joining or leaving
moves only the partitions it must.

A moved partition costs its streams: the old owner ends them ("moved"), every
gateway forwarding one opens it again on the new owner, and the new owner finds
the start of each active run and rebuilds the windows from Kafka. aiokafka's
default assignor (round robin over the sorted member ids) deals every partition out
afresh at each rebalance: a third gateway joining two moved about two thirds of the
partitions, not the third that balance needs.

aiokafka ships KIP-54's sticky assignor (`StickyPartitionAssignor`, the Java
client's algorithm), with two flaws this module works around:
- its last assignment lives in class attributes, shared by every consumer of the
  process that uses it (aio-libs/aiokafka#1175): each consumer gets a subclass of
  its own here;
- nothing tells it the group generation (aio-libs/aiokafka#1176), which decides
  between two members claiming one partition (a member that missed a rebalance):
  the feed sets it, with the partitions, on each assignment (`remember`).

Round robin stays the second choice of each member, so a group of gateways of an
earlier version (round robin only) still forms while they are replaced one by one:
the group uses the first protocol every member supports.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

__all__ = ["GatewayAssignor", "assignors", "remember"]

GatewayAssignor = type[StickyPartitionAssignor]


def assignors() -> tuple[GatewayAssignor, type[AbstractPartitionAssignor]]:
    """The assignors of one group consumer, in order of preference: a sticky one of its
    own (a fresh subclass, so its state is this consumer's alone), then round robin."""
    own: GatewayAssignor = type("GatewayStickyAssignor", (StickyPartitionAssignor,),
                                {"member_assignment": None,
                                 "generation": StickyPartitionAssignor.DEFAULT_GENERATION_ID})
    return own, RoundRobinPartitionAssignor


def remember(assignor: GatewayAssignor, topic: str, partitions: Iterable[int],
             generation: int) -> None:
    """What this member owns as of `generation`, sent with its next join: the leader
    keeps each partition with its owner where balance allows. Set on every
    assignment, whichever protocol the group chose, so it is never an older one's."""
    assignor.member_assignment = [TopicPartition(topic, p) for p in sorted(partitions)]
    assignor.generation = generation
