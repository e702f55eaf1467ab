"""The compiled Avro writer against fastavro's `write_data`, side by side in one
process (issue #22): the records one run writes, each kind timed both ways in
alternating rounds, the bytes checked equal.

    python -m bench.avro_writer [--rounds 5] [--runs 200]

A run's records, as the roles write them (docs/benchmarks.md, "A run hop by hop"):
on the stream topic 5 text blocks of 8 deltas, their starts and ends, 8 tool steps,
the lifecycle mirror; on the commands topic the worker's reports (8 steps, 2
heartbeats, start, execution start, completion); on the events topic the
processor's decisions; a thread state and the two messages. Prints µs per record
by kind, the median of the rounds, and the ratio; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from fastavro._write import write_data  # type: ignore[attr-defined]

from streams.core.domain import (
    ActiveRun,
    AssistantMessage,
    AttemptDispatched,
    AttemptStarted,
    ExecutionStarted,
    IdempotencyRecord,
    ReportAttemptCompleted,
    ReportAttemptStarted,
    ReportExecutionStarted,
    ReportHeartbeat,
    ReportStepCompleted,
    RunAccepted,
    RunCompleted,
    RunRecord,
    RunStatus,
    Step,
    StepRecorded,
    StoredMessage,
    ThreadState,
)
from streams.core.journal import JournalEntry
from streams.core.records import (
    MessageEnd,
    MessageRecord,
    MessageStart,
    RunLifecycle,
    StepOutput,
    StreamOutput,
    TextDelta,
    TextEnd,
    TextStart,
)
from streams.wire import codec as wire
from streams.wire.envelope import new_meta
from streams.wire.schemas import TopLevel

OPTIONS = {"strict": False, "strict_allow_default": False, "disable_tuple_notation": False}
THREAD, RUN, TENANT = "thread-00000000-0000-4000-8000-000000000001", "run-0001", "tenant-a"


def run_records() -> dict[str, list[tuple[TopLevel, dict[str, Any]]]]:
    """The Avro dicts of one run's records, by kind, as the codec builds them."""
    meta = new_meta(THREAD, TENANT, 1_796_000_000_000,
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None)
    stream_parts: list[Any] = [MessageStart("assistant")]
    steps = []
    for block in range(5):
        words = [f"word{block}{n} " for n in range(8)]
        stream_parts += [TextStart(), *(TextDelta(w) for w in words), TextEnd("".join(words))]
        if block < 4:
            call = Step("tool_call", "lookup", f'{{"query": "question {block}"}}')
            result = Step("tool_result", "lookup", f'{{"content": "fact {block}"}}')
            steps += [call, result]
            stream_parts += [StepOutput(call.kind, call.name, call.payload_json),
                             StepOutput(result.kind, result.name, result.payload_json)]
    answer = AssistantMessage("m-a1", "the answer " * 8, tuple(steps))
    stream_parts += [MessageEnd("stop"), RunLifecycle("run_accepted", "m1", ""),
                     RunLifecycle("run_completed", "m1", "", answer)]
    entries = [JournalEntry(n, "tool_call" if n % 2 else "model_turn", "lookup",
                            f'{{"query": "question {n}"}}', f'{{"content": "fact {n}"}}',
                            "exec-0001") for n in range(8)]
    commands = [ReportAttemptStarted(THREAD, RUN, 1, "worker-a", 1),
                ReportExecutionStarted(THREAD, RUN, 1, "worker-a", "exec-0001", 2),
                *(ReportStepCompleted(THREAD, RUN, 1, "worker-a", e, 3) for e in entries),
                ReportHeartbeat(THREAD, RUN, 1, "worker-a", 4),
                ReportHeartbeat(THREAD, RUN, 1, "worker-a", 5),
                ReportAttemptCompleted(THREAD, RUN, 1, "worker-a", answer.text, tuple(steps),
                                       (), 6)]
    events = [RunAccepted(THREAD, RUN, "wf-1", "m1", 1), AttemptDispatched(THREAD, RUN, "m1", 1, 2),
              AttemptStarted(THREAD, RUN, 1, "worker-a", 3),
              ExecutionStarted(THREAD, RUN, 1, "exec-0001", 4),
              *(StepRecorded(THREAD, RUN, 1, e, 5) for e in entries),
              RunCompleted(THREAD, RUN, 1, answer, 6)]
    state = ThreadState(THREAD, TENANT, "Trip planning", 1, active_run=ActiveRun(
        RUN, "m1", 1, RunStatus.RUNNING, 1, 2, None, 1, 3, tuple(entries[:3])),
        idempotency=MappingProxyType({"idem-1": IdempotencyRecord("m1", RUN, "sha256:ab", 2)}),
        message_count=2, run_count=1, last_run=RunRecord("r0", "m0", RunStatus.COMPLETED, 1),
        updated_at_ms=5)
    messages = [MessageRecord(0, StoredMessage("m1", "user", "Where to go in May?", RUN, 1),
                              RunStatus.COMPLETED, 1),
                MessageRecord(1, StoredMessage("m-a1", "assistant", answer.text, RUN, 2,
                                               tuple(steps)))]
    stream = [wire._META.to_avro(meta) | wire._STREAM.to_avro(StreamOutput(RUN, 1, "m-a1", "p", n, p))
              for n, p in enumerate(stream_parts)]
    return {
        "stream": [(wire._STREAMS, r) for r in stream],
        "command": [(wire._COMMANDS, wire._META.to_avro(meta) | {
            "payload": wire._command_to_avro(c)}) for c in commands],
        "event": [(wire._EVENTS, wire._META.to_avro(meta) | {
            "payload": wire._event_to_avro(e)}) for e in events],
        "state": [(wire._STATES, wire._STATE.to_avro(state))],
        "message": [(wire._MESSAGES, wire._META.to_avro(meta) | wire._MESSAGE.to_avro(m))
                    for m in messages],
    }


