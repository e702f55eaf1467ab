"""The table printed by `make bench`, and docs/benchmarks.md with its plot."""

from __future__ import annotations

import datetime
import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from bench.common import DOCS, ROOT, Figure

TITLES = {
    "processor": "1. Processor throughput (commands/s, 10,000 commands a run)",
    "decision": "2. Decision latency: POST user_message -> 202",
    "token": "3. Token latency: worker produce -> client receipt",
    "fanout": "4. Fan-out: one gateway process, many SSE clients",
    "replay": "5. Replay: 10,000 events of one thread from an early Last-Event-ID",
    "growth": "6. Growth: a thread at turn 10 against one at turn 1,000 (processor and gateway)",
    "growth-gateway": "7. Growth: a gateway with 1k against 100k threads (cold start, warm restart)",
    "observability": "8. Observability cost: metrics and tracing off and on, side by side",
    "capacity": "9. Capacity: each role's cost per run, step, token and thread (docs/scaling.md)",
    "branches": "10. Branches: a 2,000-turn thread with 50 branches against a straight one (processor)",
}
NOTES = ROOT / "bench" / "NOTES.md"
PNG = DOCS / "benchmarks.png"


@dataclass(frozen=True)
class Target:
    """One target of the brief: its benchmark, its wording, and how to check it."""
    bench: str
    text: str
    check: Callable[[dict[str, Figure]], tuple[float, bool] | None]


def _value(figures: dict[str, Figure], case: str, metric: str) -> float | None:
    figure = figures.get(case)
    return None if figure is None else figure.values.get(metric)


def _at_least(case: str, metric: str, bound: float) -> Callable[[dict[str, Figure]],
                                                                 tuple[float, bool] | None]:
    def check(figures: dict[str, Figure]) -> tuple[float, bool] | None:
        value = _value(figures, case, metric)
        return None if value is None else (value, value >= bound)
    return check


def _at_most(case: str, metric: str, bound: float) -> Callable[[dict[str, Figure]],
                                                               tuple[float, bool] | None]:
    def check(figures: dict[str, Figure]) -> tuple[float, bool] | None:
        value = _value(figures, case, metric)
        return None if value is None else (value, value <= bound)
    return check


EOS = "threadline processor, exactly-once"
LONG = "at turn 1,000"
LARGE = "gateway, 100,000 threads"
BRANCHED = "50 branches, 2,000 turns"  # bench.branches
TARGETS = [
    Target("processor", "exactly-once processor >= 0.5x the bare EOS loop (events only)",
           _at_least(EOS, "x bare loop, events only", 0.5)),
    Target("processor", "exactly-once processor >= 5,000 commands/s per process",
           _at_least(EOS, "cmd/s", 5000)),
    Target("decision", "p99 <= 150 ms", _at_most("gateway", "p99 ms", 150)),
    Target("token", "gateway adds <= 5 ms at p50", _at_most("gateway SSE", "adds p50 ms", 5)),
    Target("token", "gateway adds <= 15 ms at p99", _at_most("gateway SSE", "adds p99 ms", 15)),
    Target("fanout", "10k clients: >= 50,000 events/s delivered",
           _at_least("10000 clients", "events/s", 50_000)),
    Target("fanout", "10k clients: p99 <= 100 ms", _at_most("10000 clients", "p99 ms", 100)),
    Target("fanout", "<= 50 KiB per idle connection",
           _at_most("10000 clients", "KiB/idle conn", 50)),
    Target("replay", "<= 1.5x the bare seek-and-consume",
           _at_most("gateway replay", "x bare", 1.5)),
    Target("growth", "processor CPU per command at turn 1,000 <= 1.2x turn 10",
           _at_most(LONG, "x CPU µs/cmd", 1.2)),
    Target("growth", "POST -> 202 p50 at turn 1,000 <= 1.2x turn 10",
           _at_most(LONG, "x POST p50", 1.2)),
    Target("branches", "processor CPU per command, 50 branches <= 1.2x a straight thread",
           _at_most(BRANCHED, "x CPU µs/cmd", 1.2)),
    Target("branches", "POST -> 202 p50, 50 branches <= 1.2x a straight thread",
           _at_most(BRANCHED, "x POST p50", 1.2)),
    Target("observability", "processor with metrics + tracing at 1% >= 0.95x observability off",
           _at_least("processor, metrics + tracing 1%", "x off", 0.95)),
    Target("growth-gateway", "gateway RSS after a cold start, 100k threads <= 1.5x 1k",
           _at_most(LARGE, "x cold: RSS MiB", 1.5)),
    Target("growth-gateway", "gateway RSS after a warm restart, 100k threads <= 1.5x 1k",
           _at_most(LARGE, "x warm: RSS MiB", 1.5)),
    Target("growth-gateway", "gateway time to ready, warm restart, 100k threads <= 1.5x 1k",
           _at_most(LARGE, "x warm: s to ready", 1.5)),
    Target("growth-gateway", "gateway time to ready, cold start (empty store), 100k threads "
           "<= 1.5x 1k", _at_most(LARGE, "x cold: s to ready", 1.5)),
]


