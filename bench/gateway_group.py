"""Gateways sharing the stream (issue #26): the same traffic served by 1, 2 and 3
gateways behind HAProxy, and what each gateway's CPU comes to per record of the
cluster.

Each case is a fresh stack on fresh topics of one broker: a processor, a worker and
N gateway processes, HAProxy in front (round robin, `streams/testing/haproxy.py`).
With N > 1 the gateways form a group (`THREADLINE_GATEWAY_URL`); with N = 1 the
gateway runs as `make run` starts it (no group). Through HAProxy the bench creates
`--threads` threads, opens an SSE stream on `--watched` of them, then posts one
message on every thread (the builtin agent, `--words` words at full speed) and waits
until the processor has decided every run's end (read from the events topic by
header, no gateway asked) and every watcher has its `done`. Counted from just before
the posts to just after: each gateway's CPU (user + system, /proc), and the records
written to every topic of the deployment (commands, events, stream, dispatch,
threads, messages): "cluster records".

The report per N: the busiest gateway's CPU per cluster record, the sum over the
gateways (forwarding included), and the busiest against the single gateway's, the
ratio issue #26 bounds at 0.4 for three gateways; that ratio again with each
gateway's idle CPU taken out (measured over 5 s before the posts, the watchers open,
and scaled to the measured window): a gateway's long polls and health checks cost
the same whatever its share. Cases alternate 1, 2, 3 with the
order rotated each round.

    python -m bench.gateway_group [--rounds 2] [--threads 120] [--watched 40]

Three gateways are measured twice: without standby copies of the read model (the
case issue #26 bounds) and with one (`THREADLINE_GATEWAY_STANDBYS`, the default).
    python -m bench.gateway_group --rounds 1 --spy var/spy-gateways  # where the CPU goes

`--owner-routed` adds two cases of three gateways. In one, the clients send each
thread's stream and post straight to the gateway owning its partition (read from
each one's /livez before the posts): what a balancer that knew the owner map would
do, and so what forwarding costs at round robin. In the other, HAProxy does that
routing with deploy/haproxy/threadline.lua (what a deployment can run): the clients
go through it as in the round-robin cases.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from confluent_kafka import Consumer, TopicPartition

from bench.broker_cost import start_spies, stop_spies
from bench.common import Child, broker, load_text
from bench.stack import AUTH, Stack, new_stack
from gateway.kafka import partition_for
from streams.devtools.broker import free_port
from streams.testing.haproxy import HAProxy, haproxy_binary
from streams.wire import PAYLOAD_HEADER

ENDS = {b"RunCompleted", b"RunFailed", b"RunCancelled"}
IDLE_S = 5.0


@dataclass
class Case:
    """One measurement: N gateways, each one's CPU seconds, the cluster's records."""
    gateways: int
    cpu_s: list[float] = field(default_factory=list)
    idle_cpu_s: list[float] = field(default_factory=list)  # each one's idle CPU, as long
    records: int = 0
    load: str = ""

    def us_per_record(self, idle: bool = True) -> list[float]:
        """Each gateway's CPU per cluster record, µs (without `idle`: less what it
        spends idle over as long a time: health checks, long polls)."""
        spent = self.cpu_s if idle else [c - i for c, i in zip(self.cpu_s, self.idle_cpu_s,
                                                                 strict=True)]
        return [c / max(1, self.records) * 1e6 for c in spent]


def _ends(stack: Stack) -> dict[str, int]:
    """Each topic's records so far (the sum of its partitions' high watermarks)."""
    consumer = Consumer({"bootstrap.servers": stack.settings.bootstrap,
                         "group.id": "bench-watermarks", "enable.auto.commit": False})
    try:
        out = {}
        for topic in stack.settings.topics.all():
            total = 0
            for p in range(stack.settings.partitions):
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high
            out[topic] = total
        return out
    finally:
        consumer.close()


def _wait_run_ends(stack: Stack, start: dict[int, int], runs: int, timeout_s: float) -> None:
    """Until the events topic holds `runs` run ends after `start` (by header only)."""
    consumer = Consumer({"bootstrap.servers": stack.settings.bootstrap,
                         "group.id": "bench-ends", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    topic = stack.settings.topics.events
    consumer.assign([TopicPartition(topic, p, o) for p, o in start.items()])
    seen, deadline = 0, time.monotonic() + timeout_s
    try:
        while seen < runs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seen} of {runs} runs ended in {timeout_s:.0f} s")
            for record in consumer.consume(500, timeout=0.5):
                if record.error() is None and \
                        dict(record.headers() or []).get(PAYLOAD_HEADER) in ENDS:
                    seen += 1
    finally:
        consumer.close()


def _event_offsets(stack: Stack) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": stack.settings.bootstrap,
                         "group.id": "bench-watermarks", "enable.auto.commit": False})
    try:
        return {p: consumer.get_watermark_offsets(
            TopicPartition(stack.settings.topics.events, p), timeout=10)[1]
            for p in range(stack.settings.partitions)}
    finally:
        consumer.close()


async def _watch(session: aiohttp.ClientSession, base: str, thread_id: str,
                 opened: asyncio.Event, done: asyncio.Event) -> None:
    """A thread's SSE stream through HAProxy until its run's `done`."""
    async with session.get(f"{base}/v1/threads/{thread_id}/stream", headers=AUTH,
                           timeout=aiohttp.ClientTimeout(total=None)) as response:
        assert response.status == 200, await response.text()
        opened.set()
        async for line in response.content:
            if line.startswith(b"event: done"):
                done.set()
                return


async def _owners(session: aiohttp.ClientSession, ports: list[int]) -> dict[int, int]:
    """Each partition's owner, by port (each gateway's /livez names its share)."""
    owners = {}
    for port in ports:
        async with session.get(f"http://127.0.0.1:{port}/livez") as response:
            owned = (await response.json()).get("owned")  # "all" outside a group
            for partition in owned if isinstance(owned, list) else []:
                owners[int(partition)] = port
    return owners


async def _healthy(session: aiohttp.ClientSession, ports: list[int], partitions: int,
                   grouped: bool, timeout_s: float = 180) -> None:
    """Every gateway answers /healthz 200; grouped, every one has a share (the group
    formed: a stream opened before a member joined would end "moved") and the shares
    cover the partitions."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        owned: list[int] = []
        ok, shares = True, 0
        for port in ports:
            try:
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    body = await response.json()
                    ok = ok and response.status == 200
                    share = body.get("feed", {}).get("owned")
                    owned += share if isinstance(share, list) else []
                    shares += bool(share)
                    last = str(body)[:300]
            except aiohttp.ClientError as exc:
                ok, last = False, str(exc)
        if ok and (not grouped or (sorted(owned) == list(range(partitions))
                                   and shares == min(len(ports), partitions))):
            return
        await asyncio.sleep(0.3)
    raise RuntimeError(f"gateways not healthy in {timeout_s:.0f} s: {last}")


