"""Profile the exactly-once processor on the processor benchmark's payload.

    python -m bench.profile_processor [--threads 1000] [--out var/processor-profile.txt]

Starts an embedded broker, preloads the benchmark's commands, and runs the
Threadline processor in this process under pyinstrument until it has decided
every command; prints the call tree (time in `_process_batch` and below) and
writes it to `--out`. How docs/benchmarks.md's processor profiles were made.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pyinstrument import Profiler

from bench.common import VAR, bench_env, broker, cleanup
from bench.processor_throughput import _child_threadline, encoded, payload, preload
from streams.config import Settings
from streams.kafka.topics import ensure_topics


def main() -> None:
    """Profile the exactly-once processor in-process on preloaded commands and write the profile."""
    parser = argparse.ArgumentParser(prog="python -m bench.profile_processor")
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=VAR / "processor-profile.txt")
    args = parser.parse_args()
    records = encoded(payload(args.threads, 3))
    with broker() as bootstrap:
        settings = Settings.from_env(bench_env(bootstrap))
        ensure_topics(settings)
        preload(settings, records)
        profiler = Profiler(interval=0.0005)
        profiler.start()
        try:
            result = _child_threadline(settings, len(records))
        finally:
            profiler.stop()
            cleanup(settings)
    text = profiler.output_text(unicode=True, color=False, show_all=False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"{result['per_s']:.0f} cmd/s, {result['cpu_us']:.0f} CPU µs/cmd under the profiler; "
          f"written to {args.out}")


if __name__ == "__main__":
    main()
