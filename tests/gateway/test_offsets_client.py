"""The gateway's offset-query client against the real broker."""

from __future__ import annotations

import pytest

from gateway.kafka import Offsets
from streams.config import Settings
from streams.kafka.topics import ensure_topics

pytestmark = pytest.mark.kafka


async def test_a_started_offsets_client_knows_the_topics_it_is_asked_about(
        settings: Settings) -> None:
    """A new or restarted gateway's first thread read and first stream open ask for end
    offsets: the client knows those topics from its start, else aiokafka learns each on
    its first miss and retries 100 ms later (205 ms, then 103 more)."""
    ensure_topics(settings)
    offsets = Offsets(settings)
    await offsets.start()
    try:
        everything = set(range(settings.partitions))
        for topic in (settings.topics.stream, settings.topics.threads, settings.topics.messages):
            assert offsets.client.partitions_for_topic(topic) == everything, topic
    finally:
        await offsets.stop()