async def measure(bootstrap: str, gateways: int, threads: int, watched: int,
                  words: int, spy: Path | None = None, standbys: int = 0,
                  tokens_per_s: float = 0, owner_routed: bool = False,
                  by_owner: bool = False) -> Case:
    """One case (see the module); with `spy`, py-spy records each gateway over the
    measured window into that folder and its summary is printed. `owner_routed`: each
    thread's stream and post go straight to the gateway that owns its partition, as a
    balancer that knew the owner map would send them (nothing is forwarded).
    `by_owner`: HAProxy runs deploy/haproxy/threadline.lua, which does that routing."""
    stack = new_stack(bootstrap, partitions=6, THREADLINE_WORKER_CONCURRENCY="256",
                      THREADLINE_AGENT_TOKENS_PER_S=str(tokens_per_s),
                      THREADLINE_AGENT_WORDS=str(words))
    stack.start(["processor", "worker"])
    ports = [free_port() for _ in range(gateways)]
    children: list[Child] = []
    haproxy = HAProxy(free_port(), ports, stack.folder / "haproxy", owner_routing=by_owner)
    try:
        for n, port in enumerate(ports):
            env = {**stack.env, "THREADLINE_HTTP_PORT": str(port)}
            if gateways > 1:
                env["THREADLINE_GATEWAY_URL"] = f"http://127.0.0.1:{port}"
                env["THREADLINE_GATEWAY_STANDBYS"] = str(standbys)
            children.append(Child(f"gateway-{n}", ["-m", "streams.cli", "gateway"], env,
                                  stack.folder / f"gateway-{n}.log"))
        haproxy.start()
        base = haproxy.base
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await _healthy(session, ports, stack.settings.partitions, gateways > 1)
            await asyncio.to_thread(haproxy.wait_serving)
            if by_owner:  # two rounds of the script's polls since every gateway had its share
                polls, deadline = haproxy.owner_polls(), time.monotonic() + 60
                while haproxy.owner_polls() < polls + 2 * gateways:
                    if time.monotonic() > deadline:
                        raise RuntimeError("HAProxy's script polled no gateway in 60 s")
                    await asyncio.sleep(0.2)
            gate = asyncio.Semaphore(16)

            async def create(i: int) -> str:
                async with gate, session.post(f"{base}/v1/threads", json={"title": f"t{i}"},
                                              headers=AUTH) as response:
                    assert response.status == 201, await response.text()
                    return str((await response.json())["thread_id"])

            ids = list(await asyncio.gather(*(create(i) for i in range(threads))))
            route = {t: base for t in ids}
            if owner_routed:
                owners = await _owners(session, ports)
                route = {t: f"http://127.0.0.1:{owners[partition_for(t, stack.settings.partitions)]}"
                         for t in ids}
            opened = [asyncio.Event() for _ in range(watched)]
            done = [asyncio.Event() for _ in range(watched)]
            watchers = [asyncio.create_task(_watch(session, route[ids[i]], ids[i], opened[i],
                                                   done[i]))
                        for i in range(watched)]
            await asyncio.gather(*(o.wait() for o in opened))
            await asyncio.sleep(1.0)  # the creations' records ingested everywhere
            for child in children:
                child.mark()
            idle_since = time.monotonic()
            await asyncio.sleep(IDLE_S)  # each gateway's idle CPU a second, with watchers
            idle_rate = [c.cpu_since_mark() / (time.monotonic() - idle_since) for c in children]
            before = await asyncio.to_thread(_ends, stack)
            start = await asyncio.to_thread(_event_offsets, stack)
            for child in children:
                child.mark()
            since = time.monotonic()
            spies = start_spies({c.name: c.pid for c in children}, spy) if spy else {}

            async def post(thread_id: str) -> None:
                async with gate, session.post(f"{route[thread_id]}/v1/threads/{thread_id}/user_message",
                                              json={"input_text": "hello"},
                                              headers=AUTH) as response:
                    assert response.status == 202, await response.text()

            await asyncio.gather(*(post(t) for t in ids))
            await asyncio.to_thread(_wait_run_ends, stack, start, threads, 300.0)
            await asyncio.gather(*(d.wait() for d in done))
            await asyncio.sleep(1.0)  # every gateway has read the last records
            window = time.monotonic() - since
            case = Case(gateways, [c.cpu_since_mark() for c in children],
                        [rate * window for rate in idle_rate], load=load_text())
            if spy:
                stop_spies(spies, spy)
            after = await asyncio.to_thread(_ends, stack)
            case.records = sum(after.values()) - sum(before.values())
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        return case
    finally:
        haproxy.stop()
        for child in children:
            child.stop()
        stack.stop()


