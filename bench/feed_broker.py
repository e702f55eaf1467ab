"""CPU per record of a thread nobody watches, through the broker: a gateway process
reading the stream topic as it reads it in production (issue #26).

`bench.feed_ingest` times the feed's own code on records handed to it in batches of
up to 2,000; it leaves out the Kafka consumer. Here a gateway (one, no group, as
`make run` starts it) reads a stream topic that `bench.streamgen`'s generator
writes at a steady rate: text deltas round robin over `--threads` threads, each
with a run started, none watched. The gateway's CPU (user + system, /proc) over
the writing and one second after (every record read) less its idle CPU over as long
(measured just before, over `--seconds`: long polls, health checks), per record
written. Each rate is measured with the fetches batched under sustained traffic
(`THREADLINE_GATEWAY_FETCH_BATCH_MS`, the default 5) and without (0); the cases
alternate, the order rotating round by round.

    python -m bench.feed_broker [--rounds 2] [--rates 500,2000,8000] [--seconds 10]
                                [--batch-ms 0,5]

At a low rate every record comes in a fetch of its own, so the cost of a fetch
(aiokafka is Python: a request built and sent, a response parsed) is paid per
record; at a high rate a fetch brings many. Prints µs per record for each case,
then for each batching setting the line through the rates: what one record more
costs (its slope) and what following the stream costs at any rate (its intercept).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from pathlib import Path

import aiohttp

from bench.broker_cost import start_spies, stop_spies
from bench.common import Child, broker, load_text
from bench.stack import new_stack
from bench.streamgen import Generator, seed_threads
from streams.config import Settings

DRAIN_S = 1.0


async def _measure(settings: Settings, gateway: Child, threads: list[str], rate: float,
                   seconds: float, spy: Path | None) -> tuple[float, int, float]:
    async with Generator(settings, threads) as generator:
        await generator.start_runs()
        await asyncio.sleep(2.0)  # the runs' starts read
        gateway.mark()
        idle_since = time.monotonic()
        await asyncio.sleep(seconds)
        idle_rate = gateway.cpu_since_mark() / (time.monotonic() - idle_since)
        gateway.mark()
        since = time.monotonic()
        spies = start_spies({"gateway": gateway.pid}, spy) if spy else {}
        sent = await generator.deltas(rate, seconds)
        await asyncio.sleep(DRAIN_S)
        window = time.monotonic() - since
        busy = gateway.cpu_since_mark()
        if spy:
            stop_spies(spies, spy)
    return busy - idle_rate * window, sent, window


def measure(bootstrap: str, threads: int, rate: float, seconds: float, batch_ms: int,
            spy: Path | None = None) -> tuple[float, int, float]:
    """One case on a fresh stack, the gateway's fetches batched for up to `batch_ms`
    under sustained traffic (`THREADLINE_GATEWAY_FETCH_BATCH_MS`, 0: never): (µs per
    record, records sent, seconds they took)."""
    stack = new_stack(bootstrap, THREADLINE_GATEWAY_FETCH_BATCH_MS=str(batch_ms))
    thread_ids = seed_threads(stack.settings, threads)
    stack.start(["gateway"])
    try:
        async def healthy() -> None:
            async with aiohttp.ClientSession() as session:
                await stack.healthy(session)

        asyncio.run(healthy())
        spent, sent, window = asyncio.run(_measure(
            stack.settings, stack.children["gateway"], thread_ids, rate, seconds, spy))
    finally:
        stack.stop()
        shutil.rmtree(stack.folder, ignore_errors=True)
    return spent / max(1, sent) * 1e6, sent, window - DRAIN_S


def main() -> None:
    """Each rate, rounds alternating; the median and range of µs per record."""
    parser = argparse.ArgumentParser(prog="python -m bench.feed_broker", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rates", default="500,2000,8000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=200)
    parser.add_argument("--batch-ms", default="0,5", help="THREADLINE_GATEWAY_FETCH_BATCH_MS "
                        "values to compare (0: every fetch returns at the first record; 5: the "
                        "default)")
    parser.add_argument("--spy", type=Path, help="py-spy the gateway into this folder "
                        "(the CPU figures then include py-spy's sampling)")
    args = parser.parse_args()
    cases = [(float(rate), int(ms)) for rate in args.rates.split(",")
             for ms in args.batch_ms.split(",")]
    results: dict[tuple[float, int], list[float]] = {case: [] for case in cases}
    print(f"load before: {load_text()}", flush=True)
    with broker() as bootstrap:
        for r in range(args.rounds):
            for rate, ms in cases[r % len(cases):] + cases[:r % len(cases)]:
                spy = args.spy / f"r{r + 1}-{rate:.0f}-{ms}" if args.spy else None
                us, sent, took = measure(bootstrap, args.threads, rate, args.seconds, ms, spy)
                results[(rate, ms)].append(us)
                print(f"round {r + 1}, {rate:.0f}/s, batch {ms} ms: {sent} records in "
                      f"{took:.1f} s, {us:.2f} µs a record, load {load_text()}", flush=True)
    print(f"load after: {load_text()}")
    print("| records/s written | THREADLINE_GATEWAY_FETCH_BATCH_MS | µs per record (median) "
          "| range |")
    print("|---|---|---|---|")
    for rate, ms in cases:
        values = results[(rate, ms)]
        print(f"| {rate:.0f} | {ms} | {statistics.median(values):.2f} | "
              f"{min(values):.2f}-{max(values):.2f} |")
    rates = sorted({rate for rate, _ in cases})
    if len(rates) >= 2:
        print("\nThe gateway's CPU a second against the rate, a least-squares line through "
              "each batched case's median: its slope is what one more record costs, its "
              "intercept what following a stream costs whatever its rate (the fetches).")
        print("| THREADLINE_GATEWAY_FETCH_BATCH_MS | µs per record more (slope) "
              "| ms a second whatever the rate (intercept) |")
        print("|---|---|---|")
        # Only batched: there the fetches come every `ms` whatever the rate, so the CPU
        # is a fixed part plus a part per record. Unbatched, a fetch a record or a few.
        for ms in dict.fromkeys(ms for _, ms in cases if ms > 0):
            slope, intercept = marginal(
                [(rate, statistics.median(results[(rate, ms)])) for rate in rates])
            print(f"| {ms} | {slope:.2f} | {intercept:.1f} |")


def marginal(points: list[tuple[float, float]]) -> tuple[float, float]:
    """From (records a second, µs a record) points: the least-squares line of CPU µs a
    second against records a second, as (µs per record more, ms a second at none)."""
    xs = [rate for rate, _ in points]
    ys = [rate * us for rate, us in points]  # CPU µs a second
    slope, intercept = statistics.linear_regression(xs, ys)
    return slope, intercept / 1000


if __name__ == "__main__":
    main()
