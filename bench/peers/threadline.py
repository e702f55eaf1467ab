"""Threadline with its shipped defaults: an embedded Kafka 3.9 broker and the
processor, worker and gateway, each `threadline <role>` in a process of its own
(so each can be killed alone), on fresh topics. The builtin agent's tool mode is
the workload (`[tools=4]` in the message; its `lookup` tool writes the side-effect
log). A run is a POST of a user message, with the thread's SSE stream opened
first (as a client would), read until the run's `done`.

Set apart from the defaults, and why (listed in the report):
- THREADLINE_TENANT_POSTS_PER_S=0, THREADLINE_TENANT_MAX_ACTIVE_RUNS=0: one tenant
  stands for every client here, and 200 runs at once would be refused (429) by the
  per-tenant limits that docs/security.md sizes for one tenant of many;
- THREADLINE_WORKER_CONCURRENCY=256: one worker for 200 runs at once (the default
  16 a worker; docs/operations.md: add workers, or concurrency, when saturated);
- the builtin agent: THREADLINE_AGENT_TOOLS=4, THREADLINE_AGENT_TOKENS_PER_S=0 (its
  simulated model streams as fast as it can: the peers have no model either),
  THREADLINE_AGENT_TOOL_DELAY_S and THREADLINE_AGENT_TOOL_LOG (the workload).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from typing import Any

import aiohttp
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from typing_extensions import override

from bench.peers.procs import free_port
from bench.peers.system import System, retry_pause
from bench.peers.workload import calls_by_run, parse, runs_of
from streams.config import Settings
from streams.devtools.broker import KAFKA_VERSION, EmbeddedKafka
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess

AUTH = {"Authorization": "Bearer bench"}
ROLES = ("processor", "worker", "gateway")
# What a restarted role logs on its way back, in order: label, text of the line.
MILESTONES = {
    "worker": (("process up, joining the group", "(Re-)joining group"),
               ("joined the group", "Joined group"),
               ("dispatch partitions assigned", "assigned dispatch partitions")),
    "processor": (("process up", "started on"),
                  ("first partition restored", "restored in"),
                  ("every partition restored, processing", "threadline.kafka.loop")),
    # The broker's own log (its timestamps in brackets).
    "broker": (("logs loaded", "Completed loading transaction metadata"),
               ("registered with its controller", "Successfully registered broker"),
               ("serving", "Kafka Server started")),
}
_ASSIGNED = re.compile(r"threadline\.kafka\.loop.*assigned \[([0-9, ]*)\]")
GROUP_WAIT_S = 120.0
RAISED = {"THREADLINE_TENANT_POSTS_PER_S": "0", "THREADLINE_TENANT_MAX_ACTIVE_RUNS": "0",
          "THREADLINE_WORKER_CONCURRENCY": "256"}


class Threadline(System):
    """The broker and the three roles."""

    name = "Threadline"
    # The broker too: the log Threadline's durability rests on, as Restate's server is
    # Restate's (killed in place only: `make run` has one broker).
    roles: tuple[str, ...] = ("worker", "processor", "broker")
    lost_roles: tuple[str, ...] = ("worker", "processor")
    turns = True  # the builtin agent journals a model turn before each call

    @override
    async def start(self, session: aiohttp.ClientSession) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.broker = EmbeddedKafka(self.folder / "kafka", port=0)
        await asyncio.to_thread(self.broker.start)
        self.port = free_port()
        self.env = {
            "KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap,
            "THREADLINE_TOPIC_PREFIX": f"p{uuid.uuid4().hex[:8]}.",
            "THREADLINE_DATA_DIR": str(self.folder / "data"),
            "THREADLINE_HTTP_PORT": str(self.port), "THREADLINE_API_KEYS": "bench=bench",
            **RAISED, "THREADLINE_AGENT_TOOLS": "4", "THREADLINE_AGENT_TOKENS_PER_S": "0",
            "THREADLINE_AGENT_TOOL_DELAY_S": "0", "THREADLINE_AGENT_TOOL_LOG": str(self.tool_log),
            "THREADLINE_AGENT_TURNS": "1" if self.turns else "0",
        }
        await asyncio.to_thread(ensure_topics, Settings.from_env(self.env))
        self.killed: dict[str, tuple[str, list[int]]] = {}  # role -> (pid, partitions owned)
        self.children = {role: RoleProcess(role, self.env, self.folder / f"{role}.log",
                                           die_with_parent=True).start() for role in ROLES}
        self._hands_off: set[str] = set()  # killed or swapped by the harness: not restarted
        self._supervisor = asyncio.create_task(self._supervise())
        await self._healthy(session)

    async def _supervise(self) -> None:
        """Start again, at once, a role or the broker that exited by itself, as `threadline
        run`'s supervisor (or any process manager) does: without it one rare exit (the
        processor fenced after a broker restart, docs/operations.md) left every run
        waiting, and the harness with them. Each such exit is printed and counted
        (`self_exits`, in the results of the workload or kill it happened in)."""
        while True:
            await asyncio.sleep(0.05)
            for name, child in list(self.children.items()):
                if name in self._hands_off or name.endswith("-lost") or child.alive():
                    continue
                self.self_exits.append(f"{name} (status {child.exited()})")
                print(f"   {self.name}: {name} exited by itself (status {child.exited()}); "
                      "started again", flush=True)
                child.start()
            broker = self.broker.process
            if "broker" not in self._hands_off and broker is not None \
                    and broker.poll() is not None:
                self.self_exits.append(f"broker (status {broker.poll()})")
                print(f"   {self.name}: the broker exited by itself; started again", flush=True)
                self._hands_off.add("broker")
                try:
                    await asyncio.to_thread(self.broker.start, 0)
                finally:
                    self._hands_off.discard("broker")

    async def _healthy(self, session: aiohttp.ClientSession, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            for name, child in self.children.items():
                if not child.alive():
                    raise RuntimeError(f"{name} exited:\n{child.tail()}")
            try:
                async with session.get(f"{self.base}/healthz") as r:
                    if r.status == 200:
                        return
                    last = await r.text()
            except aiohttp.ClientError as exc:
                last = str(exc)
            if not await retry_pause(deadline, 0.3):
                raise RuntimeError(f"not healthy after {timeout} s: {last[:500]}")

    @property
    def base(self) -> str:
        """The gateway's URL."""
        return f"http://127.0.0.1:{self.port}"

    @override
    async def set_delay(self, session: aiohttp.ClientSession, delay_s: float) -> None:
        if self.env["THREADLINE_AGENT_TOOL_DELAY_S"] == str(delay_s):
            return
        self.env["THREADLINE_AGENT_TOOL_DELAY_S"] = str(delay_s)
        worker = self.children["worker"]
        self._hands_off.add("worker")
        try:
            await asyncio.to_thread(worker.stop)  # SIGTERM: it leaves its group at once
            self.children["worker"] = RoleProcess("worker", self.env, worker.log,
                                                  die_with_parent=True).start()
        finally:
            self._hands_off.discard("worker")
        await self._healthy(session)
        # The peers take the delay per run. Until the new worker has its partitions,
        # runs would wait for a restart that only this harness makes: it was the
        # latency workload's p99 (its first 6 runs, posted 0.1 s apart, began their
        # first call together, 0.8 s after the first post).
        await asyncio.to_thread(self.children["worker"].wait_for_log,
                                "assigned dispatch partitions", GROUP_WAIT_S)

    @override
    async def prepare(self, session: aiohttp.ClientSession, count: int) -> list[str]:
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> str:
            async with gate, session.post(f"{self.base}/v1/threads", json={"title": f"t{i}"},
                                          headers=AUTH) as r:
                body: dict[str, Any] = await r.json()
                if r.status not in (201, 202):
                    raise RuntimeError(f"create thread: {r.status} {body}")
                return str(body["thread_id"])

        return list(await asyncio.gather(*(one(i) for i in range(count))))

    @override
    async def run(self, session: aiohttp.ClientSession, slot: str, key: str, delay_s: float,
                  deadline: float, ids: dict[str, str]) -> float | None:
        # As a client would: watch the thread, then post (the stream is live, and takes
        # the run in from its `run_accepted`); the run's own events are the fallback.
        watch: aiohttp.ClientResponse | None = None
        try:
            watch = await session.get(f"{self.base}/v1/threads/{slot}/stream", headers=AUTH)
            if watch.status != 200:
                watch.release()
                watch = None
        except aiohttp.ClientError:
            watch = None
        run_id = ""
        self.posted_at[key] = time.time()
        while not run_id:
            try:
                async with session.post(
                        f"{self.base}/v1/threads/{slot}/user_message",
                        json={"input_text": f"{key} [tools=4]"},
                        headers={**AUTH, "Idempotency-Key": key}) as r:
                    body = await r.json()
                    if r.status == 202:
                        run_id = str(body["run_id"])
            except aiohttp.ClientError:
                pass
            if not run_id and not await retry_pause(deadline):
                if watch is not None:
                    watch.release()
                return None
        ids[key] = run_id
        if watch is not None:
            try:
                async for raw in watch.content:
                    if raw.startswith(b"event: done"):
                        return time.time()
            except aiohttp.ClientError:
                pass
            finally:
                watch.release()
        while True:
            try:
                async with session.get(f"{self.base}/v1/runs/{run_id}/events", headers=AUTH) as r:
                    if r.status == 200:
                        async for raw in r.content:
                            if raw.startswith(b"event: done"):
                                return time.time()
            except aiohttp.ClientError:
                pass
            if not await retry_pause(deadline, 0.05):
                return None

    @override
    def roots(self) -> dict[str, int]:
        out = {name: c.pid for name, c in self.children.items() if c.alive()}
        if self.broker.process is not None and self.broker.process.poll() is None:
            out["broker"] = self.broker.process.pid
        return out

    @override
    async def kill(self, role: str) -> None:
        self._hands_off.add(role)  # until `restart`, or for good (`lost`)
        if role == "broker":
            pid = self.broker.process.pid if self.broker.process is not None else 0
            self.killed[role] = (str(pid), [])
            await asyncio.to_thread(self.broker.kill)
            return
        child = self.children[role]
        owned: list[int] = []
        for line in child.output().splitlines():  # the last assignment of this start
            if found := _ASSIGNED.search(line):
                owned = [int(p) for p in found.group(1).split(",") if p.strip()]
        self.killed[role] = (str(child.pid), owned)
        await asyncio.to_thread(child.kill9)

    @override
    async def add_instance(self, role: str) -> None:
        env = {**self.env, "THREADLINE_DATA_DIR": str(self.folder / f"data-{role}-2")}
        self.children[f"{role}-2"] = RoleProcess(role, env, self.folder / f"{role}-2.log",
                                                 die_with_parent=True).start()
        await asyncio.to_thread(self._wait_group, role, 2)

    def _wait_group(self, role: str, members: int) -> None:
        """Until `role`'s group is stable with `members` members, each owning partitions,
        and each processor has logged its (last) assignment."""
        group = f"{self.env['THREADLINE_TOPIC_PREFIX']}{role}"
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap, "log_level": 0})
        deadline = time.monotonic() + GROUP_WAIT_S
        last = ""
        while time.monotonic() < deadline:
            try:
                found = \
                    admin.describe_consumer_groups([group])[group].result(timeout=10)
                owners = [m for m in found.members if m.assignment.topic_partitions]
                last = f"{found.state} {len(found.members)} members, {len(owners)} owning"
                stable = str(found.state).endswith("STABLE") \
                    and len(owners) == members == len(found.members)
                if stable and (role != "processor" or all(
                        _ASSIGNED.search(c.output().rsplit("revoked", 1)[-1])
                        for name, c in self.children.items() if name.startswith(role))):
                    time.sleep(1.0)  # the assignment callbacks' last steps
                    return
            except Exception as exc:  # the group is rebalancing, or the broker busy
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"{group} not stable with {members} members: {last}")

    @override
    async def lost(self, role: str) -> None:
        self.children[f"{role}-lost"] = self.children[role]
        self.children[role] = self.children.pop(f"{role}-2")
        self._hands_off.discard(role)  # the survivor, under the role's name now

    @override
    def serving_again(self, role: str, kill_ms: float) -> float | None:
        if role == "broker":  # every run was on it: the driver's first call begun
            return None
        pid, owned = self.killed[role]
        if role == "worker":  # the first call begun, after the kill, of a run the dead one ran
            runs = calls_by_run(parse(self.tool_log.read_text(errors="replace")))
            dead = set(runs_of(runs, pid, kill_ms))
            after = [b for run in dead for call in runs[run] for b in call.begins if b > kill_ms]
            return (min(after) - kill_ms) / 1000 if after else None
        return self._first_decision(owned, kill_ms) if owned else None

    def _first_decision(self, partitions: list[int], kill_ms: float) -> float | None:
        """Seconds from the kill to the first event decided (read_committed) on `partitions`."""
        topic = f"{self.env['THREADLINE_TOPIC_PREFIX']}events"
        consumer = Consumer({"bootstrap.servers": self.broker.bootstrap, "group.id": "bench-probe",
                             "enable.auto.commit": False, "isolation.level": "read_committed",
                             "log_level": 0})
        try:
            starts = consumer.offsets_for_times(
                [TopicPartition(topic, p, int(kill_ms)) for p in partitions], timeout=30)
            starts = [tp for tp in starts if tp.offset >= 0]
            if not starts:
                return None
            consumer.assign(starts)
            firsts: dict[int, float] = {}
            deadline = time.monotonic() + 10
            while len(firsts) < len(starts) and time.monotonic() < deadline:
                for msg in consumer.consume(100, timeout=0.5):
                    if msg.error() is None:
                        firsts.setdefault(msg.partition() or 0, msg.timestamp()[1])
            return (min(firsts.values()) - kill_ms) / 1000 if firsts else None
        finally:
            consumer.close()

    @override
    async def restart(self, role: str) -> None:
        try:
            if role == "broker":  # on its data, as `threadline run`'s supervisor does
                await asyncio.to_thread(self.broker.start, 0)
                return
            self.children[role].start()
        finally:
            self._hands_off.discard(role)

    @override
    async def stop(self) -> None:
        supervisor = getattr(self, "_supervisor", None)  # None: `start` failed early
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        for child in self.children.values():
            await asyncio.to_thread(child.stop)
        await asyncio.to_thread(self.broker.stop)

    @override
    def milestones(self, role: str, kill_ms: float) -> dict[str, float]:
        marks = MILESTONES.get(role, ())
        out: dict[str, float] = {}
        log = self.broker.log_file if role == "broker" else self.children[role].log
        skip = 1 if role == "broker" else 0  # "[2026-12-05 14:19:52,099] INFO ..."
        try:
            lines = log.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:
                at = time.mktime(time.strptime(line[skip:skip + 19], "%Y-%m-%d %H:%M:%S")) \
                    + int(line[skip + 20:skip + 23]) / 1000
            except ValueError:
                continue
            if at * 1000 < kill_ms - 1:  # the log's clock has milliseconds only
                continue
            for label, needle in marks:
                if needle in line:
                    out.setdefault(label, round(at - kill_ms / 1000, 2))
        return out

    @override
    def version(self) -> str:
        import subprocess

        def git(*args: str) -> str:
            return subprocess.run(["git", *args], capture_output=True, text=True,
                                  check=False).stdout.strip()

        # The code that ran: the last commit of its own folders (the bench's own commits aside).
        head = git("log", "-1", "--format=%h", "--", "streams", "gateway", "schemas")
        dirty = git("status", "--porcelain", "streams", "gateway", "schemas")
        return f"Threadline {head}{'+' if dirty else ''}, Apache Kafka {KAFKA_VERSION} (KRaft, one node)"

    @override
    def durability(self) -> str:
        return ("Kafka: replication 1 (THREADLINE_REPLICATION_FACTOR default), min.insync 1, "
                "acks=all (idempotent, transactional producers: exactly-once), no fsync per write "
                "(Kafka's default log.flush.*: the page cache, durability by replication)")

    @override
    def settings(self) -> str:
        return ("code defaults, except " + ", ".join(f"{k}={v}" for k, v in RAISED.items())
                + "; builtin agent THREADLINE_AGENT_TOOLS=4, THREADLINE_AGENT_TOKENS_PER_S=0"
                + ("" if self.turns else ", THREADLINE_AGENT_TURNS=0"))


class ThreadlineCalls(Threadline):
    """The builtin agent making its 4 calls in a row with no model turn between them
    (`THREADLINE_AGENT_TURNS=0`), as the peers' workload does: the same durable steps
    as Restate's, DBOS's and LangGraph's rows."""

    name = "Threadline, calls only"
    roles = ()
    lost_roles = ()
    turns = False