def main() -> None:
    """Run the cases side by side and print the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_group", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=120)
    parser.add_argument("--watched", type=int, default=40)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--tokens-per-s", type=float, default=0,
                        help="the builtin agent's token rate (0: as fast as it can)")
    parser.add_argument("--spy", type=Path, help="py-spy each gateway into this folder "
                        "(the CPU figures then include py-spy's sampling)")
    parser.add_argument("--owner-routed", action="store_true",
                        help="add two cases of three gateways: clients reaching each thread's "
                        "owner directly, as an owner-aware balancer would route them, and "
                        "HAProxy routing so (deploy/haproxy/threadline.lua)")
    args = parser.parse_args()
    if haproxy_binary() is None:
        raise SystemExit("haproxy is not installed (make system-deps)")
    # (label, gateways, standby copies): the bound is for 0 copies; 1 is the default.
    kinds = [("1", 1, 0), ("2", 2, 0), ("3", 3, 0), ("3, 1 standby", 3, 1)]
    if args.owner_routed:
        kinds += [("3, owner-routed", 3, 0), ("3, HAProxy by owner", 3, 0)]
    cases: dict[str, list[Case]] = {label: [] for label, _, _ in kinds}
    print(f"load before: {load_text()}")
    with broker() as bootstrap:
        for r in range(args.rounds):
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for label, n, standbys in order:
                tag = "-owner" if label.endswith("owner-routed") else \
                    "-haproxy-owner" if label.endswith("by owner") else ""
                spy = args.spy / f"r{r + 1}-n{n}-s{standbys}{tag}" if args.spy else None
                case = asyncio.run(measure(bootstrap, n, args.threads, args.watched, args.words,
                                           spy, standbys, args.tokens_per_s,
                                           owner_routed=label.endswith("owner-routed"),
                                           by_owner=label.endswith("by owner")))
                cases[label].append(case)
                print(f"round {r + 1}, {label} gateway(s): {case.records} records, CPU s "
                      f"{[round(c, 3) for c in case.cpu_s]} (idle "
                      f"{[round(c, 3) for c in case.idle_cpu_s]}), µs/record "
                      f"{[round(u, 1) for u in case.us_per_record()]}, less idle "
                      f"{[round(u, 1) for u in case.us_per_record(idle=False)]}, "
                      f"load {case.load}", flush=True)
    print(f"\nload after: {load_text()}")
    print("| gateways | cluster records a case | busiest gateway µs/record | all gateways "
          "µs/record | busiest against one gateway | the same, idle CPU taken out |")
    print("|---|---|---|---|---|---|")
    single = statistics.median(max(c.us_per_record()) for c in cases["1"])
    single_busy = statistics.median(max(c.us_per_record(idle=False)) for c in cases["1"])
    for label, _, _ in kinds:
        busiest = [max(c.us_per_record()) for c in cases[label]]
        total = [sum(c.us_per_record()) for c in cases[label]]
        busy = [max(c.us_per_record(idle=False)) for c in cases[label]]
        print(f"| {label} | {statistics.median(c.records for c in cases[label]):.0f} "
              f"| {min(busiest):.1f} to {max(busiest):.1f} | {min(total):.1f} to {max(total):.1f} "
              f"| {statistics.median(busiest) / single:.2f}x "
              f"| {statistics.median(busy) / single_busy:.2f}x |")


if __name__ == "__main__":
    main()
