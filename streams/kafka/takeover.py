"""Taking partitions over from an instance lost for good: fence its transactional id.

An instance that dies inside a transaction leaves it open. Every `read_committed`
reader of a partition it wrote then stops at that transaction: the new owner's
committed-offset fetch (KIP-447 waits for pending transactional offsets), its
changelog restore, the workers' dispatch consumer, the gateways. A restarted
instance aborts it at once (`init_transactions` with its own transactional id);
one lost for good leaves it to the transaction coordinator, which aborts it after
`transaction.timeout.ms` plus up to the broker's
`transaction.abort.timed.out.transaction.cleanup.interval.ms` (10 s + 10 s on a
stock broker).

So the table loop writes who committed into every transaction's input offsets
(their commit metadata: `WRITER_TAG`, the transactional id and the group member
id), and commits one as soon as it owns new partitions, with nothing else in it
if need be: the last committed writer of a partition is its owner from its first
step on, so it is the one whose transaction can be left open. A new owner, before
it reads its partitions' committed offsets (`fence_deposed`):

1. reads the last *stable* offsets' metadata (`require_stable=False`: what
   committed before any pending transaction): the previous writers;
2. keeps those that are not itself and not members of the group now (the
   coordinator expelled them: their session expired);
3. calls `init_transactions` with each one's transactional id: the coordinator
   aborts its open transaction at once and bumps its epoch, so a zombie that
   still runs is fenced (its next transactional call fails fatally, it exits and
   a restart rejoins as itself). An instance restarting as itself meanwhile, or
   one that only dropped out of the group for a while, is not: it calls
   `init_transactions` on a new producer at each assignment, which comes after
   this one has finished (`streams.kafka.loop`, step -1).

A live previous owner (a rebalance that moved partitions between members) is a
member and is left alone; it ended its transaction before it gave its partitions
up. Any failure here (no ACL to describe the group, a timeout) is logged and the
takeover waits for the coordinator's abort as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

__all__ = ["WRITER_TAG", "Takeover", "Writer", "parse_writer"]

log = logging.getLogger("threadline.kafka.takeover")

WRITER_TAG = "threadline-writer"
# Short: right after a broker restart the group coordinator is still loading and
# these requests wait for it, while the assignment waits for them (10 s was seen).
REQUEST_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Writer:
    """Who committed a transaction: its transactional id and its group member id."""

    transactional_id: str
    member_id: str

    def metadata(self) -> str:
        """As offset commit metadata."""
        return f"{WRITER_TAG} {self.transactional_id} {self.member_id}"


def parse_writer(metadata: str | None) -> Writer | None:
    """The writer in an offset's commit metadata, None if it names none."""
    parts = (metadata or "").split()
    if len(parts) != 3 or parts[0] != WRITER_TAG:
        return None
    return Writer(parts[1], parts[2])


@dataclass
class Takeover:
    """Fences the deposed writers of newly assigned partitions (see the module doc)."""

    me: Writer
    group_id: str
    admin_config: dict[str, Any]
    # The configuration of a producer with a given transactional id (to fence it).
    producer_config: Callable[[str], dict[str, Any]]
    _admin: AdminClient | None = field(default=None, repr=False)

    def fence_deposed(self, topic: str, partitions: list[int]) -> list[Writer]:
        """Fence the previous writers of `partitions` that are gone from the group;
        the writers fenced. Never raises: a failure leaves the coordinator to abort."""
        try:
            deposed = self._deposed(topic, partitions)
        except (KafkaException, TimeoutError) as exc:
            log.warning("could not read the previous writers of %s: %s", partitions, exc)
            return []
        fenced = []
        for writer in deposed:
            producer = Producer(self.producer_config(writer.transactional_id))
            try:
                producer.init_transactions(REQUEST_TIMEOUT_S)
            except KafkaException as exc:
                log.warning("could not fence %s: %s", writer.transactional_id, exc)
                continue
            finally:
                producer.flush(0)
            log.warning("fenced %s (member %s, gone from the group): its open transaction "
                        "is aborted", writer.transactional_id, writer.member_id)
            fenced.append(writer)
        return fenced

    def _deposed(self, topic: str, partitions: list[int]) -> list[Writer]:
        if self._admin is None:
            self._admin = AdminClient(self.admin_config)
        request = ConsumerGroupTopicPartitions(self.group_id,
                                               [TopicPartition(topic, p) for p in partitions])
        offsets = self._admin.list_consumer_group_offsets(
            [request], require_stable=False, request_timeout=REQUEST_TIMEOUT_S)[self.group_id]
        writers = {w for tp in offsets.result(REQUEST_TIMEOUT_S).topic_partitions or []
                   if (w := parse_writer(tp.metadata)) is not None
                   and w.transactional_id != self.me.transactional_id}
        if not writers:
            return []
        group = self._admin.describe_consumer_groups(
            [self.group_id], request_timeout=REQUEST_TIMEOUT_S)[self.group_id]
        members = {m.group_instance_id for m in group.result(REQUEST_TIMEOUT_S).members}
        return sorted((w for w in writers if w.member_id not in members),
                      key=lambda w: w.transactional_id)