def fmt(value: float) -> str:
    """A figure as the report prints it: three significant digits or so, n/a for NaN."""
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if float(value).is_integer() and abs(value) < 100:
        return f"{value:.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _columns(figures: list[Figure]) -> list[str]:
    columns: list[str] = []
    for f in figures:
        for key in f.values:
            if key not in columns:
                columns.append(key)
    return columns


def _rows(figures: list[Figure]) -> tuple[list[str], list[list[str]]]:
    columns = _columns(figures)
    header = ["case", *columns, "CPU µs/event by process", "load avg (1 5 15 min)"]
    rows = []
    for f in figures:
        cpu = ", ".join(f"{p} {fmt(v)}" for p, v in f.cpu.items()) or "-"
        rows.append([f.case, *(fmt(f.values[c]) if c in f.values else "" for c in columns),
                     cpu, f.load])
    return header, rows


def by_bench(figures: list[Figure]) -> dict[str, list[Figure]]:
    """The figures grouped by benchmark, in order."""
    out: dict[str, list[Figure]] = {}
    for f in figures:
        out.setdefault(f.bench, []).append(f)
    return out


def print_table(figures: list[Figure]) -> None:
    """Print each benchmark's table and whether each target was met."""
    for bench, group in by_bench(figures).items():
        header, rows = _rows(group)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        print(f"\n{TITLES.get(bench, bench)}")
        for row in [header, *rows]:
            print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
    print()
    for line in target_lines(figures):
        print(line)


def target_lines(figures: list[Figure]) -> list[str]:
    """One checklist line per target: its value and whether it was met."""
    lines = []
    groups = by_bench(figures)
    for target in TARGETS:
        result = target.check({f.case: f for f in groups.get(target.bench, [])})
        if result is None:
            lines.append(f"- [ ] {target.bench}: {target.text}: not measured")
        else:
            value, met = result
            mark = "x" if met else " "
            lines.append(f"- [{mark}] {target.bench}: {target.text}: **{fmt(value)}** "
                         f"({'met' if met else 'missed'})")
    return lines


def _markdown_table(group: list[Figure]) -> str:
    header, rows = _rows(group)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    notes = [f"- {f.case}: {f.note}" for f in group if f.note]
    return "\n".join(lines + (["", *notes] if notes else []))


