"""A thread's state against its idempotency keys: bytes, and CPU per state record.

A thread whose posts carry `Idempotency-Key` keeps up to `max_idempotency_keys`
(256) of them in its state, for the processor's `decide`. Every command that
changes the state writes it whole: the processor encodes it (table and changelog),
and every gateway's read store decodes each changelog record. The processor keeps
the bytes of a key map it wrote (a state made from another shares its map until a
keyed post changes it); the read store needs no key, and reads a state without
them (`Codec.decode_state_without_keys`). This puts each beside what it replaced
(the keys written every time, the whole decode), in one process, alternating.

The states are a run in progress (an active run with a two-step journal) and N keys
of the shape the gateway makes (a 36-character key, message and run ids, the
payload's `sha256:` fingerprint).

    python -m bench.state_keys [--rounds 7] [--keys 0 16 64 256]

Prints, per key count, the state's bytes and µs of CPU per state (median of the
rounds, and the range); writes nothing.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import MappingProxyType

from streams.core.domain import ActiveRun, IdempotencyRecord, RunStatus, ThreadState
from streams.core.journal import JournalEntry
from streams.wire import Codec
from streams.wire.codec import KEYS_KEPT

BATCH_S = 0.2  # each measurement: calls until this much CPU, then per call


def state_with_keys(n: int) -> ThreadState:
    """A thread with a run in progress and `n` idempotency keys."""
    journal = (JournalEntry(0, "model_turn", "model", "{}", '{"text": "Step 1"}', "exec-1"),
               JournalEntry(1, "tool_call", "lookup", '{"q": "x"}', '{"content": 1}', "exec-1"))
    run = ActiveRun(str(uuid.uuid4()), "m-1", 1, RunStatus.RUNNING, 1_700_000_000_000,
                    1_700_000_000_500, None, 2 * n, 1_700_000_000_000, journal)
    keys = {str(uuid.UUID(int=i)): IdempotencyRecord(
        f"message-{i}", str(uuid.UUID(int=10**6 + i)), "sha256:" + f"{i:064x}",
        1_700_000_000_000 + i) for i in range(n)}
    return ThreadState("thread-1", "tenant-a", "a long thread", 1_700_000_000_000,
                       active_run=run, idempotency=MappingProxyType(keys),
                       message_count=2 * n + 1, run_count=n + 1,
                       updated_at_ms=1_700_000_000_500)


def cpu_us_per_call(call: Callable[[], object]) -> float:
    """µs of this process's CPU per call of `call`, over about `BATCH_S` of CPU."""
    calls, start = 0, time.process_time()
    while (spent := time.process_time() - start) < BATCH_S:
        for _ in range(10):
            call()
        calls += 10
    return spent / calls * 1e6


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--keys", type=int, nargs="+", default=[0, 16, 64, 256])
    args = parser.parse_args()
    codec = Codec()
    print("| keys | state bytes | processor: encode µs, keys written | processor: encode µs, "
          "keys kept | gateway: whole decode µs (before) | gateway: decode without keys µs "
          "(now) | now/before |")
    print("|---|---|---|---|---|---|---|")
    for n in args.keys:
        state = state_with_keys(n)
        data = codec.encode_state(state)
        assert codec.decode_state_without_keys(data) == \
            replace(state, idempotency=MappingProxyType({}))
        # Each state of `fresh` has a key map of its own, more of them than the codec
        # keeps: every encode writes its keys. Encoding `state` again finds them kept.
        fresh = itertools.cycle([replace(state, idempotency=MappingProxyType(dict(
            state.idempotency))) for _ in range(KEYS_KEPT + 1)])
        cases: dict[str, Callable[[], object]] = {
            "anew": lambda: codec.encode_state(next(fresh)),  # noqa: B023 (called in this pass)
            "encode": partial(codec.encode_state, state),
            "whole": partial(codec.decode_state, data),
            "without": partial(codec.decode_state_without_keys, data),
        }
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for round_ in range(args.rounds):
            names = list(cases)
            names = names[round_ % 4:] + names[:round_ % 4]  # the order rotates
            for name in names:
                samples[name].append(cpu_us_per_call(cases[name]))

        ratio = statistics.median(w / f for w, f in zip(samples["without"], samples["whole"],
                                                       strict=True))
        print(f"| {n} | {len(data):,} | {_cell(samples['anew'])} | {_cell(samples['encode'])} "
              f"| {_cell(samples['whole'])} "
              f"| {_cell(samples['without'])} "
              f"| {ratio:.2f} |")


if __name__ == "__main__":
    main()
