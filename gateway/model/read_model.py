"""The read model: threads and their messages, from a local store kept up to date
from the `threads` and `messages` changelogs.

One consumer per process (no group, every partition of both topics,
read_committed) applies each batch to a RocksDB store (`gateway.model.read_store`)
together with the offsets it reaches. A restarted gateway opens its store and
reads only what was written after its checkpoints (a warm start); a new one reads
both topics from the start (a cold start). Either way the time it took and the
records read are logged and shown by `/healthz`. Nothing per thread or per
message stays in Python memory but the set of active runs.

The store lives in `data_dir/gateway/<host>-<port>`; a second gateway process with
the same settings on the same machine (the lock is taken) uses `<host>-<port>.1`,
and so on. A store that was built for other topics, whose checkpoints do not fit
the topics any more (recreated, or trimmed past them), or that was last written
longer ago than the topics keep tombstones (`delete.retention.ms`: a deleted
thread could survive in it) is started afresh.

Read-your-writes: a read of a thread that the model does not know, that this gateway
just wrote to, or that arrives before the initial load finished first waits until the
model has reached the partition's current last stable offset on both topics
(bounded by a timeout). A thread written through another gateway a moment ago may
be read a few milliseconds stale; its own writer's reads are not.

In a gateway group the model is split (`split=True`): it reads and serves only the
partitions `hold` names (the share the group gave this gateway's stream feed) and
those `keep_warm` names (standby copies of other gateways' shares). A partition taken
is read from its checkpoint (reads of it wait meanwhile), one let go of keeps its rows
for a later return, and a read of a thread held elsewhere either raises
`HeldElsewhere` (the request is sent on whole to the owner) or is asked of the owner
(`elsewhere`), as `gateway.model.placement` decides per request. Lists of threads and
run lookups by id gather from every gateway.

Consistency of a batch: `getmany` hands out records and advances the consumer's
positions; the batch is applied and committed to RocksDB before the step awaits
anything, so a coroutine that sees a position also sees the rows before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from gateway.http.problems import Problem
from gateway.kafka import (
    FetchBatching,
    Offsets,
    new_consumer,
    partition_for,
    run_forever,
    stop_client,
    stop_task,
    topic_partitions,
)
from gateway.model.branches import Branch, branches, is_straight, page_of, path_oldest_first
from gateway.model.placement import FORWARD, ROUTE, ElsewhereReads, HeldElsewhere, Hints, NowHeldHere
from gateway.model.read_store import (
    MESSAGES,
    THREADS,
    ActiveRunStart,
    MessagePage,
    ReadStore,
    RunRef,
    ThreadPage,
    run_status,
)
from gateway.model.titles import display_title, needs_message
from streams.aio import within
from streams.config import Settings
from streams.core.branches import head_of
from streams.core.domain import RunStatus, ThreadState
from streams.core.records import MessageRecord
from streams.heap import release_free_memory
from streams.kafka.clients import librdkafka_config
from streams.wire import Codec

__all__ = ["ActiveRunStart", "ReadModel", "RunView", "store_folder"]

log = logging.getLogger("threadline.gateway")

K = TypeVar("K")
V = TypeVar("V")

RECENT_WRITE_S = 30.0  # how long after a local write reads of the thread wait to catch up
# Marks of recent writes kept at most (the oldest go first: a read of its thread then
# answers from what the model holds, without waiting for the write).
MARKS_KEPT = 100_000
_POLL_S = 0.005
DEFAULT_DELETE_RETENTION_MS = 24 * 3600 * 1000  # Kafka's default delete.retention.ms
TOUCH_S = 600.0  # an idle store's saved_at is renewed this often
RESTORE_FETCH_BYTES = 4 << 20  # per fetch; 4 MiB reads ~10,000 records


def remember(marks: dict[K, V], key: K, value: V, until: Callable[[V], float]) -> None:
    """Set `marks[key]` and drop the expired marks from the front. Every mark expires
    RECENT_WRITE_S after it is set, so insertion order is expiry order: each call
    drops only what has expired (was a rebuild of the whole dict past 10,000)."""
    marks.pop(key, None)
    marks[key] = value
    now = time.monotonic()
    for first in list(itertools.islice(marks, 64)):
        if until(marks[first]) > now and len(marks) <= MARKS_KEPT:
            break
        del marks[first]


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as the read model knows it."""

    state: ThreadState
    run_id: str
    seq: int  # of its user message
    message: MessageRecord | None
    status: RunStatus | None

    @property
    def accepted_at_ms(self) -> int:
        """When the run's user message was created (its acceptance time), 0 if unknown."""
        return self.message.message.created_at_ms if self.message is not None else 0

    @property
    def terminal(self) -> bool:
        """Whether the run has ended (completed, failed or cancelled)."""
        return self.status is not None and self.status.is_terminal