def git_head() -> str:
    """The short hash of the checked-out commit, or "?"."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=False).stdout.strip()
    except OSError:
        return "?"


def write_report(figures: list[Figure], meta: dict[str, object]) -> None:
    """Write docs/benchmarks.md (with its plot) from the figures and the run's details."""
    DOCS.mkdir(exist_ok=True)
    plotted = plot(figures)
    started = datetime.datetime.fromtimestamp(float(meta["started"]))  # type: ignore[arg-type]
    parts = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`python -m bench`); every figure below and its "
        "baseline come from the one run described here. Hand-written notes (method, "
        "fixes with before/after, what bounds a missed target) follow the tables.",
        "",
        f"- run: {started:%Y-%m-%d %H:%M}, {float(meta['seconds']):.0f} s "  # type: ignore[arg-type]
        f"(commit {meta.get('commit') or git_head()}), {os.cpu_count()} cores, one embedded Kafka 3.9 broker "
        "on 127.0.0.1",
        f"- load average (1, 5, 15 min) before: {meta['load_before']}, after: "
        f"{meta['load_after']} (the machine is shared; each row has its own load)",
        "- CPU is user + system seconds of each process (all threads, librdkafka's "
        "included) over the measured interval, per event",
        "",
        "## Targets",
        "",
        *target_lines(figures),
        "",
    ]
    if plotted:
        parts += ["![benchmarks](benchmarks.png)", ""]
    groups = by_bench(figures)
    for bench in sorted(groups, key=lambda b: list(TITLES).index(b) if b in TITLES else 99):
        parts += [f"## {TITLES.get(bench, bench)}", "", _markdown_table(groups[bench]), ""]
    if NOTES.exists():
        parts += [NOTES.read_text()]
    path = DOCS / "benchmarks.md"
    new = "\n".join(parts).rstrip() + "\n"
    if path.exists():  # the peers' section is written by `make bench-peers`: kept
        from bench.peers.report import keep_section

        new = keep_section(path.read_text(), new)
    path.write_text(new)
    print(f"wrote {DOCS / 'benchmarks.md'}" + (f" and {PNG}" if plotted else ""))
    from bench.capacity import SCALING, write_scaling

    if write_scaling(figures, f"{started:%Y-%m-%d %H:%M}, commit {meta.get('commit') or git_head()}"):
        print(f"wrote the measured part of {SCALING}")


def plot(figures: list[Figure]) -> bool:
    """Draw one panel per benchmark into the report's PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return False
    groups = by_bench(figures)
    panels = [b for b in TITLES if b in groups and b in _PANELS]  # tables-only sections: no panel
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.2), squeeze=False)
    for ax, bench in zip(axes[0], panels, strict=True):
        group = groups[bench]
        _PANELS[bench](ax, group)
        ax.set_title(bench, fontsize=10)
        ax.tick_params(axis="x", labelsize=7, rotation=20)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(PNG, dpi=110)
    plt.close(fig)
    return True


def _bars(ax: object, labels: list[str], series: dict[str, list[float]], unit: str) -> None:
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [x + i * width for x in range(len(labels))]
        ax.bar(xs, values, width, label=name)  # type: ignore[attr-defined]
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))])  # type: ignore[attr-defined]
    ax.set_xticklabels([_short(label) for label in labels])  # type: ignore[attr-defined]
    ax.set_ylabel(unit)  # type: ignore[attr-defined]
    if len(series) > 1:
        ax.legend(fontsize=7)  # type: ignore[attr-defined]


def _short(label: str) -> str:
    return (label.replace("threadline processor, ", "").replace("bare loop, ", "bare: ")
            .replace("confluent-kafka", "ck"))


def _panel_values(group: list[Figure], metrics: list[str]) -> dict[str, list[float]]:
    return {m: [f.values.get(m, 0.0) for f in group] for m in metrics}


_PANELS: dict[str, Callable[[object, list[Figure]], None]] = {
    "processor": lambda ax, g: _bars(ax, [f.case for f in g], _panel_values(g, ["cmd/s"]),
                                     "commands/s"),
    "decision": lambda ax, g: _bars(ax, [f.case for f in g],
                                    _panel_values(g, ["p50 ms", "p95 ms", "p99 ms"]), "ms"),
    "token": lambda ax, g: _bars(ax, [f.case for f in g], _panel_values(g, ["p50 ms", "p99 ms"]),
                                 "ms"),
    "fanout": lambda ax, g: _bars(ax, [f.case for f in g],
                                  {"delivered": [f.values.get("events/s", 0) / 1000 for f in g],
                                   "offered": [f.values.get("offered events/s", 0) / 1000
                                               for f in g]},
                                  "thousand events/s"),
    "replay": lambda ax, g: _bars(ax, [f.case for f in g], _panel_values(g, ["seconds"]), "s"),
    "growth": lambda ax, g: _ratios(ax, g),
    "growth-gateway": lambda ax, g: _ratios(ax, g),
    "branches": lambda ax, g: _ratios(ax, g),
}


def _ratios(ax: object, group: list[Figure]) -> None:
    """The x-columns (a case over its baseline) as bars, the goal's 1x marked."""
    ratios = {k[2:]: v for f in group for k, v in f.values.items() if k.startswith("x ")}
    _bars(ax, list(ratios), {"ratio": list(ratios.values())}, "x the smaller case")
    ax.axhline(1.0, color="grey", linewidth=0.8)  # type: ignore[attr-defined]
