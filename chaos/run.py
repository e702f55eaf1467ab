"""One chaos run: start the stack, load it, kill it, drain, collect, audit."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from chaos.audit import Observations, Report, Seen, audit
from chaos.kills import Chaos, Kill, KillRecord, plan
from chaos.load import Load, LoadConfig
from chaos.read import topic_reads
from chaos.recovery import KillSpan, moving_again, serving_again
from chaos.sse import AUTH, Api, GaveUp, iter_sse
from chaos.stack import Stack
from gateway.kafka import partition_for

__all__ = ["Config", "Outcome", "run"]

log = logging.getLogger("chaos")

KINDS = ("processor", "worker", "gateway", "broker")
STALL_S = 45.0  # a run open this long is worth a look at every process's stack


@dataclass(frozen=True, slots=True)
class Config:
    """One chaos run's settings: seed, size, kills, brokers, folder and guarantee."""
    seed: int
    threads: int
    duration_s: float  # how long clients post; the kills fall inside it
    kills: dict[str, int]  # kind -> how many
    brokers: int = 1
    gateways: int = 2
    balanced: bool = False  # the gateways grouped, behind HAProxy (chaos.stack)
    by_owner: bool = False  # HAProxy sends a thread's requests to its owner (chaos.stack)
    bootstrap: str | None = None  # an outside cluster: no broker restart
    folder: Path = Path("var/chaos")
    keep: bool = False
    drain_s: float = 180.0
    # The processors' THREADLINE_PROCESSING_GUARANTEE; at_least_once is the negative
    # control: the topic audit must then find duplicates.
    processing_guarantee: str = "exactly_once"
    aim: bool = True  # processor kills land inside a batch (see chaos/kills.py)
    # Processor kills are made by the processors' own fault point instead, between a
    # step's write and its commit every time (streams/kafka/faults.py, chaos/kills.py).
    fault: bool = False


@dataclass
class Outcome:
    """What one chaos run came to: its audit report, kills, recovery times and timings."""
    config: Config
    report: Report
    kills: dict[str, int] = field(default_factory=dict)
    recovery_s: dict[str, float] = field(default_factory=dict)  # kind -> max seconds
    serving_s: dict[str, float] = field(default_factory=dict)  # kind -> max (chaos/recovery.py)
    moving_s: dict[str, float] = field(default_factory=dict)  # kind -> max (chaos/recovery.py)
    self_exits: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0
    cuts: int = 0
    aimed: int = 0  # processor kills that fired inside a burst's batches
    max_run_s: float = 0.0
    wall_s: float = 0.0
    folder: Path | None = None



async def _reference(session: aiohttp.ClientSession, bases: list[str], run_id: str) -> list[Seen]:
    """The run's events from its start, read in one go (retried whole if cut)."""
    seen: list[Seen] = []
    for attempt in range(4):
        seen = []
        try:
            base = bases[attempt % len(bases)]
            async with session.get(f"{base}/v1/runs/{run_id}/events", headers=AUTH,
                                   timeout=aiohttp.ClientTimeout(total=20)) as response:
                if response.status == 200:
                    async for event in iter_sse(response):
                        seen.append(event)
                    if seen and seen[-1].event == "done":
                        return seen
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.5)
    return seen


async def _pages(api: Api, thread_id: str, deadline: float,
                 branch: int | None) -> list[dict[str, Any]] | None:
    """One branch's stored messages root first (None: the current one), page after page
    (a page holds at most 1,000); None if the gateways gave up."""
    messages: list[dict[str, Any]] = []
    cursor = ""
    while True:
        path = f"/v1/threads/{thread_id}/messages?limit=1000" + (
            f"&branch={branch}" if branch is not None else "") + (f"&after={cursor}" if cursor else "")
        try:
            status, body = await api.call("GET", path, deadline=deadline)
        except GaveUp:
            return None
        if status != 200:
            return None
        messages += body.get("messages", [])
        cursor = body.get("next_cursor") or ""
        if not cursor:
            return messages


