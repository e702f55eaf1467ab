"""Node and the pinned npm packages of tests/node (`ai`, the LangGraph SDK, React,
esbuild, `axe-core`), for the tests that need them.

`node_modules()` installs tests/node/package-lock.json with `npm ci` once (again
when the lock changes) and returns the folder. Without node or npm the calling test
is skipped, except under `CI=true`, where a missing tool fails the run: CI must
have installed it (`make test` does: infra/system-deps.sh).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["NODE_DIR", "node_modules", "require_tool"]

NODE_DIR = Path(__file__).parent / "node"


def require_tool(name: str) -> str:
    """The tool's path; a skip without it, or a failure under CI=true."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}: make test installs it (infra/system-deps.sh)")
        pytest.skip(message)
    return path


def node_modules() -> Path:
    """tests/node/node_modules, installed from the lock file (`npm ci`) if stale."""
    require_tool("node")
    npm = require_tool("npm")
    lock = NODE_DIR / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = NODE_DIR / "node_modules" / ".threadline-lock"
    with open(NODE_DIR / ".install.lock", "w") as guard:  # concurrent test sessions
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not (stamp.exists() and stamp.read_text() == digest):
            done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                                  capture_output=True, text=True, timeout=600, check=False)
            if done.returncode != 0:
                pytest.fail(f"npm ci failed in {NODE_DIR}:\n{done.stdout}\n{done.stderr}")
            stamp.write_text(digest)
    return NODE_DIR / "node_modules"
