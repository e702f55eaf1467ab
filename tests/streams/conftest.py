"""Fixtures of the processor's tests against the session's broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.config import Settings
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess


@pytest.fixture
def processor(test_env: dict[str, str], tmp_path: Path) -> Iterator[RoleProcess]:
    """A processor role process on the test topics."""
    settings = Settings.from_env(test_env)
    ensure_topics(settings)
    proc = RoleProcess("processor", test_env, tmp_path / "processor.log").start()
    yield proc
    proc.stop()
