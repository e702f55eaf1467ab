"""The threads read model: the processor's committed table, materialized in memory.

One consumer per process reads the `threads` changelog (every partition, from the
beginning, read_committed) into `thread_id -> ThreadState` and `run_id -> thread_id`.
It is committed truth, so it stays right while processor partitions move.

Read-your-writes: a read of a thread that the model does not know, that this gateway
just wrote to, or that arrives before the initial load finished first waits until the
consumer has reached the partition's current last stable offset (bounded by a timeout).
A thread written through another gateway a moment ago may be read a few milliseconds
stale; its own writer's reads are not.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from gateway.kafka import (
    Offsets,
    new_consumer,
    partition_for,
    run_forever,
    stop_client,
    stop_task,
    topic_partitions,
)
from streams.config import Settings
from streams.domain import ThreadState
from streams.serialization import DecodeError, decode_state

__all__ = ["ActiveRunStart", "ReadModel"]

log = logging.getLogger("threadline.gateway")

RECENT_WRITE_S = 30.0  # how long after a local write reads of the thread wait to catch up
_POLL_S = 0.005

ActiveRunStart = tuple[str, str, int]  # thread_id, run_id, accepted at (ms)


class ReadModel:
    def __init__(self, settings: Settings, offsets: Offsets,
                 catch_up_timeout_s: float = 5.0) -> None:
        self.settings = settings
        self.offsets = offsets
        self.catch_up_timeout_s = catch_up_timeout_s
        self.states: dict[str, ThreadState] = {}
        self.run_threads: dict[str, str] = {}
        self._topic = settings.topics.threads
        self._consumer_: AIOKafkaConsumer | None = None  # made in start(): needs the loop
        self._recent: dict[str, float] = {}
        self._initial_end: dict[TopicPartition, int] = {}
        self._loaded = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def _consumer(self) -> AIOKafkaConsumer:
        assert self._consumer_ is not None, "ReadModel.start() first"
        return self._consumer_

    async def start(self) -> None:
        self._consumer_ = new_consumer(self.settings)
        await self._consumer.start()
        tps = topic_partitions(self.settings, self._topic)
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        self._initial_end = await self._consumer.end_offsets(tps)
        self._task = asyncio.create_task(run_forever("threads consumer", self._step))

    async def stop(self) -> None:
        await stop_task(self._task)
        if self._consumer_ is not None:
            await stop_client(self._consumer_)

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    async def wait_loaded(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._loaded.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def note_write(self, thread_id: str) -> None:
        now = time.monotonic()
        self._recent[thread_id] = now + RECENT_WRITE_S
        if len(self._recent) > 10_000:
            self._recent = {k: v for k, v in self._recent.items() if v > now}

    def _recently_written(self, thread_id: str) -> bool:
        deadline = self._recent.get(thread_id)
        return deadline is not None and deadline > time.monotonic()

    async def catch_up(self, partitions: list[int] | None = None) -> bool:
        """Wait until the model has read each partition up to its current end."""
        parts = range(self.settings.partitions) if partitions is None else partitions
        tps = [TopicPartition(self._topic, p) for p in parts]
        deadline = time.monotonic() + self.catch_up_timeout_s
        try:
            ends = await asyncio.wait_for(self.offsets.end(tps), self.catch_up_timeout_s)
        except Exception as exc:  # Kafka unreachable: answer from what we have
            log.warning("threads catch-up: end offsets unavailable: %s", exc)
            return False
        for tp in tps:
            while await self._consumer.position(tp) < ends[tp]:
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(_POLL_S)
        return True

    async def thread(self, tenant: str, thread_id: str, *, fresh: bool = False) -> \
            ThreadState | None:
        """The tenant's thread, or None (unknown, or another tenant's)."""
        state = self.states.get(thread_id)
        if fresh or state is None or not self.loaded or self._recently_written(thread_id):
            await self.catch_up([partition_for(thread_id, self.settings.partitions)])
            state = self.states.get(thread_id)
        return state if state is not None and state.tenant == tenant else None

    async def thread_of_run(self, tenant: str, run_id: str) -> ThreadState | None:
        thread_id = self.run_threads.get(run_id)
        if thread_id is None:
            await self.catch_up()
            thread_id = self.run_threads.get(run_id)
        if thread_id is None:
            return None
        return await self.thread(tenant, thread_id)

    def active_runs(self) -> list[ActiveRunStart]:
        """Every active run with the time its user message was accepted."""
        found = []
        for state in self.states.values():
            run = state.active_run
            if run is None:
                continue
            at = next((m.created_at_ms for m in reversed(state.messages)
                       if m.message_id == run.message_id), run.attempt_started_ms)
            found.append((state.thread_id, run.run_id, at))
        return found

    async def _step(self) -> None:
        batch = await self._consumer.getmany(timeout_ms=500, max_records=2000)
        for records in batch.values():
            for record in records:
                thread_id = (record.key or b"").decode(errors="replace")
                if record.value is None:
                    self.states.pop(thread_id, None)
                    continue
                try:
                    state = decode_state(record.value)
                except DecodeError as exc:
                    log.warning("skipping an undecodable thread state: %s", exc)
                    continue
                self.states[state.thread_id] = state
                for run_id in state.runs:
                    self.run_threads[run_id] = state.thread_id
        if not self._loaded.is_set():
            for tp, end in self._initial_end.items():
                if await self._consumer.position(tp) < end:
                    return
            self._loaded.set()
            log.info("threads read model loaded: %d threads", len(self.states))
