"""The gateway's stream feed alone: CPU per ingested record, no Kafka, no sockets.

The records are what a worker and the processor write for 200 runs at once, each in
a thread of its own, interleaved: per run 60 records (the lifecycle records a run
makes, 8 of them, `run_completed` carrying the answer; a message start, 4 tool calls
and results, a text part of 40 deltas, the ends), every one with the headers the
processor and the worker write (`threadline-payload`; `threadline-lifecycle` on
lifecycle records, from checkouts that have it). They are handed to `StreamFeed._step` in batches of up
to 2,000, as the consumer hands them (a stand-in consumer), so the per-batch work
(schema preparation, flush, the write-lag metric) is counted too. CPU is this
process's user + system time over the feed's calls only: the records are made
before, then frozen out of the collector's reach (`gc.freeze`), as a gateway's
long-lived state is, so its passes over them are not counted as the feed's.

Cases, each on a fresh feed:

* `unwatched`: `--passes` (5) passes of 200 runs, nobody subscribed (issue #26: "CPU
  per record of a thread nobody watches");
* `unwatched deltas`: runs started, then only text deltas (the bulk of a stream);
* `unwatched at the bound`: windows of 120 entries (two runs), twice the passes:
  the windows past their bound, shedding as records come;
* `watched`: every thread has one attached subscriber (a sink that takes all), so
  every record is decoded, its events made and written to the sink;
* `late subscribe`: after `unwatched`, one subscriber per thread: the CPU of
  `subscribe` per record of the window it covers (the lazy feed makes the events
  then; an eager one had made them already).

    python -m bench.feed_ingest [--rounds 5] [--passes 5]
    python -m bench.feed_ingest --checkout /tmp/wt-base   # that checkout's feed too,
                                                           # in turn, round by round

Each measurement runs in a child process of its own (a fresh heap); with
`--checkout` the children take turns: this checkout's packages, then each other's
(the order rotates every round).
Prints µs per record, the median over rounds and the range; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

RUNS = 200
DELTAS = 40
TOOLS = 4
BATCH = 2_000
CASES = ("unwatched", "unwatched deltas", "unwatched at the bound", "watched", "late subscribe")


START = 4 + 3 * TOOLS + 1  # a run's records up to its text part's start


def _run_records(thread: str, deltas: int = DELTAS) -> list[Any]:
    """(thread, StreamOutput) of one run, in order: 60 records with the defaults."""
    from streams.core.domain import AssistantMessage
    from streams.core.ids import answer_message_id_for
    from streams.core.records import (
        MessageEnd,
        MessageStart,
        RunLifecycle,
        StepOutput,
        StreamOutput,
        TextDelta,
        TextEnd,
        TextStart,
    )

    run = str(uuid.uuid4())
    answer = answer_message_id_for(run)
    execution = uuid.uuid4().hex[:8]
    seq = iter(range(1_000_000))

    def part(name: str, payload: object) -> Any:
        return StreamOutput(run, 1, answer, f"{execution}:{name}", next(seq), payload)  # type: ignore[arg-type]

    def life(event: str, attempt: int = 1, detail: str = "", message: Any = None) -> Any:
        return StreamOutput(run, attempt, answer, "lifecycle", 0,
                            RunLifecycle(event, "user-message", detail, message))

    out = [life("run_accepted", 0), life("attempt_dispatched"),
           life("execution_started", detail=execution), part("message", MessageStart("assistant"))]
    for tool in range(TOOLS):
        args = json.dumps({"query": f"what tool {tool} is asked", "page": tool})
        out += [part(f"step:{tool}", StepOutput("tool_call", "search", args)),
                life("step_recorded", detail=json.dumps({"step": tool, "result": "ok" * 20})),
                part(f"step:{tool}", StepOutput("tool_result", "search", '{"hits": 3}'))]
    out.append(part("text:0", TextStart()))
    text = [f"word{i} and more " for i in range(deltas)]
    out += [part("text:0", TextDelta(chunk)) for chunk in text]
    out += [part("text:0", TextEnd("".join(text))), part("message", MessageEnd("stop")),
            life("run_completed", message=AssistantMessage(answer, "".join(text)))]
    return [(thread, o) for o in out]


class _Consumer:
    """Hands the feed prepared batches, as `AIOKafkaConsumer.getmany` would."""

    def __init__(self, batches: list[dict[Any, list[Any]]]) -> None:
        self.batches = batches

    async def getmany(self, timeout_ms: int = 0, max_records: int = 0) -> dict[Any, list[Any]]:
        """The next batch."""
        return self.batches.pop(0) if self.batches else {}


class _Encoder:
    """Stream records of interleaved runs, with offsets per partition."""

    def __init__(self, feed: Any) -> None:
        from streams.wire import Codec

        self.feed, self.codec = feed, Codec()
        self.offsets: dict[int, int] = {}

    def records(self, outputs: list[Any]) -> list[Any]:
        from aiokafka.structs import ConsumerRecord

        from streams.wire import new_meta, payload_header

        try:  # as the processor writes them; a checkout from before has the payload's only
            from streams.wire import stream_headers
        except ImportError:
            def stream_headers(payload: object) -> list[tuple[str, bytes]]:
                return [payload_header(payload)]

        made = []
        now = int(time.time() * 1000)
        for thread, output in outputs:
            partition = self.feed.partition_of(thread)
            offset = self.offsets.get(partition, 0)
            self.offsets[partition] = offset + 1
            value = self.codec.encode_stream(output, new_meta(thread, "bench", now))
            made.append(ConsumerRecord("stream", partition, offset, now, 0, thread.encode(), value,
                                       None, len(thread), len(value),
                                       stream_headers(output.payload)))
        return made


def _batches(records: list[Any]) -> list[dict[Any, list[Any]]]:
    from aiokafka import TopicPartition

    out = []
    for start in range(0, len(records), BATCH):
        batch: dict[Any, list[Any]] = {}
        for record in records[start:start + BATCH]:
            batch.setdefault(TopicPartition("stream", record.partition), []).append(record)
        out.append(batch)
    return out


def _slice(runs: dict[str, list[Any]], first: int, thread: str) -> list[Any]:
    return runs[thread][first:first + DELTAS]


def _interleaved(threads: list[str], make: Callable[[str], list[Any]]) -> list[Any]:
    runs = [make(thread) for thread in threads]
    return [run[i] for i in range(max(map(len, runs))) for run in runs if i < len(run)]


def _new_feed(window_events: int = 2_000) -> Any:
    from gateway.live.feed import StreamFeed
    from streams.config import Settings

    class ReadModel:
        def note_ended(self, thread_id: str, run_id: str) -> None:
            pass

    return StreamFeed(Settings.from_env({}), cast(Any, ReadModel()), cast(Any, None),
                      window_events=window_events)


async def _feed_cpu(feed: Any, records: list[Any]) -> float:
    """CPU seconds of `feed._step` over these records."""
    batches = _batches(records)
    feed._consumer_ = _Consumer(batches)
    # The records made for the measure are old objects to the collector, as a
    # gateway's long-lived state is: its passes over them are not the feed's cost.
    gc.collect()
    gc.freeze()
    t0 = time.process_time()
    for _ in range(len(batches)):
        await feed._step()
    return time.process_time() - t0


async def measure(case: str, passes: int) -> dict[str, float]:
    """µs of CPU per record for one case (see the module)."""
    threads = [f"bench-{uuid.uuid4().hex[:12]}" for _ in range(RUNS)]
    window_events = 120 if case == "unwatched at the bound" else 2_000
    feed = _new_feed(window_events)
    encoder = _Encoder(feed)
    if case == "watched":
        taken = [0]

        def sink(events: list[Any]) -> bool:
            taken[0] += len(events)
            return True

        for thread in threads:
            feed.subscribe(thread)[0].attach(sink)
    count = 0
    cpu = 0.0
    long_runs = {}
    if case == "unwatched deltas":
        # One long run per thread: it starts (not measured), then come its deltas only.
        long_runs = {t: _run_records(t, DELTAS * passes) for t in threads}
        await _feed_cpu(feed, encoder.records(_interleaved(threads, lambda t: long_runs[t][:START])))
    for index in range(passes * (2 if case == "unwatched at the bound" else 1)):
        if case == "unwatched deltas":
            first = START + index * DELTAS
            outputs = _interleaved(threads, functools.partial(_slice, long_runs, first))
        else:
            outputs = _interleaved(threads, _run_records)
        records = encoder.records(outputs)
        count += len(records)
        cpu += await _feed_cpu(feed, records)
    if case == "late subscribe":
        windowed = count
        t0 = time.process_time()
        made = sum(len(feed.subscribe(thread)[1]) for thread in threads)
        cpu = time.process_time() - t0
        return {"us_per_record": cpu / windowed * 1e6, "records": windowed, "events": made,
                "ms_per_subscribe": cpu / len(threads) * 1e3}
    return {"us_per_record": cpu / count * 1e6, "records": count}


def _child(case: str, passes: int) -> None:
    print(json.dumps(asyncio.run(measure(case, passes))))


def _overlay(checkout: Path) -> Path:
    """A folder of links: this bench/, the checkout's packages."""
    overlay = Path(tempfile.mkdtemp(prefix="feed-ingest-"))
    (overlay / "bench").symlink_to(Path(__file__).resolve().parent)
    for package in ("streams", "gateway", "schemas"):
        (overlay / package).symlink_to(checkout.resolve() / package)
    return overlay


