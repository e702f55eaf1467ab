"""The worker's lifecycle watch against the real broker: what a restarted worker does
between its assignment and its first run."""

from __future__ import annotations

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndTimestamp

from streams.config import Settings
from streams.kafka.topics import ensure_topics
from streams.wire import Codec
from streams.worker.watch import LifecycleWatch

pytestmark = pytest.mark.kafka


async def test_a_started_watch_knows_its_topics_and_seeks_new_partitions_at_once(
        settings: Settings) -> None:
    """A restarted worker asks where its dispatch partitions end and follows the
    stream's: the offsets client knows both topics from its start (aiokafka otherwise
    learns a topic on its first miss and retries 100 ms later, once per topic), and
    every new partition is sought with one query, not one (or two) each."""
    ensure_topics(settings)
    watch = LifecycleWatch(settings, "watch-test", lambda run, fate: None, Codec())
    await watch.start()
    try:
        everything = set(range(settings.partitions))
        for topic in (settings.topics.stream, settings.topics.dispatch):
            assert watch.offsets.partitions_for_topic(topic) == everything, topic
        asked: list[list[int]] = []
        query = watch.offsets.offsets_for_times

        async def counted(times: dict[TopicPartition, int]) \
                -> dict[TopicPartition, OffsetAndTimestamp | None]:
            asked.append(sorted(tp.partition for tp in times))
            found: dict[TopicPartition, OffsetAndTimestamp | None] = await query(times)
            return found

        watch.offsets.offsets_for_times = counted
        await watch.follow(everything)
        assert asked == [sorted(everything)]
        assert set(watch.covered_from) == everything
        for p in everything:  # each sought: an empty partition's end
            assert await watch.consumer.position(TopicPartition(settings.topics.stream, p)) == 0
    finally:
        await watch.stop()
