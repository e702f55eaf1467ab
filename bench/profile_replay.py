"""Profile the gateway's Kafka replay (`gateway.live.replay.replay`) in-process.

    python -m bench.profile_replay [--events 10000]

Starts an embedded broker, writes one run of `--events` stream records as the
replay benchmark does, replays it twice unprofiled (printing the times), then once
under pyinstrument, and prints the call tree. docs/profiles/replay-pyinstrument.txt
was made with it.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from pyinstrument import Profiler

from bench.common import broker
from bench.replay import _write_run
from bench.stack import Stack, new_stack
from bench.streamgen import seed_threads
from gateway.live.replay import replay
from gateway.live.tokens import ResumeTokens
from streams.wire import Codec


async def _replay_all(stack: Stack, thread: str, partition: int, start: int, last: int) -> int:
    count = 0
    async for _event in replay(stack.settings, ResumeTokens.from_settings(stack.settings), partition, thread,
                               scan_from=start, after=(start + 1, 0), until=(last, 99),
                               codec=Codec.from_settings(stack.settings)):
        count += 1
    return count


def main() -> None:
    """Time and profile the gateway's Kafka replay of one long run, in-process."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile_replay")
    parser.add_argument("--events", type=int, default=10_000)
    args = parser.parse_args()
    with broker() as bootstrap:
        stack = new_stack(bootstrap)
        thread = seed_threads(stack.settings, 1)[0]
        partition, start, _run = _write_run(stack, thread, args.events)
        last = start + args.events - 1
        for _ in range(2):
            t0 = time.perf_counter()
            count = asyncio.run(_replay_all(stack, thread, partition, start, last))
            print(f"{count} events in {(time.perf_counter() - t0) * 1000:.0f} ms")
        profiler = Profiler(interval=0.0002)
        profiler.start()
        asyncio.run(_replay_all(stack, thread, partition, start, last))
        profiler.stop()
        print(profiler.output_text(unicode=True, color=False))


if __name__ == "__main__":
    main()
