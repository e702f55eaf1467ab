"""The roles never call `asyncio.wait_for`: on Python 3.11 it can drop a cancellation
(`streams.aio.within` says how, and replaces it; tests/streams/test_aio.py shows the
race). A stopped worker execution ran on that way (docs/chaos.md, seed 3008)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_role_module_calls_asyncio_wait_for() -> None:
    """No module of streams/ or gateway/ but the test kit calls asyncio.wait_for."""
    offenders = [str(path.relative_to(ROOT)) for folder in ("streams", "gateway")
                 for path in (ROOT / folder).rglob("*.py")
                 if "testing" not in path.parts and "asyncio.wait_for(" in path.read_text()]
    assert offenders == [], f"use streams.aio.within instead: {offenders}"
