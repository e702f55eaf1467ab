"""`streams.aio.within`: a timeout that never drops a cancellation (docs/chaos.md,
seed 3008: Python 3.11's `asyncio.wait_for` does)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from gateway.kafka import Offsets
from streams.aio import start_when_reachable, within
from streams.config import Settings
from streams.kafka.topics import ensure_topics


async def _cancelled_as_the_get_completes(
        wait: Callable[[Awaitable[object], float], Coroutine[Any, Any, object]]) -> bool:
    """Whether a task waiting on a queue under `wait` ends cancelled when an item
    arrives and the task is cancelled in the same loop iteration."""
    queue: asyncio.Queue[object] = asyncio.Queue()
    task: asyncio.Task[object] = asyncio.create_task(wait(queue.get(), 10.0))
    for _ in range(3):
        await asyncio.sleep(0)  # the task waits in get()
    queue.put_nowait("item")  # the get completes...
    task.cancel()  # ...and the cancel lands in the same iteration
    try:
        await task
    except asyncio.CancelledError:
        return True
    return False


async def test_within_keeps_a_cancel_that_lands_as_the_awaited_get_completes() -> None:
    """A cancel that lands as the awaited get completes cancels the task, every time."""
    for _ in range(50):
        assert await _cancelled_as_the_get_completes(within)


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for keeps the cancel")
async def test_the_race_is_real_asyncio_wait_for_drops_that_cancel_on_311() -> None:
    """The negative control: on 3.11 the same race through asyncio.wait_for returns the
    item and loses the cancel, so the test above can fail."""
    assert not await _cancelled_as_the_get_completes(asyncio.wait_for)


async def test_within_times_out_and_gives_the_result_in_time() -> None:
    """Like wait_for otherwise: TimeoutError past the limit, the result within it."""
    with pytest.raises(TimeoutError):
        await within(asyncio.Event().wait(), 0.01)
    assert await within(asyncio.sleep(0, "done"), None) == "done"


class _Flaky:
    """A client whose start fails `failures` times with `error`, then works."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error = failures, error
        self.starts = self.stops = 0

    async def start(self) -> None:
        """Fail the first `failures` times."""
        self.starts += 1
        if self.starts <= self.failures:
            raise self.error

    async def stop(self) -> None:
        """Count the stops."""
        self.stops += 1


async def test_a_start_kafka_refuses_is_undone_and_made_again_until_it_works() -> None:
    """Kafka not answering: each failed start is stopped, then started again; then it runs."""
    client = _Flaky(3, KafkaConnectionError("Unable to bootstrap"))
    await start_when_reachable("flaky", client.start, client.stop, stall_s=60, pause_s=0)
    assert (client.starts, client.stops) == (4, 3)


async def test_a_start_kafka_refuses_past_the_stall_bound_fails_with_its_error() -> None:
    """Past `stall_s` without a start, its last error is raised (the role exits)."""
    client = _Flaky(10**6, KafkaConnectionError("Unable to bootstrap"))
    with pytest.raises(KafkaConnectionError):
        await start_when_reachable("down", client.start, client.stop, stall_s=0.05, pause_s=0.01)
    assert client.starts >= 2 and client.stops == client.starts


async def test_an_error_that_is_not_kafkas_is_not_retried() -> None:
    """A bug (not a Kafka or socket error) fails the start at once."""
    client = _Flaky(1, ValueError("a bug"))
    with pytest.raises(ValueError):
        await start_when_reachable("buggy", client.start, client.stop, stall_s=60, pause_s=0)
    assert client.starts == 1


def _refusing_port() -> socket.socket:
    """A socket bound to a free port and not listening: connections to it are refused
    (as while a broker restarts), and no other process can take the port meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.mark.kafka
async def test_the_gateways_offsets_client_waits_for_a_broker_that_answers_late(
        kafka_bootstrap: str, make_settings: Callable[..., Settings],
        caplog: pytest.LogCaptureFixture) -> None:
    """aiokafka's start fails at once while nothing answers the bootstrap address (as
    during a broker restart); started under start_when_reachable, the gateway's offsets
    client waits, and works once the address answers (a relay to the session broker)."""
    refusing = _refusing_port()
    port = int(refusing.getsockname()[1])
    real = make_settings()
    await asyncio.to_thread(ensure_topics, real)
    settings = make_settings(KAFKA_BOOTSTRAP_SERVERS=f"127.0.0.1:{port}")
    offsets = Offsets(settings)
    starting = asyncio.create_task(start_when_reachable(
        "Offsets", offsets.start, offsets.stop, stall_s=120, pause_s=0.2))
    while "Kafka did not answer" not in caplog.text:  # the marker: one start refused
        assert not starting.done(), starting
        await asyncio.sleep(0.05)
    host, broker_port = kafka_bootstrap.split(",")[0].rsplit(":", 1)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(host, int(broker_port))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(relay, sock=refusing)  # listens from now on
    try:
        await starting  # the bootstrap answers now: the start completes
        tp = TopicPartition(settings.topics.commands, 0)
        assert (await offsets.end([tp]))[tp] == 0  # answered by the session broker
    finally:
        await offsets.stop()
        server.close()
