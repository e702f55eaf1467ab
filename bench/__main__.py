"""`make bench`: every benchmark against one embedded broker, side by side.

    python -m bench                   all of them; writes docs/benchmarks.md and its PNG
    python -m bench --only replay     some of them; prints, writes nothing unless --write

Each benchmark is bounded in time and traffic, talks only to 127.0.0.1 and stops
by itself; the whole run takes about ten minutes on two cores.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import time
from pathlib import Path

from bench.common import VAR, Figure, broker, load_text
from bench.report import git_head, print_table, write_report

BENCHMARKS = {
    "processor": "bench.processor_throughput",
    "decision": "bench.decision_latency",
    "token": "bench.token_latency",
    "replay": "bench.replay",
    "fanout": "bench.fanout",
    "growth": "bench.growth",
    "observability": "bench.observability_cost",
    "capacity": "bench.capacity",
    "branches": "bench.branches",
}


def main() -> None:
    """Run the chosen benchmarks (or reload saved results), print the table and write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=None)
    parser.add_argument("--write", action="store_true", help="write the report with --only too")
    parser.add_argument("--from-results", metavar="JSON", default=None,
                        help="measure nothing: rewrite the report from a run's saved results "
                             "(var/bench-results.json), e.g. after editing bench/NOTES.md")
    args = parser.parse_args()
    if args.from_results:
        saved = json.loads(Path(args.from_results).read_text())
        loaded = [Figure(**f) for f in saved["figures"]]
        print_table(loaded)
        write_report(loaded, saved["meta"])
        return
    logging.basicConfig(level=logging.WARNING)
    names = args.only or list(BENCHMARKS)
    started, load_before = time.time(), load_text()
    print(f"load average before: {load_before}", flush=True)
    figures: list[Figure] = []
    with broker() as bootstrap:
        for name in names:
            print(f"== {name} (load {load_text()})", flush=True)
            t0 = time.monotonic()
            module = importlib.import_module(BENCHMARKS[name])
            figures += module.run(bootstrap)
            print(f"   {name} took {time.monotonic() - t0:.0f} s", flush=True)
    meta = {"started": started, "seconds": time.time() - started, "load_before": load_before,
            "load_after": load_text(), "benchmarks": names, "commit": git_head()}
    VAR.mkdir(exist_ok=True)
    (VAR / "bench-results.json").write_text(json.dumps(
        {"meta": meta, "figures": [f.to_json() for f in figures]}, indent=1))
    print_table(figures)
    print(f"load average after: {meta['load_after']}; {meta['seconds']:.0f} s in all")
    if args.only is None or args.write:
        write_report(figures, meta)


if __name__ == "__main__":
    main()
