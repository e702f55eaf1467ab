"""A gateway joining a group over many threads, against one gateway holding them all
(issue #26): time to ready and RSS, side by side.

    python -m bench.gateway_join [--threads 100000] [--messages 2] [--rounds 2]

Fresh topics get `--threads` thread states and `--messages` message records each,
written straight to the topics as the processor would (`bench.gateway_store`). Then,
alternating, each round on an empty data folder:

- **one gateway** (no group, as `make run` starts it) reads every partition: from its
  spawn to its read model's first load (`/healthz`, `read_model.ready`);
- **a third gateway joining two** (a group, `THREADLINE_GATEWAY_STANDBYS=0`): two
  gateways start and load their halves first; then the third is spawned and timed to
  its read model's `ready` (its first share of the partitions read).

RSS is the process's VmRSS at ready. No processor or worker runs: `/healthz` answers
503 and its read-model figures are what is read.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import bench_env, broker, load_text
from bench.gateway_store import _rss_kb, _write
from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess

POLL_S = 0.05


def _health(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30) as response:
            body: dict[str, Any] = json.load(response)
            return body
    except urllib.error.HTTPError as exc:  # 503: no processor, as intended
        body = json.load(exc)
        return body
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def _until_ready(gateway: RoleProcess, port: int) -> dict[str, Any]:
    """Poll /healthz until the gateway's read model is ready; its report."""
    while True:
        if not gateway.alive():
            raise RuntimeError(f"the gateway exited: {gateway.tail()}")
        body = _health(port)
        if body is not None and body.get("read_model", {}).get("ready"):
            return body
        time.sleep(POLL_S)


def _gateway(env: dict[str, str], folder: Path, name: str, grouped: bool) -> tuple[RoleProcess, int]:
    port = free_port()
    own = {**env, "THREADLINE_HTTP_PORT": str(port), "THREADLINE_GATEWAY_STANDBYS": "0"}
    if grouped:
        own["THREADLINE_GATEWAY_URL"] = f"http://127.0.0.1:{port}"
    return RoleProcess("gateway", own, folder / f"{name}.log"), port


def single(env: dict[str, str], folder: Path) -> dict[str, float]:
    """One gateway reading every partition: spawn to ready, RSS at ready."""
    gateway, port = _gateway(env, folder, "single", grouped=False)
    started = time.monotonic()
    gateway.start()
    try:
        body = _until_ready(gateway, port)
        took = time.monotonic() - started
        return {"ready_s": took, "rss_mb": _rss_kb(gateway.pid) / 1024,
                "threads_read": body["read_model"]["read_since_start"]["t"]}
    finally:
        gateway.stop()


def join(env: dict[str, str], folder: Path) -> dict[str, float]:
    """Two grouped gateways load their halves; a third joins: spawn to ready, RSS."""
    first = [_gateway(env, folder, f"member-{n}", grouped=True) for n in range(2)]
    try:
        for gateway, _ in first:
            gateway.start()
        for gateway, port in first:
            _until_ready(gateway, port)
        third, port = _gateway(env, folder, "joining", grouped=True)
        first.append((third, port))
        started = time.monotonic()
        third.start()
        body = _until_ready(third, port)
        took = time.monotonic() - started
        return {"ready_s": took, "rss_mb": _rss_kb(third.pid) / 1024,
                "threads_read": body["read_model"]["read_since_start"]["t"],
                "held": len(body["read_model"]["held"] or ())}
    finally:
        for gateway, _ in first:
            gateway.stop()


def main() -> None:
    """Write the threads once, then time the two cases alternately."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_join", description=__doc__)
    parser.add_argument("--threads", type=int, default=100_000)
    parser.add_argument("--messages", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"load before: {load_text()}", flush=True)
    results: dict[str, list[dict[str, float]]] = {"single": [], "join": []}
    with broker() as bootstrap:
        env = bench_env(bootstrap, 12, THREADLINE_LOG_LEVEL="INFO")
        settings = Settings.from_env(env)
        ensure_topics(settings)
        written = time.monotonic()
        _write(settings, args.threads, args.messages, "j")
        print(f"wrote {args.threads} threads and {args.threads * args.messages} messages in "
              f"{time.monotonic() - written:.1f} s", flush=True)
        for r in range(args.rounds):
            for name in (["single", "join"] if r % 2 == 0 else ["join", "single"]):
                folder = settings.data_dir.parent / f"join-{r}-{name}"
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir(parents=True)
                case_env = {**env, "THREADLINE_DATA_DIR": str(folder)}
                figures = (single if name == "single" else join)(case_env, folder)
                results[name].append(figures)
                print(f"round {r + 1}, {name}: {figures}, load {load_text()}", flush=True)
                shutil.rmtree(folder, ignore_errors=True)
    print(f"\nload after: {load_text()}")
    print("| | time to ready, s | RSS at ready, MiB | thread states read |")
    print("|---|---|---|---|")
    for name, label in (("single", "one gateway, every partition"),
                        ("join", "a third gateway joining two (standbys 0)")):
        rows = results[name]
        ready = " / ".join(f"{r['ready_s']:.2f}" for r in rows)
        rss = " / ".join(f"{r['rss_mb']:.0f}" for r in rows)
        print(f"| {label} | {ready} | {rss} "
              f"| {statistics.median(r['threads_read'] for r in rows):.0f} |")
    for key, what in (("ready_s", "time to ready"), ("rss_mb", "RSS")):
        ratio = statistics.median(r[key] for r in results["join"]) / \
            statistics.median(r[key] for r in results["single"])
        print(f"{what}, joining / single (medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
