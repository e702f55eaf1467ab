"""docs/scaling.md quotes the capacity benchmark: its measured part is what
`bench.capacity.render` makes of the tables of docs/benchmarks.md (sections 4 and 9,
from the same `make bench` run), so every figure it quotes is in the benchmark's results
and the worked example is the formula's output for them."""

from __future__ import annotations

import re
from pathlib import Path

from bench.capacity import BEGIN, BENCH, END, FANOUT_CASE, render
from bench.report import TITLES

DOCS = Path(__file__).resolve().parents[2] / "docs"
CELL_EDGE = re.compile(r"(?<!\\)\|")


def table(markdown: str, title: str) -> dict[str, dict[str, str]]:
    """A section's table of benchmarks.md: case -> column -> cell."""
    part = markdown.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in CELL_EDGE.split(line)[1:-1]]
            for line in part.splitlines() if line.startswith("|")]
    header, body = rows[0], rows[2:]
    return {row[0]: dict(zip(header, row, strict=True)) for row in body}


def number(cell: str) -> float:
    """A cell's number as the report printed it (`1,024`, `0.72`)."""
    return float(cell.replace(",", ""))


def test_the_measured_part_is_rendered_from_the_benchmark_tables() -> None:
    """Rendered again from benchmarks.md's cells, the measured part is the same text."""
    benchmarks = (DOCS / "benchmarks.md").read_text()
    capacity = {case: {k: number(v) for k, v in row.items() if k not in (
                    "case", "CPU µs/event by process", "load avg (1 5 15 min)") and v}
                for case, row in table(benchmarks, TITLES[BENCH]).items()}
    fanout_row = table(benchmarks, TITLES["fanout"])[FANOUT_CASE]
    by_process = dict(part.rsplit(" ", 1) for part in
                      fanout_row["CPU µs/event by process"].split(", "))
    fanout = {"gateway µs/event": number(by_process["gateway"]),
              "KiB/idle conn": number(fanout_row["KiB/idle conn"])}
    scaling = (DOCS / "scaling.md").read_text()
    written = BEGIN + scaling.split(BEGIN, 1)[1].split(END, 1)[0] + END
    run_line = re.search(r"Measured by `make bench` \((.*?)\);", written)
    assert run_line, "docs/scaling.md has no measured part yet: run make bench"
    assert render(capacity, fanout, run_line.group(1)) == written
