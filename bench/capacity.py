"""Capacity: what each role costs per unit of work; docs/scaling.md is written from it.

One stack (processor, worker and gateway, each a process) on the run's broker. Runs are
posted over HTTP, IN_FLIGHT at a time, each on a thread of its own, with nobody
watching: the benchmark reads each run's end from the events topic itself, so no SSE
client is in these figures (the fan-out benchmark gives a client's cost). Three phases,
the worker restarted between them with its agent's settings:

  short    a short answer (SHORT_WORDS words), no tool call
  tokens   a long answer (LONG_WORDS words) streamed at TOKENS_PER_S, as a model would
  steps    the short answer after STEPS tool calls (`[tools=4]`: each a journaled model
           turn and a journaled call)

A run's CPU is the short phase's; a token's, the extra CPU of the tokens phase per
extra word; a step's, the extra CPU of the steps phase per step. Each for every role
and for the broker's JVM (only when the run started the broker). Then STATE_THREADS
more threads are created; memory (RSS) and disk (the roles' data folders, the topics'
logs) per thread are read before and after, and the topics' disk per run and per
stored message from the phases.

`plan` turns these costs into instances for a load (docs/scaling.md's formula).
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from confluent_kafka import Consumer

from bench import common
from bench.common import (
    Child,
    Figure,
    broker_pid,
    folder_bytes,
    load_text,
    process_rss,
)
from bench.stack import AUTH, Stack, new_stack
from streams.core.domain import RunCompleted
from streams.testing.process import process_cpu
from streams.wire import Codec

__all__ = ["BENCH", "Costs", "Load", "Plan", "plan", "run"]

BENCH = "capacity"
RUNS = 96  # per phase
IN_FLIGHT = 16
SHORT_WORDS = 10
LONG_WORDS = 210
TOKENS_PER_S = 200
STEPS = 4
STATE_THREADS = 3_000
IDLE_S = 5.0
ROLES = ("processor", "worker", "gateway")


class Ends:
    """The runs that ended, read from the events topic by a thread of the benchmark."""

    def __init__(self, stack: Stack) -> None:
        self.codec = Codec.from_settings(stack.settings)
        self.consumer = Consumer({"bootstrap.servers": stack.settings.bootstrap,
                                  "group.id": f"capacity-{uuid.uuid4().hex[:8]}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                  "isolation.level": "read_committed", "log_level": 3})
        self.consumer.subscribe([stack.settings.topics.events])
        self.ended: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="capacity-ends", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            msg = self.consumer.poll(0.05)
            value = None if msg is None or msg.error() is not None else msg.value()
            if value is None:
                continue
            _, event = self.codec.decode_event(value)
            if isinstance(event, RunCompleted):
                self.ended.add(event.run_id)

    async def wait(self, run_id: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while run_id not in self.ended:
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run_id} did not end in {timeout_s:.0f} s")
            await asyncio.sleep(0.005)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.consumer.close()


def _processes(stack: Stack) -> dict[str, int]:
    pids = {role: stack.children[role].pid for role in ROLES}
    broker = broker_pid()
    if broker is not None:
        pids["broker"] = broker
    return pids


async def _phase(stack: Stack, ends: Ends, session: aiohttp.ClientSession, threads: list[str],
                 text: str, idle: Mapping[str, float] | None = None) -> tuple[dict[str, float], float]:
    """A run on each thread, IN_FLIGHT at a time: each process's CPU seconds beyond
    what it uses idle (`idle`: CPU seconds a second), and the wall time."""
    pids = _processes(stack)
    cpu0 = {name: process_cpu(pid) for name, pid in pids.items()}
    gate = asyncio.Semaphore(IN_FLIGHT)
    started = time.perf_counter()

    async def one(thread: str) -> None:
        async with gate:
            async with session.post(f"{stack.base}/v1/threads/{thread}/user_message",
                                    json={"input_text": text},
                                    headers={**AUTH, "Idempotency-Key": uuid.uuid4().hex}) as r:
                body = await r.json()
                if r.status != 202:
                    raise RuntimeError(f"post: {r.status} {body}")
            await ends.wait(str(body["run_id"]))

    await asyncio.gather(*(one(t) for t in threads))
    wall = time.perf_counter() - started
    idle = idle or {}
    return {name: process_cpu(pid) - cpu0[name] - idle.get(name, 0.0) * wall
            for name, pid in pids.items()}, wall


async def _idle(stack: Stack, seconds: float = IDLE_S) -> dict[str, float]:
    """CPU seconds a second each process uses with nothing to do (pollers, timers, the
    broker's housekeeping): taken off each phase, so that a unit's cost is its own."""
    pids = _processes(stack)
    cpu0 = {name: process_cpu(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - started
    return {name: (process_cpu(pid) - cpu0[name]) / wall for name, pid in pids.items()}


def _restart_worker(stack: Stack, **env: str) -> None:
    stack.children["worker"].stop()
    stack.env.update(env)
    stack.children["worker"] = Child.role("worker", stack.env, stack.folder)


def _topic_bytes(stack: Stack, topic: str = "") -> int:
    if common.BROKER_FOLDER is None:
        return 0
    return folder_bytes(common.BROKER_FOLDER, stack.settings.topic_prefix + topic, ".log")


async def _measure(stack: Stack) -> tuple[dict[str, dict[str, float]], dict[str, float], str,
                                         dict[str, float]]:
    ends = Ends(stack)
    loads = []
    try:
        async with aiohttp.ClientSession() as session:
            await stack.healthy(session)
            warm = await stack.create_threads(session, IN_FLIGHT)
            await _phase(stack, ends, session, warm, "warm up")  # JIT, caches, connections
            idle = await _idle(stack)
            cpu: dict[str, dict[str, float]] = {}
            topics_before = _topic_bytes(stack)
            messages_before = _topic_bytes(stack, "messages")
            for phase, words, text in (("short", SHORT_WORDS, "hello"),
                                       ("tokens", LONG_WORDS, "hello"),
                                       ("steps", SHORT_WORDS, f"hello [tools={STEPS}]")):
                if stack.env.get("THREADLINE_AGENT_WORDS") != str(words):
                    _restart_worker(stack, THREADLINE_AGENT_WORDS=str(words))
                    await stack.healthy(session)
                    await _phase(stack, ends, session, await stack.create_threads(session, 4),
                                 "warm up")
                threads = await stack.create_threads(session, RUNS)
                loads.append(load_text())
                cpu[phase], wall = await _phase(stack, ends, session, threads, text, idle)
                print(f"  {phase}: {RUNS} runs in {wall:.1f} s; CPU s "
                      + ", ".join(f"{k} {v:.2f}" for k, v in cpu[phase].items()), flush=True)
                if phase == "short":
                    topics_after_short = _topic_bytes(stack)
                    messages_after_short = _topic_bytes(stack, "messages")
            # State: STATE_THREADS more threads, and what they hold.
            pids = _processes(stack)
            data = stack.settings.data_dir
            rss0 = {role: process_rss(pids[role]) for role in ("processor", "gateway")}
            disk0 = {role: folder_bytes(data / role) for role in ("processor", "gateway")}
            topics0 = _topic_bytes(stack)
            await stack.create_threads(session, STATE_THREADS)
            await asyncio.sleep(2.0)  # the gateway's read model takes the last ones in
            state = {f"{role} RSS KiB/thread": (process_rss(pids[role]) - rss0[role])
                     / STATE_THREADS / 1024 for role in rss0}
            state |= {f"{role} disk KiB/thread": (folder_bytes(data / role) - disk0[role])
                      / STATE_THREADS / 1024 for role in disk0}
            if common.BROKER_FOLDER is not None:
                state["topics disk KiB/thread"] = (_topic_bytes(stack) - topics0) / STATE_THREADS / 1024
                state["topics disk KiB/run"] = (topics_after_short - topics_before) / RUNS / 1024
                # Two stored messages a run (the user's and the answer, SHORT_WORDS words).
                state["messages topic B/message"] = (messages_after_short - messages_before) / (2 * RUNS)
    finally:
        ends.close()
    return cpu, state, " / ".join(loads), idle


def run(bootstrap: str) -> list[Figure]:
    """The capacity figures: CPU per run, step and token for each role; memory and disk."""
    stack = new_stack(bootstrap, THREADLINE_AGENT_TOKENS_PER_S=str(TOKENS_PER_S),
                      THREADLINE_AGENT_WORDS=str(SHORT_WORDS), THREADLINE_AGENT_TOOL_DELAY_S="0",
                      THREADLINE_WORKER_CONCURRENCY=str(IN_FLIGHT * 2))
    stack.start(ROLES)
    try:
        cpu, state, load, idle = asyncio.run(_measure(stack))
    finally:
        stack.stop()
    names = list(cpu["short"])
    per_run = {f"{n} CPU ms": cpu["short"][n] / RUNS * 1e3 for n in names}
    per_token = {f"{n} CPU µs": (cpu["tokens"][n] - cpu["short"][n]) / RUNS
                 / (LONG_WORDS - SHORT_WORDS) * 1e6 for n in names}
    per_step = {f"{n} CPU µs": (cpu["steps"][n] - cpu["short"][n]) / RUNS / STEPS * 1e6
                for n in names}
    for values in (per_run, per_token, per_step):
        values["total"] = sum(values.values())
    missing = "" if "broker" in names else "; the broker is external: its CPU is not counted"
    return [
        Figure(BENCH, "per run", per_run, None, {}, load,
               f"a run of one short answer ({SHORT_WORDS} words, no tool), {RUNS} runs, "
               f"{IN_FLIGHT} in flight, nobody watching; each process's idle CPU taken off "
               f"(ms/s: {', '.join(f'{k} {v * 1e3:.1f}' for k, v in idle.items())}){missing}"),
        Figure(BENCH, "per token", per_token, None, {}, load,
               f"the extra CPU of a {LONG_WORDS}-word answer streamed at {TOKENS_PER_S} "
               f"tokens/s over a {SHORT_WORDS}-word one, per extra word"),
        Figure(BENCH, "per step", per_step, None, {}, load,
               f"the extra CPU of {STEPS} tool calls (each a journaled model turn and a "
               "journaled call), per call"),
        Figure(BENCH, "state", state, None, {}, load,
               f"{STATE_THREADS:,} threads created; topics' disk per run and message from "
               f"the short phase, at replication factor 1 (multiply by yours)"),
    ]


# --- the formula and docs/scaling.md ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Costs:
    """Per-unit costs of each process, from the capacity figures (CPU in ms)."""

    run_ms: Mapping[str, float]
    step_ms: Mapping[str, float]
    token_ms: Mapping[str, float]
    client_event_ms: float  # the gateway's CPU per event per watching client (fan-out)
    client_kib: float  # the gateway's memory per idle SSE connection
    thread_kib: Mapping[str, float]  # memory per thread kept: processor, gateway
    thread_disk_kib: Mapping[str, float]  # disk per thread: processor, gateway, topics


@dataclass(frozen=True, slots=True)
class Load:
    """An expected load."""

    runs_per_s: float
    steps_per_run: float
    tokens_per_run: float
    concurrent_runs: int
    viewers: int  # concurrent SSE clients, each watching one streaming run
    threads: int  # threads kept
    replication_factor: int = 3
    core_share: float = 0.6  # of one core, what each process is planned to use at most
    broker_cores: int = 4  # cores of each broker host
    gateway_standbys: int = 1  # a gateway group's standby copies of each partition
    partitions: int = 12  # THREADLINE_PARTITIONS


@dataclass(frozen=True, slots=True)
class Plan:
    """Instances of each role and brokers, with the cores and memory behind them."""

    cores: dict[str, float]
    instances: dict[str, int]
    memory_gib: dict[str, float]  # per instance
    disk_gib: dict[str, float]  # per instance; topics: the cluster's, replicas included


def plan(load: Load, costs: Costs, worker_concurrency: int = 16) -> Plan:
    """The cores each role needs for `load`, and instances at `core_share` of a core
    each (one Python process uses one core at most). Workers need a slot per concurrent
    run too. A viewer costs the gateway per event it is sent: a run's events reach its
    viewers (viewers / concurrent runs of them per run). Brokers: the measured broker CPU
    at replication factor 1, times the replication factor (followers fetch everything
    again), on `broker_cores` each at `core_share`. A processor holds its partitions'
    share; gateways, more than one being a group, their share and its standby copies
    (one gateway holds every thread)."""
    cores: dict[str, float] = {}
    for name in costs.run_ms:
        per_run = (costs.run_ms[name] + load.steps_per_run * costs.step_ms[name]
                   + load.tokens_per_run * costs.token_ms[name])
        cores[name] = load.runs_per_s * per_run / 1000
    viewers_per_run = load.viewers / max(load.concurrent_runs, 1)
    cores["gateway"] += (load.runs_per_s * load.tokens_per_run * viewers_per_run
                         * costs.client_event_ms / 1000)
    if "broker" in cores:
        cores["broker"] *= load.replication_factor
    instances = {name: max(1, math.ceil(c / load.core_share)) for name, c in cores.items()
                 if name != "broker"}
    instances["worker"] = max(instances["worker"],
                              math.ceil(load.concurrent_runs / worker_concurrency))
    if "broker" in cores:
        instances["broker"] = max(load.replication_factor,
                                  math.ceil(cores["broker"] / (load.broker_cores * load.core_share)))
    gib = 2**20  # KiB per GiB
    gateways = instances["gateway"]
    # Of the threads, what the busiest gateway holds: its partitions and their copies.
    busiest = math.ceil(load.partitions / min(gateways, load.partitions))
    share = 1.0 if gateways == 1 else \
        min(1.0, busiest * (1 + load.gateway_standbys) / load.partitions)
    memory = {
        "processor": load.threads * costs.thread_kib["processor"] / instances["processor"] / gib,
        "gateway": (load.threads * costs.thread_kib["gateway"] * share
                    + load.viewers / gateways * costs.client_kib) / gib,
    }
    disk = {
        "processor": load.threads * costs.thread_disk_kib["processor"] / instances["processor"] / gib,
        "gateway": load.threads * costs.thread_disk_kib["gateway"] * share / gib,
        "topics": load.threads * costs.thread_disk_kib["topics"] * load.replication_factor / gib,
    }
    return Plan(cores, instances, memory, disk)


# The worked example of docs/scaling.md: 1,000 runs at once, each about 20 s (4 tool
# calls and a 500-token answer), so 50 runs start a second; 50k viewers; 1M threads kept.
EXAMPLE = Load(runs_per_s=50, steps_per_run=4, tokens_per_run=500, concurrent_runs=1_000,
               viewers=50_000, threads=1_000_000)
FANOUT_CASE = "1000 clients"  # the fan-out row a viewer's cost is read from


def costs_from(capacity: Mapping[str, Mapping[str, float]], fanout: Mapping[str, float]) -> Costs:
    """Costs from the capacity table (case -> metric -> value) and the fan-out row's
    gateway CPU per event (`gateway µs/event`) and memory per connection."""
    names = [k.removesuffix(" CPU ms") for k in capacity["per run"]
             if k.endswith(" CPU ms")]
    state = capacity["state"]
    return Costs(
        run_ms={n: capacity["per run"][f"{n} CPU ms"] for n in names},
        # A difference below zero is noise (the broker's log cleaner compacting earlier
        # benchmarks' topics meanwhile, say): it plans as nothing, not as a saving.
        step_ms={n: max(0.0, capacity["per step"][f"{n} CPU µs"] / 1000) for n in names},
        token_ms={n: max(0.0, capacity["per token"][f"{n} CPU µs"] / 1000) for n in names},
        client_event_ms=fanout["gateway µs/event"] / 1000,
        client_kib=fanout["KiB/idle conn"],
        thread_kib={r: state[f"{r} RSS KiB/thread"] for r in ("processor", "gateway")},
        thread_disk_kib={"processor": state["processor disk KiB/thread"],
                         "gateway": state["gateway disk KiB/thread"],
                         "topics": state.get("topics disk KiB/thread", math.nan)},
    )


SCALING = common.DOCS / "scaling.md"
BEGIN, END = "<!-- capacity: written by make bench -->", "<!-- /capacity -->"


def render(capacity: Mapping[str, Mapping[str, float]], fanout: Mapping[str, float],
           run_line: str) -> str:
    """docs/scaling.md's measured part: the costs as quoted, and the worked example."""
    from bench.report import fmt

    costs = costs_from(capacity, fanout)
    names = list(costs.run_ms)
    lines = [BEGIN, "", f"Measured by `make bench` ({run_line}); each figure is a cell of "
             "[benchmarks.md](benchmarks.md) sections 4 and 9.", "",
             "| CPU of each process | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names),
             "| per run, ms | " + " | ".join(fmt(costs.run_ms[n]) for n in names) + " |",
             "| per step (tool call), µs | " + " | ".join(
                 fmt(capacity["per step"][f"{n} CPU µs"]) for n in names) + " |",
             "| per streamed token, µs | " + " | ".join(
                 fmt(capacity["per token"][f"{n} CPU µs"]) for n in names) + " |",
             "", "A negative figure is a difference within the noise (the broker's "
             "background work, such as its log cleaner compacting earlier benchmarks' "
             "topics, moves more than the unit costs it); the formula counts it as 0.",
             "", "| Other costs | |", "|---|---|",
             f"| gateway CPU per event sent to one SSE client | {fmt(fanout['gateway µs/event'])} µs |",
             f"| gateway memory per idle SSE connection | {fmt(fanout['KiB/idle conn'])} KiB |"]
    state = capacity["state"]
    for key, label in (("processor RSS KiB/thread", "processor memory per thread"),
                       ("gateway RSS KiB/thread", "gateway memory per thread"),
                       ("processor disk KiB/thread", "processor disk per thread"),
                       ("gateway disk KiB/thread", "gateway disk per thread"),
                       ("topics disk KiB/thread", "topics' disk per thread (replication 1)"),
                       ("topics disk KiB/run", "topics' disk per run (replication 1)"),
                       ("messages topic B/message", "`messages` topic per stored message")):
        if key in state:
            unit = key.split()[-1].split("/")[0]
            lines.append(f"| {label} | {fmt(state[key])} {unit} |")
    example = plan(EXAMPLE, costs)
    load = EXAMPLE
    lines += ["", f"**Worked example.** {load.concurrent_runs:,} runs at once, each about "
              f"20 s ({load.steps_per_run:g} tool calls and a {load.tokens_per_run:g}-token "
              f"answer), so {load.runs_per_s:g} runs start a second; {load.viewers:,} viewers "
              f"(each watching one run); {load.threads:,} threads kept; replication factor "
              f"{load.replication_factor}; each process planned at {load.core_share:.0%} of a core.", "",
              "| | cores | instances | memory each, GiB | disk each, GiB |", "|---|---|---|---|---|"]
    for name in example.cores:
        lines.append(f"| {name} | {fmt(example.cores[name])} | {example.instances[name]} | "
                     f"{fmt(example.memory_gib[name]) if name in example.memory_gib else ''} | "
                     f"{fmt(example.disk_gib[name]) if name in example.disk_gib else ''} |")
    if "topics" in example.disk_gib:
        lines += ["", f"Topics: {fmt(example.disk_gib['topics'])} GiB on the brokers in all "
                  f"({load.replication_factor} replicas), before the stream topic's deltas "
                  "expire."]
    return "\n".join([*lines, "", END])


def tables(figures: list[Figure]) -> tuple[dict[str, dict[str, float]], dict[str, float]] | None:
    """The capacity table and the fan-out row of a run's figures, as quoted (each
    value rounded as the report prints it), or None without both."""
    from bench.report import fmt

    def quoted(value: float) -> float:
        return float(fmt(value).replace(",", ""))

    capacity = {f.case: {k: quoted(v) for k, v in f.values.items()}
                for f in figures if f.bench == BENCH}
    fanout = [f for f in figures if f.bench == "fanout" and f.case == FANOUT_CASE]
    if not capacity or not fanout:
        return None
    row = {"gateway µs/event": quoted(fanout[0].cpu["gateway"]),
           "KiB/idle conn": quoted(fanout[0].values["KiB/idle conn"])}
    return capacity, row


def write_scaling(figures: list[Figure], run_line: str) -> bool:
    """Replace docs/scaling.md's measured part with this run's; False without the figures."""
    found = tables(figures)
    if found is None or not SCALING.exists():
        return False
    text = SCALING.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    SCALING.write_text(head + render(*found, run_line) + tail)
    return True
