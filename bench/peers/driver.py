"""The driver: the same workload on every system, one system at a time, the systems
alternating round by round in one run.

Each round starts each system fresh, warms it up with a few runs, then measures:
- throughput: `burst` runs posted at once, instant tools: runs/s (first post to
  last answer) and the CPU of every process of the system per run;
- latency: `paced` runs at `rate`/s, tools of `delay` s: post to answer, p50/p99;
- step overhead (from both): a call's `done` to the next call's `begin` in the log;
and in the last round, per role: `inflight` runs of `delay` s tools, the role killed
with SIGKILL once every run has begun a call and restarted at once, in place; and
per role that can be lost for good: a second instance started first, the first
one killed the same way and never restarted.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from bench.peers.procs import cpu_by_root, cpu_used, jit_cpu
from bench.peers.system import System
from bench.peers.workload import (
    STEPS,
    calls_by_run,
    moving_again,
    parse,
    percentile,
    repeated_calls,
    step_overheads_ms,
)

__all__ = ["Size", "measure_round", "recovery"]

RUN_TIMEOUT_S = 120.0  # a run not answered by then is counted lost
RECOVERY_TIMEOUT_S = 150.0


@dataclass(frozen=True)
class Size:
    """How much each measurement does."""

    warmup: int = 10
    burst: int = 200
    paced: int = 50
    rate: float = 10.0
    delay: float = 0.2
    inflight: int = 20
    rounds: int = 2


QUICK = Size(warmup=3, burst=30, paced=10, inflight=6, rounds=1)


def load_text() -> str:
    """The load averages (1, 5, 15 min)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclass
class Batch:
    """What one batch of runs showed."""

    runs: int
    answered: int
    seconds: float
    latencies_s: list[float]
    overheads_ms: list[float]
    repeated: int
    restarted: int
    cpu_s: dict[str, float]
    load: str
    ids: dict[str, str] = field(default_factory=dict)
    answered_at: dict[str, float] = field(default_factory=dict)
    to_first_call_ms: list[float] = field(default_factory=list)  # post -> first `begin`
    last_call_to_answer_ms: list[float] = field(default_factory=list)  # last `done` -> answer
    jit_s: float = 0.0  # of cpu_s: the JIT compiler threads (a JVM warming up)


def _log_lines(system: System) -> str:
    try:
        return system.tool_log.read_text(errors="replace")
    except FileNotFoundError:
        return ""


async def batch(system: System, session: aiohttp.ClientSession, count: int, delay_s: float,
                rate: float | None, tag: str) -> Batch:
    """`count` runs, all at once (`rate` None) or `rate` a second; wait for every answer."""
    slots = await system.prepare(session, count)
    keys = [f"{tag}-{uuid.uuid4().hex[:8]}-{i}" for i in range(count)]
    ids: dict[str, str] = {}
    posted: dict[str, float] = {}
    answered: dict[str, float] = {}
    deadline = time.monotonic() + RUN_TIMEOUT_S + (count / rate if rate else 0)
    load = load_text()
    cpu0, jit0 = cpu_by_root(system.roots()), jit_cpu(system.roots().values())
    t0 = time.time()

    async def one(i: int) -> None:
        if rate:
            await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
        posted[keys[i]] = time.time()
        done = await system.run(session, slots[i], keys[i], delay_s, deadline, ids)
        posted[keys[i]] = system.posted_at.get(keys[i], posted[keys[i]])
        if done is not None:
            answered[keys[i]] = done

    await asyncio.gather(*(one(i) for i in range(count)))
    t1 = max(answered.values(), default=time.time())
    cpu = cpu_used(cpu0, cpu_by_root(system.roots()))
    jit = jit_cpu(system.roots().values()) - jit0
    runs = calls_by_run(parse(_log_lines(system)), ids.values())
    repeated, late, restarted = repeated_calls(runs)
    first, last = [], []
    for key, run in ids.items():
        calls = runs.get(run)
        if calls and key in posted:
            first.append(calls[0].first_begin - posted[key] * 1000)
        done = calls[-1].first_done if calls else None
        if done is not None and key in answered:
            last.append(answered[key] * 1000 - done)
    return Batch(count, len(answered), t1 - t0,
                 [answered[k] - posted[k] for k in answered], step_overheads_ms(runs),
                 repeated + late, restarted, cpu, load, ids, answered, first, last, jit)