async def _history(api: Api, thread_id: str, deadline: float) -> tuple[
        list[dict[str, Any]], dict[int, list[int]]]:
    """The thread's whole stored history, every branch's (issue #30: a read shows one
    branch), merged by seq; and each branch's seqs root first."""
    current = await _pages(api, thread_id, deadline, None) or []
    by_seq = {int(m["seq"]): m for m in current}
    paths: dict[int, list[int]] = {}
    try:
        status, body = await api.call("GET", f"/v1/threads/{thread_id}/branches", deadline=deadline)
    except GaveUp:
        status, body = 0, None
    branches = body.get("branches", []) if status == 200 and isinstance(body, dict) else []
    for branch in branches:
        seq = branch.get("branch")
        if not isinstance(seq, int):
            continue
        messages = current if branch.get("current") else \
            await _pages(api, thread_id, deadline, seq)
        if messages is None:
            continue
        paths[seq] = [int(m["seq"]) for m in messages]
        by_seq.update((int(m["seq"]), m) for m in messages)
    return [by_seq[seq] for seq in sorted(by_seq)], paths


async def _collect(stack: Stack, load: Load) -> Observations:
    reads = await asyncio.to_thread(topic_reads, stack.settings)
    stored: dict[str, list[dict[str, Any]]] = {}
    paths: dict[str, dict[int, list[int]]] = {}
    references: dict[str, list[Seen]] = {}
    async with aiohttp.ClientSession() as session:
        api = Api(session, stack.entries, random.Random(0))
        deadline = time.monotonic() + 120
        for thread_id in sorted({p.thread_id for p in load.posts}):
            stored[thread_id], paths[thread_id] = await _history(api, thread_id, deadline)
        gate = asyncio.Semaphore(8)

        async def fetch(run_id: str) -> None:
            async with gate:
                references[run_id] = await _reference(session, stack.entries, run_id)

        # An open run has no whole replay; its post is stuck already.
        await asyncio.gather(*(fetch(p.run_id) for p in load.posts
                               if p.accepted and p.ended_at is not None))
    dead = sum(r.topic == "dead-letter" for r in reads.committed)
    return Observations(posts=load.posts, events=[e for _, e in reads.events], stored=stored,
                        references=references, watchers=load.watchers, dead_letters=dead,
                        server_errors=load.server_errors + api.server_errors, stuck=load.stuck,
                        topics=reads, tool_log=_tool_log(stack), paths=paths)


def _tool_log(stack: Stack) -> list[str]:
    """The builtin `lookup`'s side-effect log and the MCP server's execution log, one
    after the other (their keys are of different runs: a run calls one or the other)."""
    if not stack.env:
        return []
    paths = [Path(stack.env.get("THREADLINE_AGENT_TOOL_LOG", "")), stack.folder / "mcp.log"]
    return [line for path in paths if path.is_file() for line in path.read_text().splitlines()]


def _dump(path: Path, obs: Observations) -> None:
    """What the clients saw, for the post-mortem of a failed run."""
    def seen(events: list[Seen]) -> list[list[str]]:
        return [[s.event, s.id, s.data[:300]] for s in events]

    path.write_text(json.dumps({
        "posts": [dataclasses.asdict(p) for p in obs.posts],
        "references": {run: seen(events) for run, events in obs.references.items()},
        "watchers": [{"name": w.name, "thread_id": w.thread_id, "run_id": w.run_id,
                      "connects": w.connects, "cuts": w.cuts, "unwatched": sorted(w.unwatched),
                      "not_streaming": sorted(w.not_streaming), "trail": w.trail,
                      "runs": {run: seen(events) for run, events in w.runs.items()}}
                     for w in obs.watchers],
    }, indent=1))


def _recovery(records: list[KillRecord], load: Load, drained_at: float) -> dict[str, float]:
    worst: dict[str, float] = {}
    for record in records:
        in_flight = [p for p in load.posts if p.accepted_at is not None
                     and p.accepted_at <= record.at and (p.ended_at or drained_at) > record.at]
        back = max([record.restored_at or drained_at]
                   + [p.ended_at or drained_at for p in in_flight])
        kind = record.kill.kind
        worst[kind] = max(worst.get(kind, 0.0), back - record.at)
    return worst


def _serving_and_moving(records: list[KillRecord], load: Load, drained_at: float,
                        partitions: int) -> tuple[dict[str, float], dict[str, float]]:
    """The worst "serving again" and "runs moving again" of each kind (chaos/recovery.py)."""
    thread_of = {p.run_id: p.thread_id for p in load.posts}

    def partition_of(run: str) -> int | None:
        thread = thread_of.get(run)
        return None if thread is None else partition_for(thread, partitions)

    serving: dict[str, float] = {}
    moving: dict[str, float] = {}
    for record in records:
        kind = record.kill.kind
        span = KillSpan(kind, record.at, None if kind == "broker" else record.owned,
                        record.restored_at, record.back_at)
        seen = load.decided_at if kind == "processor" else load.seen_at
        first = serving_again(span, seen, partition_of)
        if first is not None:
            serving[kind] = max(serving.get(kind, 0.0), first)
        moved = moving_again(span, load.seen_at, load.end_seen, drained_at)
        if moved is not None:
            moving[kind] = max(moving.get(kind, 0.0), moved)
    return serving, moving


