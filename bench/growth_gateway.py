"""Growth, the gateway's side: memory and start-up with 1k against 100k threads.

For each size, fresh topics get N thread states and 3 x N message records written
straight to them (`bench.gateway_store`'s writer: what the processor would have
written), and a `threadline processor` restores them and is ready (a probe decided
on every partition). Then, side by side, the two sizes alternating:

* *cold*: `threadline gateway` on an empty data folder, timed from spawn until
  `/readyz` answers 200 (its read model restored and the processor deciding); its
  RSS then and 2 s later, its peak (VmHWM), and the restore time it reports on
  `/healthz`;
* *warm*: 100 more threads written, then the gateway started again on the same
  data folder and port: it reads only what came after its checkpoint.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import VAR, Child, Figure, bench_env, cleanup, load_text, process_rss
from bench.gateway_store import _write
from bench.growth import Commands
from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics

BENCH = "growth-gateway"
SIZES = (1_000, 100_000)
MESSAGES = 3  # per thread
MORE = 100  # threads written before the warm restart


@dataclass
class Size:
    """One data size of the gateway growth benchmark: its threads, settings, folder and processor."""
    threads: int
    env: dict[str, str]
    settings: Settings
    folder: Path
    processor: Child | None = None
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    return 0


async def _until_ready(gateway: Child, base: str, timeout: float = 600) -> dict[str, Any]:
    """Poll /readyz from spawn; then the gateway's own figures from /healthz."""
    started = time.monotonic()
    serving = None
    rss: list[tuple[float, int]] = []  # (s since spawn, bytes): how memory grows while it restores
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while True:
            if not gateway.alive():
                raise RuntimeError(f"gateway exited:\n{gateway.tail()}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"gateway not ready after {timeout} s:\n{gateway.tail()}")
            rss.append((time.monotonic() - started, process_rss(gateway.pid)))
            try:
                async with session.get(f"{base}/readyz") as response:
                    serving = serving or time.monotonic() - started
                    if response.status == 200:
                        break
            except (TimeoutError, aiohttp.ClientError):
                pass
            await asyncio.sleep(0.05)
        ready = time.monotonic() - started
        rss_ready = process_rss(gateway.pid)
        # A /readyz answered slowly leaves no sample past a quarter mark: the one at ready is.
        rss.append((ready, rss_ready))
        await asyncio.sleep(2.0)
        async with session.get(f"{base}/healthz") as response:
            health = await response.json()
    quarters = [next(b for t, b in rss if t >= ready * q) / 2**20 for q in (0.25, 0.5, 0.75)]
    return {"ready_s": ready, "serving_s": serving, "rss_mb": rss_ready / 2**20,
            "rss_2s_mb": process_rss(gateway.pid) / 2**20, "rss_quarters_mb": quarters,
            "anon_mb": _status_kb(gateway.pid, "RssAnon") / 1024,
            "file_mb": _status_kb(gateway.pid, "RssFile") / 1024,
            "peak_mb": _status_kb(gateway.pid, "VmHWM") / 1024, "read_model": health["read_model"]}


def _start(size: Size, kind: str) -> None:
    gateway = Child.role("gateway", size.env, size.folder)
    try:
        result = asyncio.run(_until_ready(gateway, f"http://127.0.0.1:{size.settings.gateway.http_port}"))
    finally:
        gateway.stop()
    result["load"] = load_text()
    size.runs[kind] = result
    model = result["read_model"]
    print(f"  {size.threads:>7,} threads {kind}: ready {result['ready_s']:.2f} s (restore "
          f"{model['restore_s']:.2f} s), RSS {result['rss_2s_mb']:.0f} MiB, peak "
          f"{result['peak_mb']:.0f} MiB  (load {result['load']})", flush=True)


def _prepare(bootstrap: str, threads: int) -> Size:
    env = bench_env(bootstrap, THREADLINE_HTTP_PORT=str(free_port()))
    settings = Settings.from_env(env)
    ensure_topics(settings)
    folder = VAR / "bench-logs" / settings.topic_prefix.rstrip(".")
    t0 = time.monotonic()
    _write(settings, threads, MESSAGES, "a")
    print(f"  wrote {threads:,} threads and {threads * MESSAGES:,} messages in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return Size(threads, env, settings, folder)


def _rocksdb(run: dict[str, Any]) -> str:
    stats = run["read_model"].get("rocksdb") or {}
    return ", ".join(f"{k.removesuffix('_bytes')} {v / 2**20:.1f} MiB" for k, v in stats.items())


def _figure(size: Size, small: Size | None) -> Figure:
    cold, warm = size.runs["cold"], size.runs["warm"]
    values = {"threads": size.threads, "messages": size.threads * MESSAGES,
              "cold: s to ready": cold["ready_s"],
              "cold: restore s": cold["read_model"]["restore_s"],
              "cold: RSS MiB": cold["rss_2s_mb"], "cold: peak MiB": cold["peak_mb"],
              "warm: s to ready": warm["ready_s"],
              "warm: restore s": warm["read_model"]["restore_s"],
              "warm: RSS MiB": warm["rss_2s_mb"]}
    if small is not None:
        for metric in ("cold: s to ready", "cold: RSS MiB", "warm: s to ready", "warm: RSS MiB"):
            before = _figure(small, None).values[metric]
            values[f"x {metric}"] = values[metric] / before
    quarters = " / ".join(f"{mb:.0f}" for mb in cold["rss_quarters_mb"])
    note = (f"records read until loaded: cold {cold['read_model']['read_until_loaded']}, warm "
            f"{warm['read_model']['read_until_loaded']}; first HTTP answer after "
            f"{cold['serving_s']:.2f} s cold, {warm['serving_s']:.2f} s warm; cold RSS at 1/4, "
            f"1/2, 3/4 of the time to ready {quarters} MiB, at ready {cold['rss_mb']:.0f}, 2 s "
            f"later {cold['rss_2s_mb']:.0f} (anonymous {cold['anon_mb']:.0f}, file "
            f"{cold['file_mb']:.0f}), RocksDB {_rocksdb(cold)}; warm RSS at ready "
            f"{warm['rss_mb']:.0f} MiB, RocksDB {_rocksdb(warm)}")
    case = f"gateway, {size.threads:,} threads"
    return Figure(BENCH, case, values, None if small is None else f"gateway, {small.threads:,} threads",
                  {}, f"{cold['load']} / {warm['load']}", note)


def run(bootstrap: str, sizes: tuple[int, ...] = SIZES) -> list[Figure]:
    """The gateway's memory and start-up figures for each thread count."""
    prepared = [_prepare(bootstrap, n) for n in sizes]
    try:
        for size in prepared:
            size.processor = Child.role("processor", size.env, size.folder)
        for size in prepared:
            kafka = Commands(size.settings)
            try:
                kafka.ready(600)
            finally:
                kafka.close()
        for size in prepared:
            _start(size, "cold")
        for size in prepared:
            _write(size.settings, MORE, MESSAGES, "b")
        for size in prepared:
            _start(size, "warm")
    finally:
        for size in prepared:
            if size.processor is not None:
                size.processor.stop()
            cleanup(size.settings)
    return [_figure(size, None if i == 0 else prepared[0]) for i, size in enumerate(prepared)]


if __name__ == "__main__":
    from bench.common import broker

    with broker() as bootstrap:
        for figure in run(bootstrap):
            print(figure.case, figure.values, figure.note)
