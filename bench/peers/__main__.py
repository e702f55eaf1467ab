"""`make bench-peers`: Threadline side by side with Restate, DBOS and the LangGraph
dev server on one workload (bench/peers/workload.py), one system at a time,
alternating round by round, in one run.

    python -m bench.peers                 the default size (about 10 minutes); writes
                                          the peers section of docs/benchmarks.md
    python -m bench.peers --quick         a smoke check; prints, writes nothing
    python -m bench.peers --only Restate Threadline

Every process is started by the run and stopped by it; everything listens on
127.0.0.1. A peer that cannot be installed or started is reported as missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import VAR
from bench.peers.dbos import Dbos
from bench.peers.driver import QUICK, Size, load_text, measure_round, recovery
from bench.peers.langgraph import LangGraph
from bench.peers.report import print_results, write_section
from bench.peers.restate import Restate, RestateTurns
from bench.peers.system import Missing, System
from bench.peers.threadline import Threadline, ThreadlineCalls
from bench.report import git_head

SYSTEMS: dict[str, type[System]] = {"Threadline": Threadline, "Restate": Restate,
                                    "DBOS": Dbos, "LangGraph": LangGraph,
                                    "Restate-turns": RestateTurns,
                                    "Threadline-calls": ThreadlineCalls}
RUN_BUDGET_S = 1500  # past it, no new round or recovery starts
STOP_TIMEOUT_S = 90


async def one_system(cls: type[System], folder: Path, size: Size, with_recovery: bool,
                     results: dict[str, Any]) -> None:
    """Start the system, measure a round (and its recoveries), stop it."""
    system = cls(folder)
    entry = results["systems"].setdefault(system.name, {"rounds": [], "recovery": []})
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=timeout) as session:
        try:
            t0 = time.monotonic()
            await system.start(session)
            print(f"   {system.name} up in {time.monotonic() - t0:.1f} s", flush=True)
            entry.setdefault("version", system.version())
            entry.setdefault("durability", system.durability())
            entry.setdefault("settings", system.settings())
            figures = await measure_round(system, session, size)
            entry["rounds"].append(figures)
            print(f"   {system.name}: " + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                for k, v in figures.items()), flush=True)
            if with_recovery:
                kills = [(role, False) for role in system.roles] \
                    + [(role, True) for role in system.lost_roles]
                for role, lost in kills:
                    rec = await recovery(system, session, role, size, lost)
                    entry["recovery"].append(rec)
                    print(f"   {system.name} kill {rec['role']}: {rec}", flush=True)
        except Missing as exc:
            entry["missing"] = str(exc)
            print(f"   {system.name} MISSING: {exc}", flush=True)
        except Exception as exc:  # a peer that fails is reported, the run goes on
            entry.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}"[:2000])
            print(f"   {system.name} FAILED: {traceback.format_exc()[-3000:]}", flush=True)
        finally:
            try:
                await asyncio.wait_for(system.stop(), STOP_TIMEOUT_S)
            except Exception as exc:
                print(f"   {system.name}: stopping: {exc}", flush=True)
                for proc in system.procs.values():
                    proc.kill9()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    """Every round, every system in turn (the order rotated each round); the results."""
    size = QUICK if args.quick else Size()
    names = args.only or list(SYSTEMS)
    base = VAR / f"bench-peers-{time.strftime('%H%M%S')}"
    results: dict[str, Any] = {"meta": {"started": time.time(), "load_before": load_text(),
                                        "commit": git_head(), "size": size.__dict__,
                                        "order": []},
                               "systems": {}}
    print(f"load average before: {load_text()}", flush=True)
    budget = time.monotonic() + RUN_BUDGET_S
    for rnd in range(size.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            if time.monotonic() > budget:
                print(f"== {name}: skipped, past the run's budget", flush=True)
                continue
            if results["systems"].get(SYSTEMS[name].name, {}).get("missing"):
                continue
            print(f"== round {rnd + 1}: {name} (load {load_text()})", flush=True)
            results["meta"]["order"].append(name)
            await one_system(SYSTEMS[name], base / f"{name}-{rnd}", size,
                             rnd == size.rounds - 1, results)
    results["meta"]["seconds"] = time.time() - results["meta"]["started"]
    results["meta"]["load_after"] = load_text()
    shutil.rmtree(base, ignore_errors=True) if not args.keep else None
    return results


def main() -> None:
    """Run the comparison (or reload saved results), print it and write the report's section."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke check; writes nothing")
    parser.add_argument("--only", nargs="+", choices=list(SYSTEMS), default=None)
    parser.add_argument("--write", action="store_true", help="write the report with --quick/--only")
    parser.add_argument("--keep", action="store_true", help="keep the systems' folders and logs")
    parser.add_argument("--from-results", metavar="JSON", default=None,
                        help="measure nothing: rewrite the section from saved results")
    args = parser.parse_args()
    if args.from_results:
        results = json.loads(Path(args.from_results).read_text())
    else:
        results = asyncio.run(main_async(args))
        VAR.mkdir(exist_ok=True)
        (VAR / "bench-peers-results.json").write_text(json.dumps(results, indent=1))
    print_results(results)
    if args.from_results or args.write or not (args.quick or args.only):
        write_section(results)


if __name__ == "__main__":
    main()
