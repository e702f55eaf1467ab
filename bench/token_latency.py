"""Token latency: from the worker's produce to the SSE client's receipt, against a
direct confluent-kafka consumer of the same topic, in the same run.

One gateway process (`threadline gateway`); `bench.streamgen` produces what a
worker produces (one run per thread, then deltas at a fixed rate, each carrying
`time.time_ns()` taken just before the send); an SSE client process (one client
per thread) and a direct-consumer process (read_committed, like the gateway's
feed) timestamp every delta they receive. Both read the very same records. The
machine's clock is shared, so the two latencies are comparable to the microsecond.
No Redis baseline: redis-server is not installed here.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import aiohttp

from bench.common import Child, Figure, load_text, percentile
from bench.stack import Stack, new_stack
from bench.streamgen import Generator, seed_threads

BENCH = "token"
THREADS = 20
RATE = 400  # deltas per second, over all threads
SECONDS = 15


def wait_files(files: list[Path], children: list[Child], timeout: float) -> None:
    """Wait until every file exists, failing if a child exits or the timeout passes."""
    deadline = time.monotonic() + timeout
    while not all(f.exists() for f in files):
        for child in children:
            if not child.alive():
                raise RuntimeError(f"{child.name} exited early:\n{child.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready after {timeout}s: {[str(f) for f in files]}")
        time.sleep(0.1)


def start_readers(stack: Stack, threads: list[str], clients_per_process: list[int],
                  seconds: float, direct: bool) -> tuple[list[Child], list[Path], list[Path]]:
    """Start the SSE reader processes (and, if direct, a direct Kafka consumer); their ready and out files."""
    folder = stack.folder
    folder.mkdir(parents=True, exist_ok=True)
    threads_file = folder / "threads.json"
    threads_file.write_text(json.dumps(threads))
    children, readies, outs = [], [], []
    for i, clients in enumerate(clients_per_process):
        ready, out = folder / f"sse{i}.ready", folder / f"sse{i}.json"
        children.append(Child(f"sse{i}", [
            "-m", "bench.streamgen", "sse", "--base", stack.base, "--threads-file",
            str(threads_file), "--clients", str(clients), "--seconds", str(seconds),
            "--ready", str(ready), "--out", str(out)], stack.env, folder / f"sse{i}.log"))
        readies.append(ready)
        outs.append(out)
    if direct:
        ready, out = folder / "direct.ready", folder / "direct.json"
        children.append(Child("direct", [
            "-m", "bench.streamgen", "direct", "--seconds", str(seconds + 30), "--ready",
            str(ready), "--out", str(out)], stack.env, folder / "direct.log"))
        readies.append(ready)
        outs.append(out)
    return children, readies, outs


def collect(children: list[Child], outs: list[Path], timeout: float) -> list[dict[str, object]]:
    """Wait for each reader child and read back its JSON result."""
    results = []
    for child, out in zip(children, outs, strict=True):
        child.wait(timeout)
        if not out.exists():
            raise RuntimeError(f"{child.name} wrote no result:\n{child.tail()}")
        results.append(json.loads(out.read_text()))
    return results


def latency_values(latencies: list[float]) -> dict[str, float]:
    """The sample count and the p50, p95 and p99 of the latencies, in ms."""
    return {"samples": len(latencies), "p50 ms": percentile(latencies, 50),
            "p95 ms": percentile(latencies, 95), "p99 ms": percentile(latencies, 99)}


async def _generate(stack: Stack, threads: list[str], rate: float, seconds: float,
                    children: list[Child]) -> tuple[int, str]:
    async with Generator(stack.settings, threads) as generator:
        await generator.start_runs()
        await asyncio.sleep(1.0)
        load = load_text()
        for child in [*stack.children.values(), *children]:
            child.mark()
        sent = await generator.deltas(rate, seconds)
    return sent, load


async def _healthy(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        await stack.healthy(session)


def run(bootstrap: str, threads: int = THREADS, rate: float = RATE,
        seconds: float = SECONDS, extra: dict[str, str] | None = None) -> list[Figure]:
    """Token latency through the gateway against a direct Kafka consumer, in the same run
    (`extra`: settings of the stack, e.g. bench/observability_cost.py's)."""
    stack = new_stack(bootstrap)
    stack.env.update(extra or {})  # read by the role processes it starts
    thread_ids = seed_threads(stack.settings, threads)
    stack.start(["gateway"])
    children: list[Child] = []
    try:
        asyncio.run(_healthy(stack))
        children, readies, outs = start_readers(stack, thread_ids, [threads], seconds + 8, True)
        wait_files(readies, children, 120)
        sent, load = asyncio.run(_generate(stack, thread_ids, rate, seconds, children))
        gateway_cpu = stack.children["gateway"].cpu_since_mark()
        sse_cpu, direct_cpu = (c.cpu_since_mark() for c in children)
        sse, direct = collect(children, outs, seconds + 60)
    finally:
        for child in children:
            child.stop()
        stack.stop()
        shutil.rmtree(stack.folder, ignore_errors=True)
    sse_lat, direct_lat = sse["latencies"], direct["latencies"]
    assert isinstance(sse_lat, list) and isinstance(direct_lat, list)
    gateway = Figure(BENCH, "gateway SSE", latency_values(sse_lat), "direct confluent-kafka",
                     {"gateway": gateway_cpu / max(len(sse_lat), 1) * 1e6,
                      "sse client": sse_cpu / max(len(sse_lat), 1) * 1e6}, load,
                     f"{sent} deltas sent at {rate:.0f}/s over {threads} threads")
    baseline = Figure(BENCH, "direct confluent-kafka", latency_values(direct_lat), None,
                      {"consumer": direct_cpu / max(len(direct_lat), 1) * 1e6}, load)
    for metric in ("p50 ms", "p95 ms", "p99 ms"):
        gateway.values[f"adds {metric}"] = gateway.values[metric] - baseline.values[metric]
    print(f"  gateway p50 {gateway.values['p50 ms']:.2f} p99 {gateway.values['p99 ms']:.2f} | "
          f"direct p50 {baseline.values['p50 ms']:.2f} p99 {baseline.values['p99 ms']:.2f} ms "
          f"(load {load})", flush=True)
    return [gateway, baseline]


if __name__ == "__main__":
    from bench.common import broker

    with broker() as bootstrap:
        for figure in run(bootstrap):
            print(figure.case, figure.values, figure.cpu)
