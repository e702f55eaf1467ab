"""A role started from a directory that holds a `gateway/` package of its own still
runs ours: `threadline gateway` execs `python -m gateway` with PYTHONSAFEPATH=1
(`python -P`), so the current directory is not on the module path (issue #25)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from streams.devtools.broker import free_port
from streams.testing.process import ChildProcess
from streams.testing.stack import fresh_env, unique_prefix

pytestmark = pytest.mark.kafka

FAKE = "a fake gateway from the current directory ran"


def test_threadline_gateway_runs_ours_from_a_folder_with_a_gateway_package(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """`threadline gateway` in a folder holding `gateway/__main__.py` serves our gateway."""
    here = tmp_path / "cwd"
    (here / "gateway").mkdir(parents=True)
    (here / "gateway" / "__init__.py").write_text("")
    (here / "gateway" / "__main__.py").write_text(f"print({FAKE!r}, flush=True)\n")
    port = free_port()
    env = fresh_env(kafka_bootstrap, tmp_path, prefix=unique_prefix("shadow"),
                    THREADLINE_API_KEYS="key=tenant", THREADLINE_HTTP_PORT=str(port))
    threadline = Path(sys.executable).parent / "threadline"  # the console script
    gateway = ChildProcess("gateway", [str(threadline), "gateway"], env,
                           tmp_path / "gateway.log", cwd=here).start()
    try:
        gateway.wait_for_log("listening on", timeout=120)  # fails at once if it exits
        output = gateway.output()
        assert FAKE not in output
        assert f"threadline gateway listening on http://127.0.0.1:{port}" in output, output
    finally:
        gateway.stop()
