"""THREADLINE_SCHEMA_REGISTRY_URL end to end, against a real registry (Apicurio
Registry, in memory, its Confluent-compatible API: `schema_registry_url`).

The processor and worker run as processes and the gateway in-process, all with the
registry set. A post is answered; every record the roles wrote to the topics is in
the Confluent wire format (magic 0, 4-byte schema id), under a subject
`<topic>-value`; and an analytics-style reader that knows nothing of Threadline but
the registry's REST API decodes them with plain fastavro."""

from __future__ import annotations

import asyncio
import io
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import fastavro
import pytest
import pytest_asyncio
from confluent_kafka import Consumer, KafkaError, TopicPartition

from gateway.keys import CODEC
from streams.config import Settings
from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, Stack, gateway_env, running_stack

pytestmark = pytest.mark.kafka


@pytest_asyncio.fixture
async def registry_stack(kafka_bootstrap: str, schema_registry_url: str,
                         tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """The gateway test stack with every role using the schema registry."""
    folder = tmp_path_factory.mktemp("registry-stack")
    env = gateway_env(kafka_bootstrap, folder) | {
        "THREADLINE_SCHEMA_REGISTRY_URL": schema_registry_url}
    async with running_stack(env, folder) as running:
        yield running


class AnalyticsReader:
    """Reads Confluent-framed Avro with only the registry's REST API and fastavro."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.schemas: dict[int, Any] = {}

    def schema(self, schema_id: int) -> Any:
        """The writer schema with this id, fetched from the registry once."""
        if schema_id not in self.schemas:
            with urllib.request.urlopen(f"{self.url}/schemas/ids/{schema_id}", timeout=10) as r:
                self.schemas[schema_id] = fastavro.parse_schema(json.loads(json.load(r)["schema"]))
        return self.schemas[schema_id]

    def decode(self, value: bytes) -> tuple[int, dict[str, Any]]:
        """A Confluent-framed record's schema id and decoded body."""
        assert value[0] == 0, f"not the Confluent wire format: {value[:10].hex()}"
        schema_id = int.from_bytes(value[1:5], "big")
        body = io.BytesIO(value[5:])
        record = fastavro.schemaless_reader(body, self.schema(schema_id), None,
                                            return_record_name=True)
        assert body.tell() == len(value) - 5, "trailing bytes"
        assert isinstance(record, dict)
        return schema_id, record


def _read_all(settings: Settings, topic: str) -> list[bytes]:
    """Every committed record of `topic` now (tombstones left out)."""
    consumer = Consumer({
        "bootstrap.servers": settings.bootstrap, "group.id": f"analytics-{uuid.uuid4()}",
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "enable.partition.eof": True, "log_level": 3,
    })
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[bytes] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + 30
        while len(at_end) < len(partitions) and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                error = msg.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    at_end.add(msg.partition() or 0)
                elif (value := msg.value()) is not None:
                    values.append(value)
        assert len(at_end) == len(partitions), f"{topic}: not read to its end"
        return values
    finally:
        consumer.close()


async def test_roles_write_the_confluent_format_and_answer_a_post(
        registry_stack: Stack, schema_registry_url: str) -> None:
    """With a registry, a post is answered and every topic holds Confluent-framed records others can read."""
    stack = registry_stack
    assert stack.server.app[CODEC].registry is not None
    thread_id = await stack.create_thread()
    status, accepted = await stack.post(thread_id, "hello through the registry")
    assert status == 202, accepted
    events = await read_sse(stack.session, stack.url(f"/v1/runs/{accepted['run_id']}/events"),
                            headers=AUTH_A)
    names = [e.event for e in events]
    assert "run_completed" in names and names[-1] == "done", (names, stack.logs())
    status, messages = await stack.get(f"/v1/threads/{thread_id}/messages")
    assert status == 200 and [m["role"] for m in messages["messages"]] == ["user", "assistant"]

    topics = stack.settings.topics
    reader = AnalyticsReader(schema_registry_url)
    seen: dict[str, set[str]] = {}
    for topic in (topics.commands, topics.events, topics.dispatch, topics.stream,
                  topics.threads, topics.messages):
        values = await asyncio.to_thread(_read_all, stack.settings, topic)
        assert values, f"nothing on {topic}"
        for value in values:
            schema_id, record = reader.decode(value)
            assert record["thread_id"] == thread_id, (topic, record)
            seen.setdefault(topic, set()).add(str(schema_id))
        # Every id on the topic is registered under the topic's subject. (Roles that
        # start together may each register the schema: Apicurio can then keep identical
        # content under two versions, so a topic may carry two ids of one schema.)
        subject = f"{schema_registry_url}/subjects/{topic}-value/versions"
        with urllib.request.urlopen(subject, timeout=10) as r:
            versions = json.load(r)
        registered: dict[str, Any] = {}
        for version in versions:
            with urllib.request.urlopen(f"{subject}/{version}", timeout=10) as r:
                found = json.load(r)
            registered[str(found["id"])] = json.loads(found["schema"])
        assert seen[topic] <= set(registered), (topic, seen[topic], sorted(registered))
        assert len({json.dumps(registered[i], sort_keys=True) for i in seen[topic]}) == 1, topic
    # The event log holds the whole run, readable without any Threadline code.
    kinds = [reader.decode(v)[1]["payload"][0] for v in
             await asyncio.to_thread(_read_all, stack.settings, topics.events)]
    assert kinds[0] == "threadline.ThreadCreated" and "threadline.RunCompleted" in kinds, kinds
