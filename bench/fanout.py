"""Fan-out: one gateway process with 1k, 5k and 10k SSE clients spread over threads.

For each client count a fresh stack (topics, port) and gateway process (`threadline gateway`, fd limit
raised) serves clients from two client processes (aiohttp, raw chunks, one regex
per chunk), spread round-robin over 100 threads. Memory per idle connection is the
gateway's RSS growth from before the clients connect to after, divided by the
clients. Then `bench.streamgen` writes one run per thread and deltas at 600/s in
all for 10 s (each delta reaches clients/100 clients: 6k, 30k and 60k events/s
offered, so that 10k clients can show the 50k/s target met or missed), each
carrying its produce time; delivered events/s and latency are counted by the
clients, and the gateway reports (in /healthz) how long after its CreateTime each
record's events were written to every client: the gateway's share of the latency.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from bench.common import Child, Figure, load_text, percentile
from bench.stack import Stack, new_stack
from bench.streamgen import Generator, seed_threads
from bench.token_latency import collect, start_readers, wait_files

BENCH = "fanout"
THREADS = 100
RATE = 600  # deltas per second over all threads
SECONDS = 10
CLIENT_PROCESSES = 2
NOFILE = 20_000


async def _generate(stack: Stack, threads: list[str], rate: float, seconds: float,
                    readers: list[Child]) -> tuple[int, float]:
    async with Generator(stack.settings, threads) as generator:
        await generator.start_runs()
        await asyncio.sleep(1.0)
        stack.mark()
        for reader in readers:
            reader.mark()
        t0 = time.perf_counter()
        sent = await generator.deltas(rate, seconds)
        return sent, time.perf_counter() - t0


async def _healthy(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        await stack.healthy(session)


async def _write_lag(stack: Stack) -> dict[str, float]:
    """The gateway's own view (/healthz feed stats): from each record's CreateTime
    until its events were written to every caught-up client, p50 and p99."""
    async with aiohttp.ClientSession() as session, \
            session.get(f"{stack.base}/healthz") as response:
        lag = (await response.json())["feed"]["write_lag_ms"]
    return {"gateway write p50 ms": lag["p50"], "gateway write p99 ms": lag["p99"]}


def one(stack: Stack, threads: list[str], clients: int, rate: float, seconds: float) -> Figure:
    """One client count: events delivered, latency, memory per connection and CPU of one gateway."""
    stack.start(["gateway"], nofile=NOFILE)
    gateway = stack.children["gateway"]
    readers: list[Child] = []
    try:
        asyncio.run(_healthy(stack))
        time.sleep(1.0)
        rss0 = gateway.rss()
        share = [clients // CLIENT_PROCESSES] * CLIENT_PROCESSES
        share[0] += clients - sum(share)
        readers, readies, outs = start_readers(stack, threads, share, seconds + 8, False)
        wait_files(readies, readers, 300)
        time.sleep(1.0)
        rss1 = gateway.rss()
        load = load_text()
        sent, elapsed = asyncio.run(_generate(stack, threads, rate, seconds, readers))
        time.sleep(1.0)
        cpu = gateway.cpu_since_mark()
        write_lag = asyncio.run(_write_lag(stack))
        clients_cpu = sum(reader.cpu_since_mark() for reader in readers)
        results = collect(readers, outs, seconds + 120)
    finally:
        for reader in readers:
            reader.stop()
        gateway.stop()
        del stack.children["gateway"]
    latencies: list[float] = []
    received = connected = failed = 0
    connect_s = 0.0
    for result in results:
        latencies += result["latencies"]  # type: ignore[arg-type]
        received += int(result["events"])  # type: ignore[call-overload]
        connected += int(result["connected"])  # type: ignore[call-overload]
        failed += int(result["failed"])  # type: ignore[call-overload]
        connect_s = max(connect_s, float(result["connect_s"]))  # type: ignore[arg-type]
    offered = sent * clients / len(threads)
    values = {"clients": connected, "events/s": received / elapsed,
              "offered events/s": offered / elapsed, "delivered %": received / offered * 100,
              "p50 ms": percentile(latencies, 50), "p99 ms": percentile(latencies, 99),
              "KiB/idle conn": (rss1 - rss0) / max(connected, 1) / 1024,
              "connect s": connect_s, **write_lag}
    note = f"gateway RSS {rss0 / 2**20:.0f} MiB before the clients, {rss1 / 2**20:.0f} MiB with them"
    if failed:
        note += f"; {failed} clients failed to connect"
    figure = Figure(BENCH, f"{clients} clients", values, None,
                    {"gateway": cpu / max(received, 1) * 1e6,
                     "clients (2)": clients_cpu / max(received, 1) * 1e6}, load, note)
    print(f"  {clients:6d} clients: {values['events/s']:8.0f} events/s "
          f"({values['delivered %']:.0f}% of offered), p50 {values['p50 ms']:.1f} p99 "
          f"{values['p99 ms']:.1f} ms, {values['KiB/idle conn']:.1f} KiB/conn (load {load})",
          flush=True)
    return figure


def run(bootstrap: str, counts: tuple[int, ...] = (1000, 5000, 10_000), rate: float = RATE,
        seconds: float = SECONDS) -> list[Figure]:
    """The fan-out figures for each client count, each on a fresh stack."""
    figures = []
    for clients in counts:  # a fresh stack (topics, port, gateway) for each count
        stack = new_stack(bootstrap)
        threads = seed_threads(stack.settings, THREADS)
        try:
            figures.append(one(stack, threads, clients, rate, seconds))
        finally:
            stack.stop()
    return figures


if __name__ == "__main__":
    import sys

    from bench.common import broker

    counts = tuple(int(a) for a in sys.argv[1:]) or (1000, 5000, 10_000)
    with broker() as bootstrap:
        for figure in run(bootstrap, counts):
            print(figure.case, figure.values, figure.cpu)
