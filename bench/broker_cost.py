"""Where a run's cost goes, the broker's most of all (issue #22): Threadline as
`bench.peers` runs it (the embedded broker and the three roles, shipped defaults
but the peers' raised limits), idle, then runs one at a time, then in batches of
runs posted at once.

Idle, a second: every process's CPU, each broker thread's CPU (/proc, by thread
name: its request handlers, its JIT compiler...), the broker's requests by type
(its JMX counters, read through the JDK's attach API by bench/jmx/KafkaCounts.java).
One at a time: post to answer, p50 and p90. Each batch, per run: the same CPU
figures, and the broker's requests by type, records and bytes by topic.

    python -m bench.broker_cost [--runs 200] [--batches 3] [--one-at-a-time 60]
    python -m bench.broker_cost --checkout /tmp/base   # another checkout's roles
                                                        # and broker, this harness
    python -m bench.broker_cost --spy var/spy   # py-spy each Python role over the
                                                # batches; prints where its CPU went

`--checkout` runs an earlier commit (a `git worktree`) for a side-by-side: run both,
alternating. Prints; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.common import percentile
from bench.peers.procs import cpu_by_root, thread_cpu
from bench.peers.threadline import Threadline
from bench.spy_summary import summarise
from streams.testing.process import ROOT

COUNTS = Path(__file__).resolve().parent / "jmx" / "KafkaCounts.java"
IDLE_S = 10.0
WARMUP = 20
SHOWN = 12  # rows of each table


def broker_counts(pid: int) -> dict[str, float]:
    """The broker's cumulative counters: `requests <type>`, `records <topic>`, `bytes <topic>`."""
    out = subprocess.run(["java", str(COUNTS), str(pid)], capture_output=True, text=True,
                         check=True).stdout
    counts: dict[str, float] = {}
    for line in out.splitlines():
        kind, name, value = line.split()
        counts[f"{kind} {name}"] = float(value)
    return counts


