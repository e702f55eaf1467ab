"""/readyz against a real processor restoring existing data: 503 until the processor
has restored every partition and decides, then 200, and the first post after it is
decided at once (not `pending`)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from confluent_kafka import Producer

from gateway.app import Options, create_app
from gateway.http.ready import READY, probe_thread_id
from gateway.kafka import partition_for
from streams.config import Settings
from streams.core.domain import RunStatus, StoredMessage, ThreadState
from streams.core.history import message_key
from streams.core.records import MessageRecord
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess
from streams.wire import Codec, new_meta
from tests.gateway.conftest import AUTH_A, gateway_env

CODEC = Codec()  # single-object records, as the roles write them without a registry

pytestmark = pytest.mark.kafka

log = logging.getLogger("tests.readiness")

THREADS = 20_000  # existing data the processor restores before it decides


def test_probe_thread_ids_hash_to_their_partition() -> None:
    """Each readiness probe's thread id lands on the partition it probes."""
    for partitions in (1, 4, 12, 48):
        for p in range(partitions):
            assert partition_for(probe_thread_id(p, partitions), partitions) == p


def _existing_data(settings: Settings) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 50,
                         "partitioner": "murmur2_random"})
    for i in range(THREADS):
        thread_id = f"old-{i}-{uuid.uuid4()}"
        state = ThreadState(thread_id, "tenant-a", "old", 1_000, message_count=1, run_count=1,
                            updated_at_ms=1_000 + i)
        producer.produce(settings.topics.threads, CODEC.encode_state(state), thread_id.encode())
        message = StoredMessage(f"m-{i}", "user", "hello", f"r-{i}", 1_000)
        producer.produce(settings.topics.messages, CODEC.encode_message(
            MessageRecord(0, message, RunStatus.COMPLETED, 1), new_meta(thread_id, "tenant-a", 0)),
            message_key(thread_id, 0), partition=partition_for(thread_id, settings.partitions))
        if i % 5_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


async def test_readyz_is_503_until_the_processor_restored_then_the_first_post_is_decided(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """/readyz is 503 until the processor has restored its state, then a post is decided at once."""
    env = gateway_env(kafka_bootstrap, tmp_path)
    settings = Settings.from_env(env)
    ensure_topics(settings)
    _existing_data(settings)
    app = create_app(settings, Options(ready_timeout_s=0.5, ready_cache_s=5))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    processor = RoleProcess("processor", env, tmp_path / "processor.log")
    try:
        async with aiohttp.ClientSession() as session:
            async def readyz() -> tuple[int, dict[str, object]]:
                async with session.get(str(server.make_url("/readyz"))) as response:
                    return response.status, await response.json()

            status, body = await readyz()  # no processor: nothing decides
            assert status == 503 and body["partitions_waiting"] == list(range(4)), body
            written = app[READY].probes_written
            status, body = await readyz()  # the probes still wait: none written again
            assert status == 503 and app[READY].probes_written == written == 4
            started = time.monotonic()
            processor.start()
            answers: list[int] = []
            # Bounded by progress, not the clock: the restore goes on while the processor
            # logs (each partition's restore) or /readyz shows fewer partitions waiting.
            progress, since = (-1, ""), started
            while not answers or answers[-1] != 200:
                status, body = await readyz()
                answers.append(status)
                assert processor.alive(), processor.tail()
                now = (len(processor.output()), str(body.get("partitions_waiting")))
                if now != progress:
                    progress, since = now, time.monotonic()
                assert time.monotonic() - since < 60, ("no progress in 60 s", answers, processor.tail())
            ready_s = time.monotonic() - started
            # Ready implies restored: every partition's restore is in the processor's log.
            restored = {int(p) for line in processor.tail(400).splitlines()
                        if "restored in" in line
                        for p in line.split("partitions [", 1)[1].split("]", 1)[0].split(", ")}
            assert restored == set(range(settings.partitions)), processor.tail()
            # The first post after 200 gets its decision, not "pending".
            async with session.post(str(server.make_url("/v1/threads")), json={"title": "r"},
                                    headers=AUTH_A) as response:
                created = await response.json()
                assert response.status == 201, created
            async with session.post(
                    str(server.make_url(f"/v1/threads/{created['thread_id']}/user_message")),
                    json={"input_text": "decided?"}, headers=AUTH_A) as response:
                posted = await response.json()
                assert response.status == 202 and posted["status"] == "accepted", posted
            status, body = await readyz()  # cached
            assert status == 200 and body["cached"] is True
            print(f"\nreadyz: {answers.count(503)} x 503, then 200; processor start to ready "
                  f"{ready_s:.2f} s with {THREADS} threads and {THREADS} messages to restore")
    finally:
        await server.close()
        processor.stop()


async def _stream_status(session: aiohttp.ClientSession, base: str) -> int:
    async with session.get(base + "/v1/threads/no-such-thread/stream",
                           headers=AUTH_A) as response:
        return response.status


async def test_a_cold_gateway_serves_livez_at_once_and_v1_once_its_read_model_loaded(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """A cold start reads every thread and message first: meanwhile the process is
    alive to a liveness probe, and /v1 says 503 with Retry-After, never a wrong 404."""
    from streams.devtools.broker import free_port

    env = {**gateway_env(kafka_bootstrap, tmp_path), "THREADLINE_HTTP_PORT": str(free_port())}
    settings = Settings.from_env(env)
    ensure_topics(settings)
    _existing_data(settings)
    base = f"http://127.0.0.1:{settings.gateway.http_port}"
    gateway = RoleProcess("gateway", env, tmp_path / "gateway.log").start()
    try:
        async with aiohttp.ClientSession() as session:
            seen: list[tuple[int, int, str | None]] = []  # livez, /v1 status, Retry-After
            stream: asyncio.Task[int] | None = None
            while not seen or seen[-1][1] != 200:
                assert gateway.alive(), gateway.tail()
                try:
                    async with session.get(base + "/livez") as live:
                        live_status = live.status
                    async with session.get(base + "/v1/threads?limit=1",
                                           headers=AUTH_A) as response:
                        body = await response.json(content_type=None)
                        seen.append((live_status, response.status,
                                     response.headers.get("Retry-After")))
                        assert response.status in (200, 503), body
                    if stream is None and response.status == 503:
                        stream = asyncio.create_task(_stream_status(session, base))
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.02)  # not listening yet
            assert all(live == 200 for live, _, _ in seen)
            loading = [s for s in seen if s[1] == 503]
            assert loading, f"the load ended before the first answer: {seen[:3]}"
            assert all(retry == "2" for _, _, retry in loading)
            assert body["threads"], body  # the existing threads, once loaded
            # A stream opened during the load waited for it (a browser's EventSource
            # would give up for good on a 503): here the unknown thread's 404.
            assert stream is not None and await stream == 404
            print(f"\ncold gateway: {len(loading)} answers of 503 while loading "
                  f"{THREADS} threads and {THREADS} messages, then 200")
    finally:
        gateway.stop()