async def _monitor(load: Load, stack: Stack, until: asyncio.Event) -> None:
    """Log progress; when a run is stalled, save every process's stacks (with
    py-spy, if installed) next to the logs, for the post-mortem."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    dumped = 0.0
    while not until.is_set():
        await asyncio.sleep(5)
        now = time.monotonic()
        open_runs = [p for p in load.posts if p.accepted and p.run_id not in load.end_seen]
        stalled = [p for p in open_runs if now - (p.accepted_at or now) > STALL_S]
        log.info("progress: %d accepted, %d in flight, %d stalled over %.0fs",
                 sum(p.accepted for p in load.posts), len(open_runs), len(stalled), STALL_S)
        if stalled and spy and now - dumped > 60:
            dumped = now
            out = stack.folder / "logs" / f"stacks-{int(now)}.txt"
            for proc in stack.all_procs():
                if proc.proc is not None and proc.exited() is None:
                    dump = await asyncio.to_thread(
                        subprocess.run, [spy, "dump", "--pid", str(proc.proc.pid)],
                        capture_output=True, text=True, check=False)
                    with out.open("a") as f:
                        f.write(f"=== {proc.name}\n{dump.stdout}{dump.stderr}\n")
            log.warning("stalled runs %s; stacks in %s", [p.run_id for p in stalled][:5], out)


async def _chaos(config: Config, stack: Stack) -> Outcome:
    rng = random.Random(config.seed)
    load = Load(LoadConfig(threads=config.threads, seed=config.seed), stack.entries)
    chaos = Chaos(stack, random.Random(config.seed + 1), aim=config.aim)
    counts = {k: n for k, n in config.kills.items() if n}
    if stack.owns_broker is False:
        counts.pop("broker", None)
    kills: list[Kill] = plan(rng, counts, 4.0, config.duration_s - 4.0)
    log.info("kill plan: %s", [(k.at_s, k.kind, k.index) for k in kills])
    supervising = asyncio.Event()
    supervisor = asyncio.create_task(chaos.supervise(supervising))
    monitor = asyncio.create_task(_monitor(load, stack, supervising))
    await chaos.until_healthy(stack.bases)
    started = time.monotonic()
    posting_until = started + config.duration_s
    executing = asyncio.create_task(chaos.execute(kills, started))
    await load.run(posting_until, posting_until + config.drain_s)
    await executing
    drained_at = time.monotonic()
    observations = await _collect(stack, load)
    supervising.set()
    await asyncio.gather(supervisor, monitor)
    report = audit(observations)
    if not report.ok:
        _dump(stack.folder / "observations.json", observations)
    outcome = Outcome(config, report, kills=dict(_count(k.kind for k in kills)),
                      recovery_s=_recovery(chaos.records, load, drained_at),
                      self_exits=dict(chaos.self_exits))
    outcome.serving_s, outcome.moving_s = _serving_and_moving(
        chaos.records, load, drained_at, stack.settings.partitions)
    outcome.reconnects = sum(max(0, w.connects - 1) for w in load.watchers)
    outcome.cuts = sum(w.cuts for w in load.watchers)
    outcome.aimed = chaos.aimed
    outcome.max_run_s = max([(p.ended_at or drained_at) - (p.accepted_at or drained_at)
                             for p in load.posts if p.accepted] or [0.0])
    return outcome


def _count(items: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def run(config: Config) -> Outcome:
    """Start the stack, load it, kill, audit and stop; its folder is deleted if it passed (unless keep)."""
    folder = config.folder / f"seed{config.seed}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True, exist_ok=True)
    stack = Stack(folder.resolve(), brokers=config.brokers, bootstrap=config.bootstrap,
                  processing_guarantee=config.processing_guarantee, fault=config.fault,
                  balanced=config.balanced, by_owner=config.by_owner)
    started = time.monotonic()
    try:
        stack.start(gateways=config.gateways)
        outcome = asyncio.run(_chaos(config, stack))
    finally:
        stack.stop()
    outcome.wall_s = time.monotonic() - started
    outcome.folder = folder
    if outcome.report.ok and not config.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return outcome