def main() -> None:
    """Run every case `--rounds` times, alternating checkouts if `--checkout` is given."""
    parser = argparse.ArgumentParser(prog="python -m bench.feed_ingest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="measurements per case and checkout")
    parser.add_argument("--passes", type=int, default=5, help="rounds of 200 runs per measurement")
    parser.add_argument("--checkout", type=Path, nargs="+", default=[],
                        help="measure these checkouts' feeds too (e.g. git worktrees of "
                             "earlier commits), named by their folder")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--child", choices=CASES, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.passes)
        return
    here = Path(__file__).resolve().parent.parent
    sources = {"this": here} | {path.name: path for path in args.checkout}
    paths = {name: (str(here) if name == "this" else str(_overlay(path)))
             for name, path in sources.items()}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for case in args.cases:
            names = list(paths)
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                env = {**os.environ, "PYTHONPATH": paths[name]}
                out = subprocess.run([sys.executable, "-m", "bench.feed_ingest", "--child", case,
                                      "--passes", str(args.passes)], env=env, cwd=paths[name],
                                     capture_output=True, text=True, check=True).stdout
                results.setdefault((case, name), []).append(json.loads(out.splitlines()[-1]))
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'case':<24} {'source':<12} {'µs/record p50':>14} {'range':>17}  records")
    for (case, name), rows in results.items():
        values = [r["us_per_record"] for r in rows]
        extra = f"  {statistics.median(r['ms_per_subscribe'] for r in rows):.2f} ms/subscribe" \
            if "ms_per_subscribe" in rows[0] else ""
        print(f"{case:<24} {name:<12} {statistics.median(values):>14.2f} "
              f"{min(values):>8.2f}-{max(values):<8.2f} {int(rows[0]['records'])}{extra}")


if __name__ == "__main__":
    main()
