"""Profile the processor deciding turns of short threads against turns of long ones.

    python -m bench.profile_growth [--out var/growth-profile.txt]

Threads are brought to turn 10 and to turn 1,000 (commands straight to Kafka, as in
`bench.growth`), decided by an unprofiled processor; then the same number of turns
(5 a thread) on the short threads and on the long ones, each decided by a fresh
processor in this process under pyinstrument. Prints both call trees (time in
`_process_batch` and below) and the CPU per command of each, and writes them to
`--out`. How docs/benchmarks.md's growth profile was made.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pyinstrument import Profiler

from bench.common import VAR, bench_env, broker, cleanup
from bench.growth import LONG_TURNS, SHORT_TURNS, TENANT, TURNS_EACH, Commands
from bench.processor_throughput import _child_threadline
from streams.config import Settings
from streams.core.domain import CreateThread
from streams.kafka.topics import ensure_topics

THREADS = 60  # a side: 300 turns, 600 commands


def _decide(settings: Settings, count: int, profiler: Profiler | None) -> dict[str, float]:
    if profiler is not None:
        profiler.start()
    try:
        return _child_threadline(settings, count)
    finally:
        if profiler is not None:
            profiler.stop()


def main() -> None:
    """Profile the processor deciding short- and long-thread turns and write the profile."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile_growth")
    parser.add_argument("--out", type=Path, default=VAR / "growth-profile.txt")
    args = parser.parse_args()
    texts = []
    with broker() as bootstrap:
        settings = Settings.from_env(bench_env(bootstrap))
        ensure_topics(settings)
        kafka = Commands(settings)
        try:
            shorts = [f"short-{i}" for i in range(THREADS)]
            longs = [f"long-{i}" for i in range(THREADS // 10)]
            now = int(time.time() * 1000)
            for thread in [*shorts, *longs]:
                kafka.send(CreateThread(thread, TENANT, "growth", now))
            for thread in shorts:
                kafka.turns(thread, 0, SHORT_TURNS)
            for thread in longs:
                kafka.turns(thread, 0, LONG_TURNS)
            kafka.producer.flush(60)
            prepared = len(shorts) * (1 + 2 * SHORT_TURNS) + len(longs) * (1 + 2 * LONG_TURNS)
            _decide(settings, prepared, None)
            sides = [("turn 10", shorts, SHORT_TURNS, 1), ("turn 1,000", longs, LONG_TURNS, 10)]
            for name, threads, first, rounds in sides:
                for r in range(rounds):  # the long side: 6 threads, 10 x 5 turns each
                    for thread in threads:
                        kafka.turns(thread, first + r * TURNS_EACH, TURNS_EACH)
                kafka.producer.flush(60)
                profiler = Profiler(interval=0.0005)
                result = _decide(settings, 2 * TURNS_EACH * THREADS, profiler)
                text = profiler.output_text(unicode=True, color=False, show_all=False)
                texts.append(f"## {name}: {result['commands']} commands measured, "
                             f"{result['cpu_us']:.0f} CPU µs/cmd under the profiler\n\n{text}")
                print(texts[-1], flush=True)
        finally:
            kafka.close()
            cleanup(settings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(texts))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
