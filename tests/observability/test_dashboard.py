"""The Grafana dashboard and docs/operations.md name only metrics the code makes,
and the docs list every metric the code makes."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"threadline_(?:processor|worker|gateway|connector)_[a-z_]+")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def _family(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _in_code() -> set[str]:
    sources = [*(ROOT / "streams" / "observability").glob("*.py"),
               ROOT / "gateway" / "http" / "observability.py"]
    return {_family(n) for path in sources for n in NAME.findall(path.read_text())}


def test_the_dashboard_and_the_docs_name_only_metrics_that_exist() -> None:
    """Every family in a dashboard query and in the docs is made by the code, and back."""
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert queries
    used = {_family(n) for q in queries for n in NAME.findall(q)}
    documented = {_family(n) for n in NAME.findall((ROOT / "docs" / "operations.md").read_text())}
    code = _in_code()
    assert used - code == set(), "the dashboard queries unknown metrics"
    assert documented - code == set(), "docs/operations.md names unknown metrics"
    assert code - documented == set(), "metrics missing from docs/operations.md"
