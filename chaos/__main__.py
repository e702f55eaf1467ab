"""`python -m chaos`: run the chaos program, print its table, exit 1 on any violation."""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from chaos.run import KINDS, Config, Outcome, run


@dataclass(frozen=True, slots=True)
class Preset:
    """A named chaos run size: threads, posting time, kills of each kind, brokers."""
    threads: int
    duration_s: float
    kills: dict[str, int]  # processor, worker, gateway, broker
    brokers: int = 1
    gateways: int = 2
    # The gateways as one group (THREADLINE_GATEWAY_URL) behind HAProxy, which routes
    # each request to a random one: clients know one address, as in a deployment.
    balanced: bool = False
    # Balanced, HAProxy also runs deploy/haproxy/threadline.lua: a request about a
    # thread goes to its partition's owner, the rest at random (docs/scaling.md).
    by_owner: bool = False


PRESETS = {
    # make test: about two minutes on two cores
    "small": Preset(6, 55.0, {"processor": 2, "worker": 2, "gateway": 2, "broker": 1}),
    # make chaos: every kind killed at least three times
    "full": Preset(12, 240.0, {"processor": 4, "worker": 4, "gateway": 4, "broker": 1}),
    # the controls of make test: one processor kill, by the fault point (--fault-point);
    # the positive one also restarts the broker under the roles
    "control": Preset(3, 15.0, {"processor": 1}),
    "control-restart": Preset(3, 25.0, {"processor": 1, "broker": 1}),
    # three brokers, one of them killed for good mid-run
    "cluster": Preset(4, 50.0, {"processor": 1, "worker": 1, "gateway": 1, "broker": 1}, 3),
    # three grouped gateways behind HAProxy (random routing), gateways killed most
    # (issue #26): `make chaos CHAOS_PRESET=gateways`
    "gateways": Preset(8, 120.0, {"processor": 2, "worker": 2, "gateway": 5, "broker": 1},
                       gateways=3, balanced=True),
}
# the gateways preset with HAProxy routing each thread's requests to its owner:
# `make chaos CHAOS_PRESET=gateways-by-owner`
PRESETS["gateways-by-owner"] = replace(PRESETS["gateways"], by_owner=True)

HEADER = ("| seed | threads | messages | accepted | 409s | enqueued | interrupted "
          "| regenerated (key sent twice) | edited | answered "
          "| lost | duplicated | gaps "
          "| stuck | kills p/w/g/b | self-exits | watched runs (unwatched) | reconnects "
          "| streams cut short | aborted records | aimed kills | guarantee "
          "| max recovery s p/w/g/b | max serving again s p/w/g/b | max runs moving again s p/w/g/b "
          "| longest run s | tool calls (dup) | wall s |")


def table_row(outcome: Outcome) -> str:
    """One Markdown table row summarising a chaos run."""
    r = outcome.report
    kills = "/".join(str(outcome.kills.get(k, 0)) for k in KINDS)
    recovery, serving, moving = ("/".join(f"{figures[k]:.1f}" if k in figures else "-"
                                          for k in KINDS)
                                 for figures in (outcome.recovery_s, outcome.serving_s,
                                                 outcome.moving_s))
    exits = sum(outcome.self_exits.values())
    return (f"| {outcome.config.seed} | {r.threads} | {r.messages} | {r.accepted} | "
            f"{r.conflicts} | {r.enqueued} | {r.interrupted} | "
            f"{r.regenerated} ({r.keys_resent}) | {r.edited} | {r.answered} | {r.lost} | "
            f"{r.duplicated} | {r.gaps} | {r.stuck} | "
            f"{kills} | {exits} | {r.watched_runs} ({r.unwatched}) | {outcome.reconnects} | "
            f"{r.cut_short} | {r.aborted} | {outcome.aimed} | "
            f"{outcome.config.processing_guarantee} | {recovery} | {serving} | {moving} | "
            f"{outcome.max_run_s:.1f} | {r.tool_calls} ({r.tool_duplicates}) | "
            f"{outcome.wall_s:.0f} |")


def _kind(violation: str) -> str:
    """A violation's text without its ids and numbers, to count them by kind."""
    return re.sub(r"\([^)]*\)|'[^']*'|[0-9a-f]{8}-[0-9a-f-]{27}|[\w.-]*\d[\w.@-]*", "_",
                  violation)[:90]


def main(argv: list[str] | None = None) -> int:
    """Run the chaos program with a preset and options, print its table, and return 1 on any violation."""
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000,
                        help="the kill plan and the clients' choices (default: from the clock)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--duration", type=float, help="seconds of posting (kills inside)")
    parser.add_argument("--folder", type=Path, default=Path("var/chaos"))
    parser.add_argument("--keep", action="store_true", help="keep logs and data on success")
    parser.add_argument("--processing-guarantee", choices=("exactly_once", "at_least_once"),
                        default="exactly_once",
                        help="the processors' mode; at_least_once is the negative control, "
                             "whose run the topic audit must fail")
    parser.add_argument("--no-aim", dest="aim", action="store_false",
                        help="kill processors at random moments, not inside a burst's batches")
    parser.add_argument("--fault-point", choices=("before-commit",),
                        help="processor kills are made by the processors' fault point: "
                             "each exits between a step's write and its commit, every time "
                             "(streams/kafka/faults.py)")
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the stack is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        stream=sys.stderr)
    preset = PRESETS[args.preset]
    config = Config(
        seed=args.seed, threads=args.threads or preset.threads,
        duration_s=args.duration or preset.duration_s, kills=dict(preset.kills),
        brokers=preset.brokers, gateways=preset.gateways, balanced=preset.balanced,
        by_owner=preset.by_owner,
        bootstrap=os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None,
        folder=args.folder, keep=args.keep, processing_guarantee=args.processing_guarantee,
        aim=args.aim, fault=args.fault_point == "before-commit")
    outcome = run(config)
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    print(table_row(outcome))
    kinds = Counter(_kind(v) for v in outcome.report.violations)
    for kind, n in kinds.most_common(20):
        print(f"VIOLATIONS {n:5d} x {kind}")
    shown: Counter[str] = Counter()
    for violation in outcome.report.violations:  # the first three of each kind
        kind = _kind(violation)
        if shown[kind] < 3 and shown.total() < 60:
            shown[kind] += 1
            print(f"VIOLATION: {violation}")
    if not outcome.report.ok:
        print(f"logs kept in {outcome.folder}")
    return 0 if outcome.report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
