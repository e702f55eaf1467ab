"""Debian's Chromium for the tests that drive a real browser (tests/browser), found once.

`chromium()` is the binary's path; without it the calling module is skipped, except
under `CI=true`, where a missing browser fails the run: CI must have installed it
(`make test` does: infra/system-deps.sh)."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ["LAUNCH_ARGS", "chromium"]

# Headless in a container: no sandbox, no GPU, nothing fetched in the background.
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium() -> str:
    """The Chromium binary; a module-level skip without it (a failure under CI=true)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":  # CI must have the real client
            pytest.fail("no Chromium on this machine: make test installs Debian's "
                        "(infra/system-deps.sh)", pytrace=False)
        pytest.skip("no Chromium on this machine", allow_module_level=True)
    return path
