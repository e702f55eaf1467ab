"""The kills: a seeded schedule, its execution, restarts, and recovery times.

`plan` spreads the kills over the run at random moments (one per slot, so two are
never on top of each other); `Chaos.execute` carries them out with SIGKILL and
restarts each killed process after a short random pause, as a supervisor would.
A process that exits by itself is restarted too and counted (`self_exits`).

Recovery of a kill: the time until the killed role serves again (a restarted
gateway answers /healthz 200; the processor or worker group is stable with two
members, neither of them the dead one; a restarted broker is ready and every
gateway healthy), or until every run that was in flight at the kill has ended,
whichever is later.

**Aimed processor kills.** What exactly-once adds over at-least-once shows only
when a processor dies *inside* a batch: after some of the batch's records reached
the broker and before its input offsets are committed (at least once: the batch is
replayed and its records written twice; exactly once: the transaction is aborted
and a `read_committed` reader never sees the first copy). An idle processor spends
a few milliseconds per batch there, so a kill at a random moment of the chaos load
almost never lands in that window (the answers are right either way: the replayed
commands mostly decide nothing new on the advanced state). With `aim`, a processor
kill first sends a burst of posts to threads that do not exist (each decides one
`RunRejected` and no state) on the partitions the target owns, from another
producer as any client could, and fires the moment the first of their decisions is
visible on the events topic (`read_uncommitted`, so before its transaction
commits): the target is then in the middle of batches of that burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from chaos.stack import Proc, Stack
from gateway.kafka import partition_for
from streams.config import Settings
from streams.core.domain import PostUserMessage
from streams.kafka.faults import FAULT_EXIT_STATUS, arm
from streams.processor import instance_id_for
from streams.wire import Codec, new_meta

CODEC = Codec()  # single-object records, as the roles write them without a registry

__all__ = ["Chaos", "Kill", "plan"]

log = logging.getLogger("chaos")

AIM_BURST = 1500  # posts; at 500 commands a batch, three batches of work
# Kill anyway when the target owns no partition of a stable group by then (a loaded
# machine restarts processors slowly), or has decided nothing of its burst by then.
AIM_OWNER_TIMEOUT_S = 120.0
AIM_DECISION_TIMEOUT_S = 60.0
FAULT_BURST = 48  # posts, one to each of as many new threads: the fault point needs one


@dataclass(frozen=True, slots=True)
class Kill:
    """One planned kill: when, which kind of process, and which instance."""
    at_s: float  # after the load starts
    kind: str  # processor | worker | gateway | broker
    index: int


@dataclass(slots=True)
class KillRecord:
    kill: Kill
    at: float  # monotonic
    restored_at: float | None = None
    owned: frozenset[int] | None = None  # the killed instance's partitions; None: all or unknown
    back_at: float | None = None  # a restarted broker ready again


def plan(rng: random.Random, counts: dict[str, int], start_s: float, end_s: float,
         instances: int = 2) -> list[Kill]:
    """A seeded schedule of the kills, one at a random moment in each slot of the run."""
    kinds = [kind for kind, n in counts.items() for _ in range(n)]
    rng.shuffle(kinds)
    slot = (end_s - start_s) / max(1, len(kinds))
    return [Kill(round(start_s + (i + rng.uniform(0.1, 0.9)) * slot, 2), kind,
                 rng.randrange(instances) if kind != "broker" else 0)
            for i, kind in enumerate(kinds)]


@dataclass
class Chaos:
    """Carries out the kills on the stack, restarts what it killed, and records recovery."""
    stack: Stack
    rng: random.Random
    aim: bool = False  # processor kills land inside a batch (see the module docstring)
    records: list[KillRecord] = field(default_factory=list)
    aimed: int = 0  # processor kills fired on a decision of their burst
    owned: dict[str, set[int]] = field(default_factory=dict)  # processor client id -> partitions
    # role -> client id -> its partitions, as last described (processor and worker)
    assigned: dict[str, dict[str, set[int]]] = field(default_factory=dict)
    self_exits: Counter[str] = field(default_factory=Counter)
    groups: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)  # role -> state, members
    _down: set[str] = field(default_factory=set)  # killed on purpose, restart pending
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _admin: AdminClient | None = None
    _aim_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def execute(self, kills: list[Kill], started: float) -> None:
        """Fire each kill at its time, and wait for every restart to finish."""
        for kill in kills:
            await asyncio.sleep(max(0.0, started + kill.at_s - time.monotonic()))
            record = KillRecord(kill, time.monotonic())
            self.records.append(record)
            if kill.kind == "broker":
                self._tasks.append(asyncio.create_task(self._broker(record)))
            elif kill.kind == "processor" and self.stack.fault_trigger is not None:
                self._tasks.append(asyncio.create_task(self._faulted(record)))
            elif kill.kind == "processor" and self.aim:  # the burst must not delay other kills
                self._tasks.append(asyncio.create_task(self._aimed(record)))
            else:
                self._kill(record)
        while not all(task.done() for task in self._tasks):  # aimed kills add restarts
            await asyncio.gather(*self._tasks)

    def _kill(self, record: KillRecord) -> asyncio.Task[None]:
        proc = self.stack.procs(record.kill.kind)[record.kill.index]
        dead = self._member_of(proc)
        record.owned = self._owned_by(proc)
        self._down.add(proc.name)
        proc.kill9()
        log.info("killed %s (kill %d of the run)", proc.name, self.records.index(record) + 1)
        restart = asyncio.create_task(self._restart(proc, record, dead))
        self._tasks.append(restart)
        return restart

    async def _aimed(self, record: KillRecord) -> None:
        """One aimed kill at a time, each after the previous one's recovery: two
        waiting for the same processor would otherwise fire on the same burst."""
        async with self._aim_lock:
            proc = self.stack.procs(record.kill.kind)[record.kill.index]
            if await asyncio.to_thread(self._burst, proc):
                self.aimed += 1
            record.at = time.monotonic()
            await self._kill(record)

    async def _broker(self, record: KillRecord) -> None:
        if self.stack.cluster is not None:  # three nodes: one dies for good
            node = self.rng.randrange(3)
            await asyncio.to_thread(self.stack.kill_cluster_node, node)
            log.info("killed broker node %d of the cluster", node + 1)
        else:
            log.info("restarting the broker")
            await asyncio.to_thread(self.stack.restart_broker)
            record.back_at = time.monotonic()
            log.info("the broker is back")
        await self._until_serving(self.stack.bases)
        await self._until_group_back("processor", None)
        await self._until_group_back("worker", None)
        record.restored_at = time.monotonic()

    async def _restart(self, proc: Proc, record: KillRecord, dead: str | None) -> None:
        await asyncio.sleep(self.rng.uniform(0.2, 2.0))
        proc.start()
        self._down.discard(proc.name)
        if proc.role == "gateway":
            await self._until_serving([self.stack.bases[self.stack.gateways.index(proc)]])
        else:
            await self._until_group_back(proc.role, dead)
        record.restored_at = time.monotonic()

    async def supervise(self, until: asyncio.Event) -> None:
        """Restart any process that exited by itself (not one we killed), and keep
        `groups` up to date."""
        polled = 0.0
        while not until.is_set():
            for proc in self.stack.all_procs():
                status = proc.exited()
                if status is not None and proc.name not in self._down:
                    log.warning("%s exited by itself with %s; restarting it", proc.name, status)
                    self.self_exits[proc.name] += 1
                    proc.start()
            if time.monotonic() - polled > 0.5:
                for role in ("processor", "worker"):
                    found = await asyncio.to_thread(self._describe, role)
                    if found is not None:
                        self.groups[role] = found
                polled = time.monotonic()
            await asyncio.sleep(0.2)

    def _burst(self, proc: Proc) -> bool:
        """Once `proc` owns partitions in a stable group, post AIM_BURST messages to
        threads that do not exist on those partitions, and return when the first
        decision about them is on the events topic (True); False if either does
        not happen in time."""
        settings = self.stack.settings
        client, deadline = self._client_of(proc), time.monotonic() + AIM_OWNER_TIMEOUT_S
        while not (self.groups.get("processor", ("", {}))[0] == "stable"
                   and self.owned.get(client)):
            if time.monotonic() > deadline:
                log.warning("aim: %s owns no partition of a stable group", proc.name)
                return False
            time.sleep(0.1)
        owned = sorted(self.owned[client])
        prefix = f"aim-{uuid.uuid4().hex[:12]}-"  # not from `rng`, which the restarts' pauses use
        threads = [t for t in (f"{prefix}{i}" for i in range(48 * settings.partitions))
                   if partition_for(t, settings.partitions) in owned][:48]
        watcher = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": prefix,
                            "isolation.level": "read_uncommitted", "enable.auto.commit": False,
                            "fetch.wait.max.ms": 5, "log_level": 0})
        try:
            watcher.assign([TopicPartition(settings.topics.events, p, OFFSET_END) for p in owned])
            watcher.consume(1, timeout=1.0)  # the assignment takes effect at the end
            self._post(prefix, threads, AIM_BURST)
            deadline = time.monotonic() + AIM_DECISION_TIMEOUT_S
            while time.monotonic() < deadline:
                for msg in watcher.consume(100, timeout=0.05):
                    if msg.error() is None and (msg.key() or b"").startswith(prefix.encode()):
                        return True
            log.warning("aim: no decision of the burst to %s seen in time", proc.name)
            return False
        finally:
            watcher.close()

    def _post(self, prefix: str, threads: list[str], count: int) -> None:
        """Post `count` messages, round robin, to `threads` (none of which exists), as
        any client could: each is decided into one `RunRejected` and no state."""
        settings = self.stack.settings
        producer = Producer({"bootstrap.servers": settings.bootstrap, "log_level": 0,
                             "partitioner": "murmur2_random", "enable.idempotence": True,
                             "linger.ms": 5})
        now = int(time.time() * 1000)
        for i in range(count):
            thread_id = threads[i % len(threads)]
            command = PostUserMessage(thread_id, "chaos", f"{prefix}m{i}", "aim", None, now + i)
            producer.produce(settings.topics.commands,
                             CODEC.encode_command(command, new_meta(thread_id, "chaos", now + i)),
                             thread_id.encode())
        while producer.flush(5):  # through a broker restart, too
            pass

    async def _faulted(self, record: KillRecord) -> None:
        """A processor kill made by the processors' own fault point (`--fault-point
        before-commit`, streams.kafka.faults): arm it, post FAULT_BURST messages to
        threads that do not exist, and the processor whose step writes the first of
        their decisions exits between that write and its commit. Deterministic, not
        timed: every such kill lands inside a batch. The fired one is restarted as a
        killed one would be."""
        trigger = self.stack.fault_trigger
        assert trigger is not None, "the stack was started without the fault point"
        async with self._aim_lock:
            procs = self.stack.procs("processor")
            await self._until_group_back("processor", None)
            self._down.update(p.name for p in procs)  # the supervisor leaves them to us now
            prefix = f"fault-{uuid.uuid4().hex[:12]}-"
            arm(trigger, prefix)
            threads = [f"{prefix}{i}" for i in range(FAULT_BURST)]
            await asyncio.to_thread(self._post, prefix, threads, FAULT_BURST)
            fired = await self._until_fired(trigger, procs)
            for proc in procs:
                if proc is not fired:
                    self._down.discard(proc.name)
            record.at = time.monotonic()
            record.owned = self._owned_by(fired)
            self.aimed += 1
            log.info("%s exited at its fault point (kill %d of the run)", fired.name,
                     self.records.index(record) + 1)
            await self._restart(fired, record, self._member_of(fired))

    async def _until_fired(self, trigger: Path, procs: list[Proc]) -> Proc:
        """The processor that took the armed `trigger`, once it has exited. No clock:
        the burst's commands stay on the topic until a processor decides them, and
        the first to write a decision of theirs fires. A processor that exits
        otherwise meanwhile is restarted (a self-exit)."""
        while True:
            for fired in trigger.parent.glob(f"{trigger.name}.fired-*"):
                pid = int(fired.name.rsplit("-", 1)[1])
                proc = next((p for p in procs if p.proc is not None and p.proc.pid == pid), None)
                if proc is not None and proc.proc is not None:
                    status = await asyncio.to_thread(proc.proc.wait)
                    fired.unlink()
                    if status != FAULT_EXIT_STATUS:
                        log.warning("%s took the fault trigger and exited with %s", proc.name, status)
                    return proc
            if trigger.exists():
                for proc in procs:
                    exited = proc.exited()
                    if exited is not None:
                        log.warning("%s exited by itself with %s; restarting it", proc.name, exited)
                        self.self_exits[proc.name] += 1
                        proc.start()
            await asyncio.sleep(0.05)

    # --- is it back? -----------------------------------------------------------------

    async def until_healthy(self, bases: list[str], timeout: float = 180) -> None:
        """Each gateway answers /healthz 200: broker, processors, workers, read model.
        Bounded by progress: TimeoutError once a gateway gave no answer not seen
        before (a component up, a member more, the read model further) for `timeout`."""
        async with aiohttp.ClientSession() as session:
            for base in bases:
                seen: set[str] = set()
                since = time.monotonic()
                while True:
                    try:  # a per-request timeout: a gateway still starting may not answer
                        async with session.get(base + "/healthz",
                                               timeout=aiohttp.ClientTimeout(total=15)) as r:
                            if r.status == 200:
                                break
                            body = await r.text()
                    except (aiohttp.ClientError, TimeoutError) as exc:
                        body = type(exc).__name__
                    if body not in seen:
                        seen.add(body)
                        since = time.monotonic()
                    if time.monotonic() - since > timeout:
                        raise TimeoutError(f"{base} not healthy, no progress in {timeout}s: {body}")
                    await asyncio.sleep(0.2)

    async def _until_serving(self, bases: list[str], timeout: float = 180) -> None:
        """`until_healthy`, for a recovery: one that never comes is the audit's to
        find (stuck runs), not a reason to stop the chaos."""
        with contextlib.suppress(TimeoutError):
            await self.until_healthy(bases, timeout)

    def _describe(self, role: str) -> tuple[str, dict[str, str]] | None:
        """The group's state and its members (member id -> client id), or None; for
        the processors also who owns which partitions (`owned`)."""
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.stack.settings.bootstrap,
                                       "log_level": 0})
        group = f"{self.stack.settings.topic_prefix}{role}"
        try:
            found = self._admin.describe_consumer_groups([group], request_timeout=3)[group]
            description = found.result(timeout=4)
        except Exception:
            self._admin = None  # a fresh client next time
            return None
        self.assigned[role] = {m.client_id: {tp.partition for tp in m.assignment.topic_partitions}
                               for m in description.members if m.assignment is not None}
        if role == "processor":
            self.owned = self.assigned[role]
        return (description.state.name.lower(),
                {m.member_id: m.client_id for m in description.members})

    def _client_of(self, proc: Proc) -> str:
        if proc.role == "worker":
            return f"worker-{proc.env['THREADLINE_INSTANCE_ID']}"
        return f"processor-{instance_id_for(Settings.from_env(proc.env))}"

    def _owned_by(self, proc: Proc) -> frozenset[int] | None:
        """The partitions `proc` owned when last described (None for a gateway, or unknown)."""
        if proc.role == "gateway":
            return None
        owned = self.assigned.get(proc.role, {}).get(self._client_of(proc))
        return None if owned is None else frozenset(owned)

    def _member_of(self, proc: Proc) -> str | None:
        if proc.role == "gateway":
            return None
        client = self._client_of(proc)
        members = self.groups.get(proc.role, ("", {}))[1]
        return next((m for m, c in members.items() if c == client), None)

    async def _until_group_back(self, role: str, dead: str | None, timeout: float = 180) -> None:
        """The role's group is stable with two members, neither of them `dead`; given up
        (the audit finds what never recovered) once the group's state and members
        showed nothing new for `timeout`."""
        await asyncio.sleep(1.0)  # let the poller see the kill
        seen: set[str] = set()
        since = time.monotonic()
        while time.monotonic() - since < timeout:
            state, members = self.groups.get(role, ("", {}))
            if state == "stable" and len(members) == 2 and dead not in members:
                return
            now = repr((state, sorted(members)))
            if now not in seen:
                seen.add(now)
                since = time.monotonic()
            await asyncio.sleep(0.25)