def store_folder(settings: Settings) -> str:
    """The store's name for a gateway with these settings (before lock fallbacks)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{settings.gateway.http_host}-{settings.gateway.http_port}")


class ReadModel:
    """The threads and messages topics kept in a local RocksDB store, for the REST reads."""
    def __init__(self, settings: Settings, offsets: Offsets,
                 catch_up_timeout_s: float = 5.0, store_name: str | None = None,
                 codec: Codec | None = None, split: bool = False) -> None:
        self.settings = settings
        # With `split` (a gateway group) only the partitions `hold` names are read and
        # served here; reads of the others go elsewhere (`gateway.model.placement`).
        self.held: set[int] | None = set() if split else None
        self.owned: set[int] = set()  # split: the share the group gave this gateway
        self.standby: set[int] = set()  # split: standby copies of other gateways' shares
        self._wanted: set[int] | None = self.held
        self._loading: dict[int, dict[TopicPartition, int]] = {}  # held, not read to these yet
        self._held_changed = asyncio.Event()
        self._progress = asyncio.Event()  # set after each batch is applied
        self.elsewhere: ElsewhereReads | None = None
        # Split: a tenant's active runs in the partitions other gateways hold.
        self.runs_elsewhere: Callable[[str], int] = lambda tenant: 0
        self._retention_ms = DEFAULT_DELETE_RETENTION_MS
        self._first_share_read = False
        self.ready_s: float | None = None  # from start to ready (split: its first share read)
        # THREADLINE_SCHEMA_REGISTRY_URL: the Confluent format; else single-object.
        self.codec = codec or Codec.from_settings(settings)
        self.offsets = offsets
        self.catch_up_timeout_s = catch_up_timeout_s
        self.store_name = store_name or store_folder(settings)
        self.on_deleted: Callable[[str], None] | None = None  # a thread's tombstone was read
        self._topics = {settings.topics.threads: THREADS, settings.topics.messages: MESSAGES}
        self._consumer_: AIOKafkaConsumer | None = None  # made in start(): needs the loop
        self._batching: FetchBatching | None = None  # with the consumer
        self._store_: ReadStore | None = None
        self._lock_file: IO[bytes] | None = None
        self._recent: dict[str, float] = {}
        self._created: dict[str, float] = {}  # threads decided created a moment ago
        self._accepted: dict[str, tuple[str, float]] = {}  # run -> its thread, until when to wait
        self._accepted_on: dict[str, tuple[str, float]] = {}  # thread -> its last run accepted
        self._ended: dict[str, tuple[str, float]] = {}  # thread -> its run just ended, until when
        self._initial_end: dict[TopicPartition, int] = {}
        self._checkpointed: dict[TopicPartition, int] = {}
        self._loaded = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._started_at = 0.0
        self._touched_at = time.monotonic()
        self.mode = "cold"
        self.restore_s: float | None = None
        self.read_records = {THREADS: 0, MESSAGES: 0}  # since this process started
        self.read_until_loaded = {THREADS: 0, MESSAGES: 0}

    @property
    def _consumer(self) -> AIOKafkaConsumer:
        assert self._consumer_ is not None, "ReadModel.start() first"
        return self._consumer_

    @property
    def store(self) -> ReadStore:
        """The opened local store."""
        assert self._store_ is not None, "ReadModel.start() first"
        return self._store_

    def _tps(self) -> list[TopicPartition]:
        if self.held is not None:
            return [TopicPartition(topic, p) for topic in self._topics for p in sorted(self.held)]
        return [tp for topic in self._topics for tp in topic_partitions(self.settings, topic)]

    def partition_of(self, thread_id: str) -> int:
        """The partition of each topic that holds the thread's records."""
        return partition_for(thread_id, self.settings.partitions)

    def here(self, partition: int) -> bool:
        """Whether this gateway reads and serves the partition (loaded or loading)."""
        return self.held is None or partition in self.held

    def hold(self, partitions: set[int]) -> None:
        """Read and serve these partitions (a gateway group's share), and the standby
        copies `keep_warm` names: new ones are read from their checkpoints, or from the
        start, while reads of them wait; the ones let go keep their rows and
        checkpoints for a later return."""
        assert self.held is not None, "hold() is for a split read model"
        self.owned = set(partitions)
        self._want()

    def keep_warm(self, partitions: set[int]) -> None:
        """Also read and serve these partitions, owned by other gateways: a standby
        copy, current when one of them comes here (`THREADLINE_GATEWAY_STANDBYS`)."""
        self.standby = set(partitions)
        self._want()

    def _want(self) -> None:
        wanted = self.owned | self.standby
        if wanted != self._wanted:
            self._wanted = wanted
            self._held_changed.set()

    @property
    def loading(self) -> list[int]:
        """The held partitions not read up to where they were when taken."""
        return sorted(self._loading)

    @property
    def ready(self) -> bool:
        """Loaded; split, its first share read up to where it was when taken (a later
        rebalance does not take a serving gateway out of its load balancer)."""
        self._see_first_share()
        return self.loaded and (self.held is None or self._first_share_read)

    def _see_first_share(self) -> None:
        if self.held is not None and not self._first_share_read and self.held \
                and self._wanted == self.held and not self._loading:
            self._first_share_read = True
            self.ready_s = time.monotonic() - self._started_at
            log.info("read model ready: its first share %s read in %.2f s", sorted(self.held),
                     self.ready_s)
            release_free_memory()  # the load's decoded batches are garbage now

    async def wait_held(self, partitions: set[int]) -> None:
        """Until these partitions are held and read up to where they were when taken
        (or `hold` lets go of one of them: the caller's assignment is over)."""
        while True:
            wanted = self._wanted or set()
            if not partitions <= wanted or (self.held is not None and partitions <= self.held
                                            and not partitions & set(self._loading)):
                return
            self._progress.clear()
            await self._progress.wait()

    async def start(self) -> None:
        """Open (or start afresh) the local store and begin reading the threads and messages topics."""
        self._started_at = time.monotonic()
        path = await asyncio.to_thread(self._lock_store)
        identity = {"topic_prefix": self.settings.topic_prefix,
                    "partitions": self.settings.partitions}
        self._store_ = await asyncio.to_thread(partial(
            ReadStore, codec=self.codec, partition_of=self.partition_of), path, identity)
        retention_ms = self._retention_ms = await asyncio.to_thread(self._delete_retention_ms)
        saved = self.store.saved_at_ms
        if self.store.checkpoint(THREADS, 0) is not None and \
                time.time() * 1000 - saved > retention_ms:
            log.warning("read store %s was last written %.0f s ago, longer than tombstones "
                        "are kept (%d ms): starting it afresh", path,
                        time.time() - saved / 1000, retention_ms)
            await asyncio.to_thread(self.store.wipe)
        # Small fetches: the restore's working set, not the data, sets the peak memory.
        self._consumer_ = new_consumer(self.settings, fetch_max_bytes=RESTORE_FETCH_BYTES)
        await self._consumer.start()
        self._batching = FetchBatching(self._consumer, self.settings.gateway.fetch_batch_ms)
        if self.held is not None:  # partitions come with the group's assignments
            self.mode = "split"
            for partition in range(self.settings.partitions):
                # Held before this process (or a crash let go of it unmarked): at the
                # latest when the store was last written.
                if self.store.checkpoint(THREADS, partition) is not None and \
                        self.store.released_at(partition) is None:
                    self.store.release(partition, self.store.saved_at_ms)
            self._mark_loaded()
            log.info("read model split start from %s: %d active runs stored", path,
                     len(self.store.active))
            self._task = asyncio.create_task(run_forever("read model consumer", self._step))
            return
        tps = self._tps()
        self._consumer.assign(tps)
        begins = await self.offsets.beginning(tps)
        ends = await self.offsets.end(tps)
        starts = self._starts(tps, begins, ends)
        if starts is None:
            log.warning("read store %s does not fit the topics (recreated or trimmed): "
                        "starting it afresh", path)
            await asyncio.to_thread(self.store.wipe)
            starts = {tp: begins[tp] for tp in tps}
        warm = any(self.store.checkpoint(self._topics[tp.topic], tp.partition) is not None
                   for tp in tps)
        self.mode = "warm" if warm else "cold"
        for tp in tps:
            self._consumer.seek(tp, starts[tp])
            self._checkpointed[tp] = starts[tp]
        self._initial_end = ends
        if all(starts[tp] >= ends[tp] for tp in tps):  # nothing new since the checkpoints
            self._mark_loaded()
        behind = sum(max(0, ends[tp] - starts[tp]) for tp in tps)
        log.info("read model %s start from %s: at most %d records to read, %d active runs",
                 self.mode, path, behind, len(self.store.active))
        self._task = asyncio.create_task(run_forever("read model consumer", self._step))

    def _starts(self, tps: list[TopicPartition], begins: dict[TopicPartition, int],
                ends: dict[TopicPartition, int]) -> dict[TopicPartition, int] | None:
        starts = {}
        for tp in tps:
            checkpoint = self.store.checkpoint(self._topics[tp.topic], tp.partition)
            if checkpoint is None:
                starts[tp] = begins[tp]
            elif checkpoint > ends[tp] or checkpoint < begins[tp]:
                return None
            else:
                starts[tp] = checkpoint
        return starts

    def _lock_store(self) -> Path:
        """Take the first store folder of this name no other gateway holds."""
        root = self.settings.data_dir / "gateway"
        root.mkdir(parents=True, exist_ok=True)
        for n in range(1000):
            name = self.store_name if n == 0 else f"{self.store_name}.{n}"
            handle = open(root / f"{name}.lock", "wb")  # noqa: SIM115 - held while running
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.close()
                continue
            handle.write(str(os.getpid()).encode())
            handle.flush()
            self._lock_file = handle
            return root / name
        raise RuntimeError(f"no free read store folder under {root}")

    def _delete_retention_ms(self) -> int:
        """How long the topics keep tombstones: a store older than that missed some."""
        try:
            admin = AdminClient(librdkafka_config(self.settings, log_level=0))
            resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in self._topics]
            found = []
            for future in admin.describe_configs(resources, request_timeout=10).values():
                entry = future.result(10).get("delete.retention.ms")
                if entry is not None and entry.value is not None:
                    found.append(int(entry.value))
            return min(found) if found else DEFAULT_DELETE_RETENTION_MS
        except Exception as exc:
            log.warning("delete.retention.ms unknown (%s); assuming Kafka's default", exc)
            return DEFAULT_DELETE_RETENTION_MS

    async def stop(self) -> None:
        """Stop reading, close the store and release its lock file."""
        await stop_task(self._task)
        if self._consumer_ is not None:
            await stop_client(self._consumer_)
        if self._store_ is not None:
            self._store_.close()
            self._store_ = None
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    @property
    def loaded(self) -> bool:
        """Whether the store has caught up with the topics' ends once since start."""
        return self._loaded.is_set()

    async def wait_loaded(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for the first load; False if it did not finish."""
        try:
            await within(self._loaded.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def note_write(self, thread_id: str) -> None:
        """Mark a thread as just written, so its next reads catch up with Kafka first."""
        remember(self._recent, thread_id, time.monotonic() + RECENT_WRITE_S, float)

    def note_created(self, thread_id: str) -> None:
        """Mark a thread as decided created: until the model reads its state, reads of
        it wait (a transaction's commit marker reaches the threads partition after the
        events partition, so the decision can be seen before the state is readable)."""
        remember(self._created, thread_id, time.monotonic() + RECENT_WRITE_S, float)

    def note_accepted(self, run_id: str, thread_id: str) -> None:
        """Mark a run as decided accepted: until the model reads its user message, a
        read of the run waits (the same race as `note_created`'s: a client that joins
        a run the moment it was created must not get a 404)."""
        until = time.monotonic() + RECENT_WRITE_S
        remember(self._accepted, run_id, (thread_id, until), lambda mark: mark[1])
        remember(self._accepted_on, thread_id, (run_id, until), lambda mark: mark[1])

    def _message_read(self, run_id: str) -> bool:
        """Whether a run seen accepted has its user message read (or was settled since).
        A 202 told the client the message is stored, but the commit marker can reach the
        messages partition after the events one: a listing must not come without it.
        Earlier runs' messages come before it in the partition."""
        return self.store.run(run_id) is not None or run_id not in self._accepted

    def note_ended(self, thread_id: str, run_id: str) -> None:
        """Mark a run as ended (its terminal record was read): until the model has read
        the records that store its end, reads of the thread wait. One transaction wrote
        them all, but its commit marker can reach the threads and messages partitions
        after the stream's and the events', so a client that saw `done` could otherwise
        read the history without the answer (seen under a CPU hog)."""
        remember(self._ended, thread_id, (run_id, time.monotonic() + RECENT_WRITE_S),
                  lambda mark: mark[1])

    def _end_read(self, thread_id: str, run_id: str) -> bool:
        """Whether a run seen ending has the records that store its end read."""
        ref = self.store.run(run_id)
        state = self.store.state(thread_id)
        record = None if ref is None else self.store.message(thread_id, ref.seq)
        return (ref is None  # rolled back, or the thread deleted: nothing more to read
                or (record is not None and record.run_status is not None
                    and record.run_status.is_terminal and state is not None
                    and (state.active_run is None or state.active_run.run_id != run_id)))

    def _unread(self, thread_id: str) -> float | None:
        """Until when a read of the thread waits for the records of a run it saw decided
        (its end, its acceptance: `note_ended`, `note_accepted`), or None."""
        return _wait_for(self._ended, thread_id, partial(self._end_read, thread_id)) or \
            _wait_for(self._accepted_on, thread_id, self._message_read)

    def note_settled(self, run_id: str) -> None:
        """Stop waiting for a run's records: it was cancelled (a rollback deletes them)."""
        self._accepted.pop(run_id, None)

    def note_deleted(self, thread_id: str) -> None:
        """Forget that a thread was created a moment ago, and its runs accepted: it is
        deleted now."""
        self._created.pop(thread_id, None)
        self._accepted = {k: v for k, v in self._accepted.items() if v[0] != thread_id}
        self._accepted_on.pop(thread_id, None)

    def _recently_written(self, thread_id: str) -> bool:
        deadline = self._recent.get(thread_id)
        return deadline is not None and deadline > time.monotonic()

    def _any_recent_write(self) -> bool:
        now = time.monotonic()
        return any(deadline > now for deadline in self._recent.values())

    async def catch_up(self, partitions: list[int] | None = None) -> bool:
        """Wait until the model has read each partition of both topics up to its end now.

        False if it could not: Kafka unreachable, or no progress for the catch-up
        timeout (or six timeouts in all). A slow but moving consumer (a loaded
        machine, a big backlog) is waited for: giving up on it would answer a thread
        created a moment ago as unknown."""
        parts = range(self.settings.partitions) if partitions is None else partitions
        # Split: only what is held here (a thread held elsewhere is read there, fresh).
        tps = [TopicPartition(topic, p) for topic in self._topics for p in parts if self.here(p)]
        if not tps:
            return True
        started = time.monotonic()
        try:
            ends = await within(self.offsets.end(tps), self.catch_up_timeout_s)
        except Exception as exc:  # Kafka unreachable: answer from what we have
            log.warning("read model catch-up: end offsets unavailable: %s", exc)
            return False
        stalled_at = time.monotonic() + self.catch_up_timeout_s
        give_up = started + 6 * self.catch_up_timeout_s
        for tp in tps:
            if not self.here(tp.partition):
                continue  # let go of meanwhile
            position = await self._consumer.position(tp)
            while position < ends[tp] and self.here(tp.partition):
                now = time.monotonic()
                if now > stalled_at or now > give_up:
                    log.warning("read model catch-up: %s at %d of %d after %.1f s", tp,
                                position, ends[tp], now - started)
                    return False
                await asyncio.sleep(_POLL_S)
                if not self.here(tp.partition):
                    break
                moved = await self._consumer.position(tp)
                if moved > position:
                    position, stalled_at = moved, time.monotonic() + self.catch_up_timeout_s
        return True

    # --- reads ---------------------------------------------------------------------

    def _hints(self, thread_id: str, run_id: str | None = None) -> Hints:
        now = time.monotonic()
        ended = self._ended.get(thread_id)
        return (self._created.get(thread_id, 0.0) > now,
                run_id if run_id is not None and self._accepted.get(run_id, ("", 0.0))[1] > now
                else None,
                ended[0] if ended is not None and ended[1] > now else None)

    def heed(self, thread_id: str, hints: Hints) -> None:
        """What the gateway that asked knows of the thread (it read the decisions):
        wait for it here as if this gateway had read them."""
        created, accepted, ended = hints
        self.note_write(thread_id)
        if created:
            self.note_created(thread_id)
        if accepted is not None:
            self.note_accepted(accepted, thread_id)
        if ended is not None:
            self.note_ended(thread_id, ended)

    def _elsewhere(self, partition: int) -> ElsewhereReads:
        """The remote reads, for a request that must stay here (else HeldElsewhere:
        it is forwarded whole)."""
        if ROUTE.get() == FORWARD or self.elsewhere is None:
            raise HeldElsewhere(partition)
        return self.elsewhere

    def here_or_elsewhere(self, thread_id: str) -> None:
        """Go on here if the thread is held here (or the request must stay here);
        else HeldElsewhere: the request is sent on whole to its owner."""
        partition = self.partition_of(thread_id)
        if not self.here(partition) and ROUTE.get() == FORWARD:
            raise HeldElsewhere(partition)

    def _local(self, thread_id: str) -> None:
        """A synchronous read may only be of a thread held here."""
        partition = self.partition_of(thread_id)
        if not self.here(partition):
            raise HeldElsewhere(partition)

    async def thread(self, tenant: str, thread_id: str, *, fresh: bool = False,
                     peek: bool = False, command: bool = False) -> ThreadState | None:
        """The tenant's thread, or None (unknown, deleted, or another tenant's). With
        `peek`, a thread held elsewhere is asked of its owner even by a request that
        would be sent on whole (to learn where to send it). With `command`, for a
        request that only checks the thread is the caller's before it publishes a
        command: the processor decides that command on the thread's current state
        (it refuses an unknown or deleted thread, and another tenant's), so a thread
        this gateway holds is taken as it is, without catching up to the writes of
        the last moments (an end-offset query and a wait for the consumer on every
        post of a thread in use); one not held yet (created a moment ago) is waited
        for as any read waits."""
        partition = self.partition_of(thread_id)
        if not self.here(partition):
            reads = self.elsewhere if peek and self.elsewhere is not None \
                else self._elsewhere(partition)
            try:
                return await reads.thread(tenant, thread_id, self._hints(thread_id))
            except NowHeldHere:
                pass  # it came here while its owner was asked: read here, as any read
        state = self.store.state(thread_id)
        if command and state is not None and state.tenant == tenant:
            return state
        if fresh or state is None or not self.loaded or partition in self._loading \
                or self._recently_written(thread_id) or thread_id in self._ended \
                or thread_id in self._accepted_on:
            partitions = [partition]
            caught_up = await self.catch_up(partitions)
            while (until := self._unread(thread_id)) is not None:
                if until <= time.monotonic():
                    raise _behind()
                await asyncio.sleep(_POLL_S)
                await self.catch_up(partitions)
            state = self.store.state(thread_id)
            deadline = time.monotonic() + self.catch_up_timeout_s
            while state is None and self._created.get(thread_id, 0.0) > time.monotonic():
                if time.monotonic() > deadline:
                    raise _behind()
                await asyncio.sleep(_POLL_S)
                caught_up = await self.catch_up(partitions)
                state = self.store.state(thread_id)
            if state is None and not caught_up:
                raise _behind()
        return state if state is not None and state.tenant == tenant else None

    def _run_ref(self, run_id: str) -> RunRef | None:
        ref = self.store.run(run_id)
        # A split store keeps the rows of partitions it let go of: not to be served.
        return ref if ref is not None and self.here(self.partition_of(ref.thread_id)) else None

    async def run(self, tenant: str, run_id: str, *, scatter: bool = True) -> RunView | None:
        """The tenant's run (by the id of the run its user message started), or None.
        Split, a run not held here is asked of the other gateways (not with `scatter`
        off: this is one of them, asked)."""
        while True:
            try:
                return await self._run(tenant, run_id, scatter)
            except NowHeldHere:
                continue  # a partition came here while the others were asked: here first

    async def _run(self, tenant: str, run_id: str, scatter: bool) -> RunView | None:
        ref = self._run_ref(run_id)
        accepted = self._accepted.get(run_id)
        if ref is None and self.held is not None and scatter and \
                (accepted is None or not self.here(self.partition_of(accepted[0]))):
            if accepted is not None:  # this gateway read its acceptance: its thread's owner
                partition = self.partition_of(accepted[0])
                return await self._elsewhere(partition).run(
                    tenant, run_id, accepted[0], self._hints(accepted[0], run_id))
            await self.catch_up()
            ref = self._run_ref(run_id)
            if ref is None and self.elsewhere is not None:
                # Which gateway holds it is not known: every other one is asked.
                found = await self.elsewhere.run(tenant, run_id, None, (False, None, None))
                if found is None or ROUTE.get() != FORWARD:
                    return found
                raise HeldElsewhere(self.partition_of(found.state.thread_id))
        if ref is None:
            caught_up = await self.catch_up()
            ref = self._run_ref(run_id)
            if ref is None and not caught_up:
                raise _behind()
            deadline = time.monotonic() + self.catch_up_timeout_s
            while ref is None and self._accepted.get(run_id, ("", 0.0))[1] > time.monotonic():
                if time.monotonic() > deadline:
                    raise _behind()
                await asyncio.sleep(_POLL_S)
                await self.catch_up()
                ref = self._run_ref(run_id)
        if ref is None:
            return None
        state = await self.thread(tenant, ref.thread_id)
        if state is None:
            return None
        record = self.store.message(ref.thread_id, ref.seq)
        return RunView(state, run_id, ref.seq, record, run_status(state, run_id, record))

    async def current_page(self, state: ThreadState, *, after: int | None = None,
                           before: int | None = None, limit: int = 100) -> MessagePage:
        """`current_messages`, of a thread held here or elsewhere."""
        partition = self.partition_of(state.thread_id)
        if not self.here(partition):
            try:
                return await self._elsewhere(partition).current_messages(
                    state.tenant, state.thread_id, after, before, limit)
            except NowHeldHere:  # it came here meanwhile: read here, once it is loaded
                if not await self.catch_up([partition]):
                    raise _behind() from None
        return self.current_messages(state, after=after, before=before, limit=limit)

    def messages(self, thread_id: str, *, after: int | None = None, before: int | None = None,
                 limit: int = 100) -> MessagePage:
        """One page of a thread's messages, by sequence number."""
        self._local(thread_id)
        return self.store.messages(thread_id, after=after, before=before, limit=limit)

    def branch_messages(self, state: ThreadState, seq: int, *, after: int | None = None,
                        before: int | None = None, limit: int = 100) -> MessagePage:
        """One page of the branch ending at message `seq` (`gateway.model.branches`), as
        `messages` pages: the path is walked through the parent index (no decode), and
        only the page's records are decoded."""
        self._local(state.thread_id)
        store = self.store
        path = path_oldest_first(seq, partial(store.link, state.thread_id))
        chosen, more = page_of(path, after=after, before=before, limit=limit)
        return MessagePage(store.messages_at(state.thread_id, chosen), more, len(chosen))

    def current_messages(self, state: ThreadState, *, after: int | None = None,
                         before: int | None = None, limit: int = 100) -> MessagePage:
        """One page of the thread's current branch: every message of a thread that never
        branched (one range scan), else the path from the current head."""
        self._local(state.thread_id)
        if is_straight(state):
            return self.store.messages(state.thread_id, after=after, before=before, limit=limit)
        return self.branch_messages(state, head_of(state), after=after, before=before,
                                    limit=limit)

    def branches(self, state: ThreadState) -> list[Branch]:
        """The thread's branches, the current one first, with where each forks."""
        self._local(state.thread_id)
        return branches(state, partial(self.store.link, state.thread_id))

    def display_title(self, state: ThreadState) -> str:
        """The thread's display title (`gateway.model.titles`): its title, or if that is
        not readable, its first message's start (one store read, only then)."""
        if not needs_message(state.title):
            return display_title(state.title)
        self._local(state.thread_id)
        page = self.store.messages(state.thread_id, limit=1)
        return display_title(state.title, page.records[0].message.text if page.records else None)

    def has_message(self, thread_id: str, message_id: str) -> bool:
        """Whether the thread holds a message with this id."""
        self._local(thread_id)
        return self.store.message_seq(thread_id, message_id) is not None

    async def threads(self, tenant: str, *, after: tuple[int, str] | None = None,
                      limit: int = 50) -> ThreadPage:
        """The tenant's threads, most recently updated first (of every gateway's share,
        split)."""
        if not self.loaded or self._loading or self._any_recent_write():
            await self.catch_up()
        while True:
            here = self.threads_here(tenant, after=after, limit=limit)
            if self.held is None:
                return here
            if self.elsewhere is None:
                raise _behind()
            with contextlib.suppress(NowHeldHere):  # a partition came here: page again
                return await self.elsewhere.threads(tenant, after, limit, here)
            await self.catch_up()

    def threads_here(self, tenant: str, *, after: tuple[int, str] | None = None,
                     limit: int = 50) -> ThreadPage:
        """`threads`, of the partitions held here only."""
        only = None if self.held is None else self._held_thread
        return self.store.threads(tenant, after=after, limit=limit, only=only)

    def _held_thread(self, thread_id: str) -> bool:
        return self.here(self.partition_of(thread_id))

    def _active(self, owned: bool = True) -> list[tuple[str, tuple[str, str, int]]]:
        """The active runs of the partitions this gateway owns (or holds: `owned` off);
        split, each partition's runs are counted by its owner alone."""
        return self.store.active.in_partitions(self._share(owned))

    def _share(self, owned: bool = True) -> set[int] | None:
        """The partitions whose active runs count here: None (all) unless split."""
        if self.held is None:
            return None
        return self.owned if owned else self.held

    def active_runs(self) -> list[ActiveRunStart]:
        """Every active run (of the partitions held here) with the time its user
        message was accepted."""
        return [(t, run, at) for t, (_, run, at) in self._active(owned=False)]

    def active_runs_of(self, tenant: str) -> list[ActiveRunStart]:
        """The tenant's active runs (thread_id, run_id, accepted at), as far as the
        model has read: `await catch_up()` first to include a run decided just now."""
        return [(t, run, at) for t, (owner, run, at) in self._active() if owner == tenant]

    def active_run_count(self, tenant: str) -> int:
        """How many runs of this tenant are accepted and not yet ended: owned here, and
        split, as the other gateways last said of theirs."""
        here = self.store.active.count(tenant, self._share())
        return here + (self.runs_elsewhere(tenant) if self.held is not None else 0)

    def active_run_counts(self) -> dict[str, int]:
        """Active runs of the partitions owned here, by tenant (what a gateway's claim
        tells the others)."""
        return self.store.active.counts(self._share())

    def stats(self) -> dict[str, Any]:
        """Load state, records read, active runs and RocksDB memory for /healthz."""
        store = self._store_
        return {"loaded": self.loaded, "ready": self.ready, "ready_s": self.ready_s,
                "mode": self.mode,
                "held": None if self.held is None else sorted(self.held),
                "standby": sorted(self.standby),
                "loading": self.loading, "restore_s": self.restore_s,
                "store": None if store is None else str(store.path),
                "read_until_loaded": dict(self.read_until_loaded),
                "read_since_start": dict(self.read_records),
                "active_runs": 0 if store is None else len(store.active),
                "message_rows_read": 0 if store is None else store.rows_read,
                "rocksdb": {} if store is None else store.memory()}

    # --- restore -------------------------------------------------------------------

    async def _apply_held(self) -> None:
        """Take the partitions `hold` named and let go of the others (see `hold`)."""
        assert self.held is not None and self._wanted is not None
        wanted, held, store = set(self._wanted), set(self.held), self.store
        consumer = self._consumer
        new, gone = wanted - held, held - wanted
        new_tps = [TopicPartition(topic, p) for topic in self._topics for p in sorted(new)]
        begins = await self.offsets.beginning(new_tps) if new_tps else {}
        ends = await self.offsets.end(new_tps) if new_tps else {}
        kept = {tp: await consumer.position(tp) for tp in self._checkpointed
                if tp.partition in wanted}
        now = int(time.time() * 1000)
        starts: dict[TopicPartition, int] = {}
        for partition in sorted(new):
            tps = [tp for tp in new_tps if tp.partition == partition]
            released = store.released_at(partition)
            fits = self._starts(tps, begins, ends)
            if fits is None or (released is not None and now - released > self._retention_ms):
                erased = await asyncio.to_thread(store.erase_partition, partition, partial(
                    _in_partition, partition, self.settings.partitions))
                log.info("read model: partition %d read again from the start (%d threads "
                         "erased: %s)", partition, erased, "checkpoints do not fit the topics"
                         if fits is None else "let go of longer than tombstones are kept")
                fits = {tp: begins[tp] for tp in tps}
            starts.update(fits)
            store.retake(partition)
        for partition in gone:
            store.release(partition, now)
            self._loading.pop(partition, None)
        consumer.assign([*kept, *new_tps])
        for tp, position in kept.items():
            consumer.seek(tp, position)
        for tp, start in starts.items():
            consumer.seek(tp, start)
        self._checkpointed = {tp: o for tp, o in self._checkpointed.items()
                              if tp.partition in wanted}
        self._checkpointed.update(starts)
        for partition in new:
            behind = {tp: ends[tp] for tp in new_tps
                      if tp.partition == partition and starts[tp] < ends[tp]}
            if behind:
                self._loading[partition] = behind
        self.held = wanted
        log.info("read model holds partitions %s (took %s, let go of %s; %s loading)",
                 sorted(wanted), sorted(new), sorted(gone), self.loading)
        self._see_first_share()
        self._progress.set()

    async def _step(self) -> None:
        if self.held is not None:
            if self._wanted != self.held:
                self._held_changed.clear()
                await self._apply_held()
            if not self.held:
                self._held_changed.clear()
                with contextlib.suppress(TimeoutError):
                    await within(self._held_changed.wait(), 1.0)
                return
        # A split model looks for a new share between short fetches.
        batch = await self._consumer.getmany(timeout_ms=500 if self.held is None else 100,
                                             max_records=1000)
        if self._batching is not None:
            self._batching.took(batch)
        # Positions first: no await below suspends (known positions return at once),
        # so nothing reads a position before the rows it covers are committed.
        positions = {tp: await self._consumer.position(tp) for tp in self._checkpointed}
        store = self.store
        deleted: list[str] = []
        for tp, records in batch.items():
            kind = self._topics[tp.topic]
            self.read_records[kind] += len(records)
            for record in records:
                key = record.key or b""
                if kind == THREADS:
                    gone = store.apply_state(key, record.value)
                    if gone is not None:
                        deleted.append(gone)
                else:
                    store.apply_message(key, record.value)
        moved = {(self._topics[tp.topic], tp.partition): offset
                 for tp, offset in positions.items() if offset != self._checkpointed[tp]}
        # An idle store is still current: say so now and then, or a restart after a
        # quiet day would take it for one that missed tombstones.
        touch = time.monotonic() - self._touched_at > TOUCH_S
        if moved or touch:
            self._touched_at = time.monotonic()
        store.commit(moved, touch=touch)
        self._checkpointed.update(positions)
        for thread_id in deleted:
            if self.on_deleted is not None:
                self.on_deleted(thread_id)
        for partition, ends in list(self._loading.items()):
            if all(positions.get(tp, 0) >= end for tp, end in ends.items()):
                del self._loading[partition]
                log.info("read model: partition %d loaded", partition)
        self._see_first_share()
        self._progress.set()
        if not self._loaded.is_set():
            if any(positions[tp] < end for tp, end in self._initial_end.items()):
                return
            self._mark_loaded()

    def _mark_loaded(self) -> None:
        store = self.store
        self.restore_s = time.monotonic() - self._started_at
        if self.held is None:
            self.ready_s = self.restore_s
        self.read_until_loaded = dict(self.read_records)
        self._loaded.set()
        # The restore's decoded batches are garbage now; without this the process keeps
        # their peak resident for good (streams/heap.py).
        release_free_memory()
        log.info("read model loaded (%s start) in %.2f s: read %d thread states and %d "
                 "message records; %d active runs", self.mode, self.restore_s,
                 self.read_records[THREADS], self.read_records[MESSAGES],
                 len(store.active))


def _wait_for(marks: dict[str, tuple[str, float]], thread_id: str,
              read: Callable[[str], bool]) -> float | None:
    """Until when a read of the thread waits for the run `marks` holds for it, or None:
    none, its records `read`, or waited for long enough (the mark is dropped)."""
    pending = marks.get(thread_id)
    if pending is None:
        return None
    run_id, until = pending
    done = read(run_id)
    if done or until <= time.monotonic():
        marks.pop(thread_id, None)
        return None if done else until
    return until


def _in_partition(partition: int, count: int, thread_id: str) -> bool:
    return partition_for(thread_id, count) == partition


def _behind() -> Problem:
    # Not caught up, the model cannot tell "unknown" from "not read yet": a 404 here
    # would deny a thread or run created a moment ago.
    return Problem(503, "read-model-behind", "this gateway has not yet read the "
                   "thread's latest records; retry shortly", headers={"Retry-After": "1"})