async def measure_round(system: System, session: aiohttp.ClientSession, size: Size) \
        -> dict[str, Any]:
    """Warm-up, throughput and latency on a started system."""
    exits = len(system.self_exits)
    await system.set_delay(session, 0.0)
    await batch(system, session, size.warmup, 0.0, None, "warm")
    burst = await batch(system, session, size.burst, 0.0, None, "burst")
    await system.set_delay(session, size.delay)
    paced = await batch(system, session, size.paced, size.delay, size.rate, "paced")
    overheads = burst.overheads_ms + paced.overheads_ms
    return {
        "runs/s": burst.answered / burst.seconds if burst.seconds > 0 else float("nan"),
        "CPU ms/run": sum(burst.cpu_s.values()) / max(burst.answered, 1) * 1000,
        "CPU ms/run by process": {name: round(s / max(burst.answered, 1) * 1000, 2)
                                  for name, s in burst.cpu_s.items()},
        "JIT compiler CPU ms/run": round(burst.jit_s / max(burst.answered, 1) * 1000, 2),
        "throughput answered": f"{burst.answered}/{burst.runs}", "throughput load": burst.load,
        "latency p50 s": percentile(paced.latencies_s, 50),
        "latency p99 s": percentile(paced.latencies_s, 99),
        "latency answered": f"{paced.answered}/{paced.runs}", "latency load": paced.load,
        "step p50 ms": percentile(overheads, 50), "step p99 ms": percentile(overheads, 99),
        "step p50 ms (burst)": percentile(burst.overheads_ms, 50),
        "step p99 ms (burst)": percentile(burst.overheads_ms, 99),
        "step p50 ms (paced)": percentile(paced.overheads_ms, 50),
        "step p99 ms (paced)": percentile(paced.overheads_ms, 99),
        "steps measured": len(overheads),
        "post to first call p50 ms (paced)": percentile(paced.to_first_call_ms, 50),
        "last call to answer p50 ms (paced)": percentile(paced.last_call_to_answer_ms, 50),
        "repeated calls": burst.repeated + paced.repeated,
        "exited by themselves": system.self_exits[exits:],
    }


async def recovery(system: System, session: aiohttp.ClientSession, role: str, size: Size,
                   lost: bool = False) -> dict[str, Any]:
    """`size.inflight` runs in flight; `role` killed with SIGKILL and restarted in place
    (`lost`: with a second instance running, and never restarted)."""
    exits = len(system.self_exits)
    await system.set_delay(session, size.delay)
    if lost:
        await system.add_instance(role)
    slots = await system.prepare(session, size.inflight)
    await asyncio.sleep(system.settle_s)
    keys = [f"kill-{role}-{uuid.uuid4().hex[:6]}-{i}" for i in range(size.inflight)]
    ids: dict[str, str] = {}
    answered: dict[str, float] = {}
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    load = load_text()

    async def one(i: int) -> None:
        done = await system.run(session, slots[i], keys[i], size.delay, deadline, ids)
        if done is not None:
            answered[keys[i]] = done

    tasks = [asyncio.create_task(one(i)) for i in range(size.inflight)]
    # Kill once every run has begun a call (or after 20 s), a little into the calls.
    wait_until = time.monotonic() + 20
    while time.monotonic() < wait_until:
        runs = calls_by_run(parse(_log_lines(system)), ids.values())
        if len(ids) == size.inflight and len(runs) == size.inflight:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(size.delay / 2)
    kill_ms = time.time() * 1000
    await system.kill(role)
    if not lost:
        await system.restart(role)
    restarted_ms = time.time() * 1000
    await asyncio.gather(*tasks)
    serving = system.serving_again(role, kill_ms)
    if lost:
        await system.lost(role)
    runs = calls_by_run(parse(_log_lines(system)), ids.values())
    in_flight = [ids[k] for k in keys if k in ids and answered.get(k, 1e18) * 1000 > kill_ms]
    answered_ms = {ids[k]: t * 1000 for k, t in answered.items() if k in ids}
    first, moving = moving_again(runs, in_flight, kill_ms, answered_ms)
    last = max(answered_ms.values(), default=float("nan"))
    repeated, late, restarted = repeated_calls(runs, kill_ms)
    done_calls = sum(1 for calls in runs.values() for c in calls if c.first_done is not None)
    if serving is None and first is not None:
        serving = first / 1000
    return {
        "role": f"{role} lost for good" if lost else role, "runs": size.inflight,
        "in flight at kill": len(in_flight),
        "restarted after s": None if lost else (restarted_ms - kill_ms) / 1000,
        "serving again s": serving,
        "runs moving again s": None if moving is None else moving / 1000,
        "every run done s": (last - kill_ms) / 1000 if len(answered) == size.inflight else None,
        "answered": f"{len(answered)}/{size.inflight}",
        "repeated completed calls": repeated, "repeated, done after the kill": late,
        "calls cut off and made again": restarted,
        "completed calls": done_calls, "expected calls": STEPS * size.inflight, "load": load,
        "milestones": system.milestones(role, kill_ms), "killed at ms": kill_ms,
        "exited by themselves": system.self_exits[exits:],
    }


def as_json(value: Any) -> Any:
    """Dataclasses as dicts, for the saved results."""
    return asdict(value) if hasattr(value, "__dataclass_fields__") else value
