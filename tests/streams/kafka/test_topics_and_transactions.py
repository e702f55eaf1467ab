"""The broker contract: topics as declared, and transactions as Kafka defines them."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # exported, not in its __all__
    AdminClient,
    ConfigResource,
    NewTopic,
)

import streams.kafka.topics as topics_module
from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.topics import TopicMismatch, ensure_topics

pytestmark = pytest.mark.kafka


def _read_all(bootstrap: str, topic: str, isolation: str, expect_at_least: int = 0) -> list[bytes]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4()}",
        "isolation.level": isolation, "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    })
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    idle = 0
    while idle < (10 if len(values) >= expect_at_least else 40):
        msg = consumer.poll(0.1)
        if msg is None:
            idle += 1
            continue
        if not msg.error():
            values.append(msg.value() or b"")
    consumer.close()
    return values


def test_topics_are_created_with_the_declared_contract(settings: Settings) -> None:
    """ensure_topics creates every topic with its partitions and configs, and is idempotent."""
    specs = ensure_topics(settings)
    ensure_topics(settings)  # idempotent
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    md = admin.list_topics(timeout=10)
    assert {s.name for s in specs} == set(settings.topics.all())
    for spec in specs:
        assert len(md.topics[spec.name].partitions) == settings.partitions
    res = {r.name: f.result() for r, f in admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, n) for n in settings.topics.all()]).items()}
    assert res[settings.topics.events]["cleanup.policy"].value == "compact"
    assert res[settings.topics.events]["min.compaction.lag.ms"].value == str(7 * 24 * 3600 * 1000)
    assert set(res[settings.topics.stream]["cleanup.policy"].value.split(",")) == {"compact", "delete"}
    assert res[settings.topics.stream]["min.compaction.lag.ms"].value == str(30 * 60 * 1000)
    assert res[settings.topics.stream]["retention.ms"].value == str(30 * 60 * 1000)


def test_an_existing_topic_that_disagrees_is_a_clear_error(settings: Settings) -> None:
    """An existing topic with other partitions is a TopicMismatch error."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    admin.create_topics([NewTopic(settings.topics.events, 1, 1)])[settings.topics.events].result()
    with pytest.raises(TopicMismatch, match="partitions"):
        ensure_topics(settings)


def test_an_existing_topic_with_another_cleanup_policy_is_a_clear_error(settings: Settings) -> None:
    """Every topic's policy is asked in one request; the one that disagrees is named,
    and the others are not."""
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    admin.create_topics([NewTopic(settings.topics.stream, settings.partitions, 1,
                                  config={"cleanup.policy": "delete"})])[
        settings.topics.stream].result()
    with pytest.raises(TopicMismatch, match=r"cleanup\.policy") as raised:
        ensure_topics(settings)
    assert f"{settings.topics.stream}: cleanup.policy=delete" in str(raised.value)
    assert settings.topics.events not in str(raised.value)


def test_transactional_produce_is_invisible_until_commit_and_gone_after_abort(
    settings: Settings,
) -> None:
    """read_committed consumers see transactional records only once committed, never if aborted."""
    topic = f"{settings.topic_prefix}tx"
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    producer = Producer({"bootstrap.servers": settings.bootstrap,
                         "transactional.id": f"tx-{uuid.uuid4()}"})
    producer.init_transactions(30)

    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush()
    assert _read_all(settings.bootstrap, topic, "read_committed") == []
    assert _read_all(settings.bootstrap, topic, "read_uncommitted", 1) == [b"aborted"]
    producer.abort_transaction(30)

    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.flush()
    assert _read_all(settings.bootstrap, topic, "read_committed") == []
    producer.commit_transaction(30)

    assert _read_all(settings.bootstrap, topic, "read_committed", 1) == [b"committed"]


def test_a_topic_wait_that_gets_nowhere_fails_once_stalled(tmp_path: Path) -> None:
    """The topic waits are bounded by progress: with no broker to answer, nothing
    advances, and ensure_topics fails once `THREADLINE_TOPIC_STALL_S` went by."""
    settings = Settings.from_env({"KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",
                                  "THREADLINE_DATA_DIR": str(tmp_path), "THREADLINE_TOPIC_STALL_S": "2"})
    started = time.monotonic()
    with pytest.raises(KafkaException):
        ensure_topics(settings)
    assert time.monotonic() - started >= 2


def test_a_start_over_existing_topics_asks_for_them_all_at_once(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A role's start checks every topic: their policies in one request and whether
    every partition is served in one query, not a round trip per topic and per
    partition (issue #22: 134 ms of every role's start, 23-33 ms now)."""
    ensure_topics(settings)  # made: the check below is a restart's
    asked: Counter[str] = Counter()

    class Counted:
        def __init__(self, client: Any) -> None:
            self.client = client

        def __getattr__(self, name: str) -> Any:
            asked[name] += 1
            return getattr(self.client, name)

    made_admin, made_probe = topics_module._admin, topics_module._probe
    monkeypatch.setattr(topics_module, "_admin", lambda s: Counted(made_admin(s)))
    monkeypatch.setattr(topics_module, "_probe", lambda s: Counted(made_probe(s)))
    ensure_topics(settings)
    assert asked["describe_configs"] == 1
    assert asked["list_offsets"] == 1 and asked["get_watermark_offsets"] == 0
