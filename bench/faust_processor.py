"""The comparison column the brief asked for: a Faust (faust-streaming 0.15.3)
processor with exactly-once on, running the same pure core on the same commands,
with the thread state in a rocksdict-backed Faust table.

It is a benchmark variant, not a production path (docs/exactly-once.md says why the
processor does not use Faust's EOS mode). Per command: decode, load the state from
the table, `decide`, `apply`, send the events to the events topic on the command's
partition, store the new state in the table (Faust writes its changelog). Faust's
defaults commit every 10,000 records or 2.8 s, where the processor commits each
batch (up to 500). Run as `python -m bench.faust_processor --count N --out FILE`
with the case's environment; it stops itself after N commands and writes its
figures (from the end of the first command to the end of the last).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import own_cpu
from streams.config import Settings


def _app(settings: Settings, count: int, out: Path) -> Any:
    import faust

    from streams.core.thread import apply, decide
    from streams.wire import Codec

    codec = Codec()  # single-object, as the processor writes without a registry
    topics = settings.topics
    app = faust.App(
        f"{settings.topic_prefix}faust", broker=f"kafka://{settings.bootstrap}",
        processing_guarantee="exactly_once", store="rocksdb://",
        datadir=str(settings.data_dir / "faust"), topic_partitions=settings.partitions,
        web_enabled=False, key_serializer="raw", value_serializer="raw",
    )
    commands = app.topic(topics.commands, partitions=settings.partitions,
                         key_serializer="raw", value_serializer="raw")
    events = app.topic(topics.events, partitions=settings.partitions,
                       key_serializer="raw", value_serializer="raw")
    table = app.Table("threads", default=None, partitions=settings.partitions,
                      key_type=bytes, value_type=bytes)
    seen = {"n": 0, "first_at": 0.0, "first_cpu": 0.0}

    @app.agent(commands)
    async def process(stream: Any) -> None:
        async for event in stream.events():
            key, partition = event.key, event.message.partition
            meta, command = codec.decode_command(event.value)
            stored = table.get(key)
            state = codec.decode_state(stored) if stored is not None else None
            decided = decide(state, command, settings.policy)
            if decided:
                new_state = apply(state, decided)
                for item in decided:
                    await events.send(key=key, value=codec.encode_event(item, meta),
                                      partition=partition)
                if new_state is not None:
                    table[key] = codec.encode_state(new_state)
            seen["n"] += 1
            if seen["n"] == 1:
                seen["first_at"], seen["first_cpu"] = time.monotonic(), own_cpu()
            elif seen["n"] >= count:
                measured = count - 1
                wall = time.monotonic() - seen["first_at"]
                cpu = own_cpu() - seen["first_cpu"]
                out.write_text(json.dumps({
                    "commands": measured, "wall_s": wall, "cpu_s": cpu,
                    "per_s": measured / wall, "cpu_us": cpu / measured * 1e6,
                    "batches": 0, "aborts": 0}))
                os._exit(0)  # measured; the benchmark needs nothing more from Faust

    return app


def main() -> None:
    """Run the Faust comparison processor until it has decided `--count` commands."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    settings = Settings.from_env()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = _app(settings, args.count, Path(args.out))
    sys.argv = [sys.argv[0], "worker", "-l", "warn", "--without-web"]
    app.main()


if __name__ == "__main__":
    main()
