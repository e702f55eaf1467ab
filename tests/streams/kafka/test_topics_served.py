"""ensure_topics returns once every partition is served, also when the client that asks
the leaders was told earlier, by a broker that had not yet applied the creation, that
a topic does not exist."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from streams.config import Settings
from streams.kafka import topics
from streams.kafka.topics import ensure_specs
from streams.topics import TopicSpec

pytestmark = pytest.mark.kafka


def test_a_probe_that_was_told_a_topic_is_unknown_does_not_stall_the_wait(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka keeps "unknown topic" in its metadata cache behind the entries cached
    before it (15 min), answering every query of that topic from there: a three-node
    cluster's start stalled 90 s so (tests/streams/test_three_nodes.py, a full suite run).
    The wait replaces a probe that failed, and returns."""
    config = {"cleanup.policy": "delete"}
    known = TopicSpec(f"{settings.topic_prefix}known", 1, 1, config)
    late = TopicSpec(f"{settings.topic_prefix}late", 1, 1, config)
    ensure_specs(settings, [known])

    # The probe as the slow broker left it: `known` cached first, then `late` unknown.
    stale = topics._probe(settings)
    stale.get_watermark_offsets(TopicPartition(known.name, 0), timeout=30)
    with pytest.raises(KafkaException):
        stale.get_watermark_offsets(TopicPartition(late.name, 0), timeout=30)
    made: list[Consumer] = []
    new_probe = topics._probe

    def probe(s: Settings) -> Consumer:
        made.append(stale if not made else new_probe(s))
        return made[-1]

    monkeypatch.setattr(topics, "_probe", probe)
    # The admin's query for all partitions at once answers nothing here (as when the
    # admin was told so too): each partition is asked alone, on the probe.
    monkeypatch.setattr(topics, "_served_at_once", lambda admin, tps, progress: set())
    ensure_specs(settings, [known, late])  # without a new probe: TopicMismatch after the stall
    assert len(made) >= 2, "the stale probe answered: librdkafka no longer keeps the unknown topic"


def test_the_stalled_wait_says_why_each_partition_is_not_served_and_which_brokers_serve(
    settings: Settings,
) -> None:
    """The error of a stalled wait names each partition's last failure, its leader,
    replicas and ISR, and the brokers the cluster counts (registered and unfenced),
    with the replicas not among them: so the next failure says where it stuck."""
    spec = TopicSpec(f"{settings.topic_prefix}seen", 1, 1, {"cleanup.policy": "delete"})
    ensure_specs(settings, [spec])
    admin = topics._admin(settings)
    md = admin.list_topics(timeout=30)
    broker, brokers = md.topics[spec.name].partitions[0].leader, sorted(md.brokers)
    absent = f"{settings.topic_prefix}absent"  # never created
    text = topics._diagnosis(admin, [TopicPartition(spec.name, 0), TopicPartition(absent, 0)],
                             {(spec.name, 0): "its offsets not answered: _UNKNOWN_PARTITION"})
    assert text == (
        f"{spec.name}[0]: its offsets not answered: _UNKNOWN_PARTITION (leader {broker}, "
        f"replicas [{broker}], ISR [{broker}]); {absent}[0]: not asked yet (not in the metadata). "
        f"Brokers registered and unfenced: {brokers}"), text
    assert topics._brokers(admin, {broker, max(brokers) + 1}).endswith(
        f"; replicas not among them (fenced or down): [{max(brokers) + 1}]")
