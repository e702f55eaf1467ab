"""Every setting does something: each `Settings` field is read by the code outside
`streams/config.py` (that each variable is documented: test_settings_doc.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from streams.config import Settings

REPO = Path(__file__).resolve().parents[2]
CODE = [p for folder in ("streams", "gateway", "chaos", "bench") for p in (REPO / folder).rglob("*.py")
        if p != REPO / "streams" / "config.py"]


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(Settings)])
def test_every_setting_is_read_by_the_code(name: str) -> None:
    """Every Settings field is used somewhere in the code."""
    used = re.compile(rf"\.{name}\b")
    assert any(used.search(p.read_text()) for p in CODE), f"Settings.{name} is read and never used"


def test_the_worker_and_the_agents_read_no_environment() -> None:
    """Shows no module of the worker or the agents reads the environment; settings come to them."""
    for folder in ("worker", "agents"):
        for path in (REPO / "streams" / folder).rglob("*.py"):
            text = path.read_text()
            assert "os.environ" not in text and "getenv" not in text, path
