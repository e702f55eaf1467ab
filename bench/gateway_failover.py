"""A gateway of a group killed for good (issue #26): how long its partitions' streams
stand still before another gateway serves them.

Each round is a fresh stack on fresh topics of one broker: a processor, a worker and
three grouped gateways (`THREADLINE_GATEWAY_URL`), the session timeout at its default
(`THREADLINE_SESSION_TIMEOUT_S`, 2 s), the standby copies of the read model at their
default (`THREADLINE_GATEWAY_STANDBYS`, 1) or `--standbys`. The victim is
the gateway that owns the most partitions. Clients read, through another gateway (so
their streams are forwarded from the victim), the thread streams of `--threads`
threads on the victim's partitions, each running a slow answer (8 tokens a second).
Once every stream has had tokens, the victim is killed with SIGKILL and not started
again. Per stream: its longest pause between two events from a second before the
kill until it has an event after the rebalance (its outage: tokens come every 125
ms), and the seconds until the survivors' shares cover every partition (the group's
rebalance); the seconds until the victim's partitions serve again elsewhere (the
survivors' shares cover every partition, none of them is still loading its read
model, and a REST read of one of the victim's threads through the entry answers
200); the streams that did not resume within 60 s are counted.

    python -m bench.gateway_failover [--rounds 3] [--threads 6] [--standbys 1]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time

import aiohttp

from bench.common import Child, broker, load_text
from bench.gateway_group import _healthy
from bench.stack import AUTH, new_stack
from gateway.kafka import partition_for
from streams.devtools.broker import free_port

PARTITIONS = 6


async def _loading(session: aiohttp.ClientSession, port: int) -> bool:
    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
        return bool((await response.json()).get("read_model", {}).get("loading"))


async def _reads(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url, headers=AUTH) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def _owned(session: aiohttp.ClientSession, port: int) -> list[int]:
    async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
        share = (await response.json()).get("feed", {}).get("owned")
        return share if isinstance(share, list) else []


async def _watch(session: aiohttp.ClientSession, url: str, seen: list[float],
                 tokens: asyncio.Event) -> None:
    """A thread stream: the time each event arrived; `tokens` set after the third."""
    async with session.get(url, headers=AUTH,
                           timeout=aiohttp.ClientTimeout(total=None)) as response:
        assert response.status == 200, await response.text()
        async for line in response.content:
            if line.startswith(b"event: "):
                seen.append(time.monotonic())
                if len(seen) >= 3:
                    tokens.set()


def _longest_pause(times: list[float], killed: float) -> float:
    """The longest silence between two events of a stream, from a second before the
    kill on: its outage (the tokens come every 125 ms; events received just after
    the kill were on their way before it)."""
    around = [t for t in times if t >= killed - 1.0]
    return max((b - a for a, b in itertools.pairwise(around)), default=0.0)


async def one_round(bootstrap: str, threads: int,
                    standbys: int) -> tuple[list[float], float, float, int]:
    """The gaps of the victim's streams, the rebalance's seconds, the seconds until its
    partitions serve again, and the streams that did not resume."""
    stack = new_stack(bootstrap, partitions=PARTITIONS, THREADLINE_AGENT_SLOW_TOKENS_PER_S="8",
                      THREADLINE_AGENT_WORDS="400")
    stack.start(["processor", "worker"])
    ports = [free_port() for _ in range(3)]
    gateways = [Child(f"gateway-{n}", ["-m", "streams.cli", "gateway"],
                      {**stack.env, "THREADLINE_HTTP_PORT": str(port),
                       "THREADLINE_GATEWAY_URL": f"http://127.0.0.1:{port}",
                       "THREADLINE_GATEWAY_STANDBYS": str(standbys)},
                      stack.folder / f"gateway-{n}.log") for n, port in enumerate(ports)]
    try:
        async with aiohttp.ClientSession() as session:
            await _healthy(session, ports, PARTITIONS, grouped=True)
            shares = [await _owned(session, port) for port in ports]
            victim = max(range(3), key=lambda n: len(shares[n]))
            entry = f"http://127.0.0.1:{ports[(victim + 1) % 3]}"
            ids: list[str] = []
            while len(ids) < threads:  # threads on the victim's partitions
                async with session.post(f"{entry}/v1/threads", json={"title": "t"},
                                        headers=AUTH) as response:
                    thread_id = str((await response.json())["thread_id"])
                if partition_for(thread_id, PARTITIONS) in shares[victim]:
                    ids.append(thread_id)
            seen: list[list[float]] = [[] for _ in ids]
            tokens = [asyncio.Event() for _ in ids]
            watchers = [asyncio.create_task(_watch(
                session, f"{entry}/v1/threads/{t}/stream", seen[i], tokens[i]))
                for i, t in enumerate(ids)]
            for thread_id in ids:
                async with session.post(f"{entry}/v1/threads/{thread_id}/user_message",
                                        json={"input_text": "[slow] a long story"},
                                        headers=AUTH) as response:
                    assert response.status == 202, await response.text()
            await asyncio.gather(*(t.wait() for t in tokens))
            # Its share now (the group may have moved on since it was read above):
            # the streams of other partitions are not cut by the kill.
            held = set(await _owned(session, ports[victim]))
            seen = [s for s, t in zip(seen, ids, strict=True)
                    if partition_for(t, PARTITIONS) in held]
            killed = time.monotonic()
            gateways[victim].kill9()
            survivors = [port for n, port in enumerate(ports) if n != victim]
            rebalanced = served = None
            probe = f"{entry}/v1/threads/{ids[0]}/messages"
            while time.monotonic() - killed < 60:
                if rebalanced is None:
                    owned = [p for port in survivors for p in await _owned(session, port)]
                    if sorted(owned) == list(range(PARTITIONS)):
                        rebalanced = time.monotonic() - killed
                if rebalanced is not None and served is None:
                    loading = [await _loading(session, port) for port in survivors]
                    if not any(loading) and await _reads(session, probe):
                        served = time.monotonic() - killed
                if served is not None and rebalanced is not None and all(
                        any(t > killed + rebalanced for t in s) for s in seen):
                    break
                await asyncio.sleep(0.05)
            resumed = [s for s in seen if rebalanced is not None and
                       any(t > killed + rebalanced for t in s)]
            gaps = [_longest_pause(s, killed) for s in resumed]
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
            return gaps, rebalanced if rebalanced is not None else float("nan"), \
                served if served is not None else float("nan"), len(seen) - len(gaps)
    finally:
        for gateway in gateways:
            gateway.stop()
        stack.stop()


def main() -> None:
    """Run the rounds and print each and a summary."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_failover", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=6)
    parser.add_argument("--standbys", type=int, default=1)
    args = parser.parse_args()
    print(f"load before: {load_text()}")
    gaps: list[float] = []
    rebalances: list[float] = []
    served: list[float] = []
    lost = 0
    with broker() as bootstrap:
        for r in range(args.rounds):
            round_gaps, rebalanced, serving, missing = asyncio.run(
                one_round(bootstrap, args.threads, args.standbys))
            gaps += round_gaps
            rebalances.append(rebalanced)
            served.append(serving)
            lost += missing
            print(json.dumps({"round": r + 1, "gaps_s": [round(g, 2) for g in round_gaps],
                              "rebalanced_s": round(rebalanced, 2),
                              "serving_again_s": round(serving, 2), "not_resumed": missing,
                              "load": load_text()}), flush=True)
    print(f"load after: {load_text()}")
    if gaps:
        print(f"a stream's longest pause around the kill: p50 {statistics.median(gaps):.2f} s, max "
              f"{max(gaps):.2f} s over {len(gaps)} streams; the survivors owned every "
              f"partition after {min(rebalances):.2f} to {max(rebalances):.2f} s and served "
              f"them again after {min(served):.2f} to {max(served):.2f} s "
              f"(standbys {args.standbys}); not resumed in 60 s: {lost}")


if __name__ == "__main__":
    main()