def _fastavro(schema: TopLevel, record: dict[str, Any]) -> bytes:
    out = bytearray()
    write_data(out, record, schema.parsed, schema.named_types, "", OPTIONS)
    return bytes(out)


def _compiled(schema: TopLevel, record: dict[str, Any]) -> bytes:
    out = bytearray()
    schema.writer(out, record)
    return bytes(out)


def _time(write: Callable[[TopLevel, dict[str, Any]], bytes],
          records: list[tuple[TopLevel, dict[str, Any]]], runs: int) -> float:
    """CPU µs per record of writing `records` `runs` times."""
    started = time.process_time()
    for _ in range(runs):
        for schema, record in records:
            write(schema, record)
    return (time.process_time() - started) * 1e6 / (runs * len(records))


def main() -> None:
    """Time both writers on a run's records, alternating, and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200, help="runs' records a round")
    args = parser.parse_args()
    kinds = run_records()
    for name, records in kinds.items():
        for schema, record in records:
            assert _compiled(schema, record) == _fastavro(schema, record), name
    print(f"{'kind':8} {'records/run':>11} {'fastavro µs':>12} {'compiled µs':>12} {'ratio':>6}")
    total = {"fastavro": 0.0, "compiled": 0.0}
    for name, records in kinds.items():
        times: dict[str, list[float]] = {"fastavro": [], "compiled": []}
        for n in range(args.rounds):
            order = [("fastavro", _fastavro), ("compiled", _compiled)]
            for label, write in order if n % 2 == 0 else order[::-1]:
                times[label].append(_time(write, records, args.runs))
        medians = {label: statistics.median(t) for label, t in times.items()}
        for label in total:
            total[label] += medians[label] * len(records)
        print(f"{name:8} {len(records):>11} {medians['fastavro']:>12.2f} "
              f"{medians['compiled']:>12.2f} {medians['compiled'] / medians['fastavro']:>6.2f}")
    print(f"a run's records: fastavro {total['fastavro']:.0f} µs, compiled "
          f"{total['compiled']:.0f} µs ({total['compiled'] / total['fastavro']:.2f}x)")


if __name__ == "__main__":
    main()