def stack_cpu(roots: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each role's process tree."""
    return {name: sum(tree.values()) for name, tree in cpu_by_root(roots).items()}


def per(after: dict[str, float], before: dict[str, float], unit: float) -> dict[str, float]:
    """What each counter grew by, divided by `unit`, largest first, zeros left out."""
    grown = {k: (v - before.get(k, 0.0)) / unit for k, v in after.items()}
    return dict(sorted(((k, v) for k, v in grown.items() if v > 0.005), key=lambda kv: -kv[1]))


def show(title: str, values: dict[str, float], digits: int = 2) -> None:
    """One line of the largest `values`."""
    print(f"  {title}: " + ", ".join(f"{k} {v:.{digits}f}" for k, v in list(values.items())[:SHOWN]))


async def batch(system: Threadline, session: aiohttp.ClientSession, slots: list[str],
                tag: str) -> int:
    """Post a run to each slot at once; how many were answered."""
    ids: dict[str, str] = {}
    deadline = time.monotonic() + 300
    ends = await asyncio.gather(*(system.run(session, slot, f"{tag}-{i}", 0.0, deadline, ids)
                                  for i, slot in enumerate(slots)))
    return sum(end is not None for end in ends)


def start_spies(roots: dict[str, int], folder: Path) -> dict[str, subprocess.Popen[bytes]]:
    """py-spy recording each Python role (raw, 200 samples a second) until stopped."""
    folder.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    return {role: subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "200",
                                    "--format", "raw", "--output", str(folder / f"{role}.raw")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for role, pid in roots.items() if role != "broker"}


def stop_spies(spies: dict[str, subprocess.Popen[bytes]], folder: Path) -> None:
    """End the recordings (py-spy writes its profile on SIGINT) and print each role's."""
    for process in spies.values():
        process.send_signal(signal.SIGINT)
    for role, process in spies.items():
        process.wait(timeout=60)
        raw = folder / f"{role}.raw"
        print(f"--- {role} ({raw}) ---")
        print(summarise(str(raw), 15, 25) if raw.exists() else "no profile (py-spy failed?)")


async def measure(runs: int, batches: int, one_at_a_time: int, spy: Path | None = None) -> None:
    """Idle, `one_at_a_time` runs one after another, then `batches` batches of `runs`
    runs at once; print each. With `spy`, py-spy profiles of the roles over the batches."""
    system = Threadline(Path(tempfile.mkdtemp(prefix="broker-cost-")))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await system.start(session)
        try:
            slots = await system.prepare(session, WARMUP + runs * batches + one_at_a_time)
            await batch(system, session, slots[:WARMUP], "warm")
            roots = system.roots()
            broker = roots["broker"]
            head = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"],
                                  capture_output=True, text=True, check=False).stdout.strip()
            print(f"Threadline at {head} ({ROOT}), load "
                  + " ".join(f"{x:.2f}" for x in os.getloadavg()))
            counts, threads, cpu = broker_counts(broker), thread_cpu(broker), stack_cpu(roots)
            await asyncio.sleep(IDLE_S)
            print(f"idle, per second over {IDLE_S:.0f} s:")
            show("CPU ms", per({k: v * 1000 for k, v in stack_cpu(roots).items()},
                               {k: v * 1000 for k, v in cpu.items()}, IDLE_S), 0)
            show("broker threads CPU ms", per({k: v * 1000 for k, v in thread_cpu(broker).items()},
                                              {k: v * 1000 for k, v in threads.items()}, IDLE_S), 0)
            show("broker requests", per({k: v for k, v in broker_counts(broker).items()
                                         if k.startswith("requests")}, counts, IDLE_S), 1)
            latencies = []
            for i, slot in enumerate(slots[WARMUP + runs * batches:]):
                end = await system.run(session, slot, f"one-{i}", 0.0, time.monotonic() + 60, {})
                if end is not None:
                    latencies.append((end - system.posted_at[f"one-{i}"]) * 1000)
            print(f"one at a time, post to answer: p50 {percentile(latencies, 50):.1f} ms, "
                  f"p90 {percentile(latencies, 90):.1f} ms ({len(latencies)}/{one_at_a_time})")
            spies = start_spies(roots, spy) if spy is not None else {}
            for n in range(batches):
                counts, threads, cpu = broker_counts(broker), thread_cpu(broker), stack_cpu(roots)
                started = time.monotonic()
                done = await batch(system, session,
                                   slots[WARMUP + n * runs:WARMUP + (n + 1) * runs], f"b{n}")
                took = time.monotonic() - started
                after, used = broker_counts(broker), stack_cpu(roots)
                unit = max(done, 1)
                print(f"batch {n + 1}: {done}/{runs} answered in {took:.2f} s, "
                      f"{done / took:.1f} runs/s; per run:")
                cpu_ms = {k: (used[k] - cpu[k]) * 1000 / unit for k in used}
                show("CPU ms", {**cpu_ms, "total": sum(cpu_ms.values())})
                show("broker threads CPU ms", per({k: v * 1000 for k, v in thread_cpu(broker).items()},
                                                  {k: v * 1000 for k, v in threads.items()}, unit))
                for kind in ("requests", "records", "bytes"):
                    show(f"broker {kind}", {k.split(" ", 1)[1]: v for k, v in per(
                        {k: v for k, v in after.items() if k.startswith(kind)}, counts, unit).items()})
            if spy is not None:
                stop_spies(spies, spy)
        finally:
            await system.stop()


def main() -> None:
    """Parse the arguments; with `--checkout`, run again with that checkout first on the path."""
    parser = argparse.ArgumentParser(prog="python -m bench.broker_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="runs posted at once in a batch")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--one-at-a-time", type=int, default=60,
                        help="runs posted one after another, for their latency")
    parser.add_argument("--checkout", type=Path, default=None,
                        help="run this checkout's roles and broker (e.g. a git worktree)")
    parser.add_argument("--spy", type=Path, default=None,
                        help="py-spy each Python role over the batches into this folder")
    args = parser.parse_args()
    if args.checkout is not None and os.environ.get("BROKER_COST_CHECKOUT") != str(args.checkout):
        # This harness, the checkout's code: a folder of links to this bench/ and the
        # checkout's packages (the roles start in the folder their code resolves to).
        overlay = Path(tempfile.mkdtemp(prefix="broker-cost-checkout-"))
        (overlay / "bench").symlink_to(Path(__file__).resolve().parent)
        for package in ("streams", "gateway", "schemas"):
            (overlay / package).symlink_to(args.checkout.resolve() / package)
        env = {**os.environ, "PYTHONPATH": str(overlay),
               "BROKER_COST_CHECKOUT": str(args.checkout)}
        os.chdir(overlay)
        os.execve(sys.executable, [sys.executable, "-m", "bench.broker_cost", *sys.argv[1:]], env)
    asyncio.run(measure(args.runs, args.batches, args.one_at_a_time,
                        None if args.spy is None else args.spy.resolve()))


if __name__ == "__main__":
    main()
