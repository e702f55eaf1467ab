"""The embedded three-node KRaft cluster: replication factor 3, min ISR 2, and a
transactional produce that survives the loss of one broker."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from streams.config import Settings
from streams.devtools.broker import EmbeddedCluster
from streams.kafka.topics import ensure_topics
from streams.testing.stack import SUITE_TOPIC_STALL_S

pytestmark = [pytest.mark.kafka, pytest.mark.chaos]


def _committed_values(bootstrap: str, topic: str, partitions: int, want: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4()}",
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "log_level": 0})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[bytes] = []
    since = time.monotonic()  # bounded by progress: 30 s without a new record ends the read
    while len(values) < want and time.monotonic() - since < 30:
        more = [m.value() or b"" for m in consumer.consume(100, 0.1) if not m.error()]
        if more:
            values += more
            since = time.monotonic()
    consumer.close()
    return values


def test_three_nodes_replicate_and_survive_one_broker_killed(tmp_path: Path) -> None:
    """Three brokers replicate every topic; with one killed, transactions still commit and nothing is lost."""
    with EmbeddedCluster(tmp_path / "cluster") as cluster:
        try:
            settings = Settings.from_env({
                "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap, "THREADLINE_PARTITIONS": "3",
                "THREADLINE_REPLICATION_FACTOR": "3", "THREADLINE_DATA_DIR": str(tmp_path / "d"),
                "THREADLINE_TOPIC_STALL_S": SUITE_TOPIC_STALL_S,
            })
            ensure_topics(settings)
            md = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "md"}).list_topics(timeout=10)
            for p in md.topics[settings.topics.events].partitions.values():
                assert len(p.replicas) == 3

            producer = Producer({"bootstrap.servers": cluster.bootstrap,
                                 "transactional.id": f"tx-{uuid.uuid4()}", "log_level": 0})
            producer.init_transactions(60)
            producer.begin_transaction()
            for i in range(30):
                producer.produce(settings.topics.events, f"before-{i}".encode(), f"k{i}".encode())
            producer.commit_transaction(60)

            cluster.nodes[0].kill()  # two of three remain: min.insync.replicas=2 still holds

            producer.begin_transaction()
            for i in range(30):
                producer.produce(settings.topics.events, f"after-{i}".encode(), f"k{i}".encode())
            producer.commit_transaction(120)

            survivors = ",".join(n.bootstrap for n in cluster.nodes[1:])
            values = _committed_values(survivors, settings.topics.events, 3, 60)
            assert sorted(values) == sorted(
                [f"before-{i}".encode() for i in range(30)] + [f"after-{i}".encode() for i in range(30)])
        finally:
            # A throwaway cluster: with one node dead, a clean stop of the other two waits
            # out its 30 s for a quorum that cannot form; SIGKILL ends them at once.
            for node in cluster.nodes:
                node.kill()
