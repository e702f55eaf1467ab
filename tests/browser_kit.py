"""Debian's Chromium for the tests that drive a real browser (tests/browser), found once.

`chromium()` is the binary's path; without it the calling module is skipped, except
under `CI=true`, where a missing browser fails the run: CI must have installed it
(`make test` does: infra/system-deps.sh)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from streams.testing.process import wait_for
from tests.frontends.stack import ProcessStack
from tests.npm_kit import NODE_DIR

__all__ = ["LAUNCH_ARGS", "PatientPage", "app_on_its_own_origin", "chromium", "give_browser_token",
           "launched"]

T = TypeVar("T")

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


# Counts the page's DOM changes from its first document on (read by PatientPage).
_COUNT_MUTATIONS = """
window.__threadlineMutations = 0;
new MutationObserver((records) => { window.__threadlineMutations += records.length; })
  .observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
"""


class PatientPage:
    """A Playwright page whose waits are bounded by progress, not by the clock.

    `wait_for_function` and `wait_for_selector` read `timeout` as the longest time
    the page may go without progress: the wait goes on, in slices, while the page
    changes (a DOM mutation, a response) or `progress()` does (the stack's logs, say),
    and fails (AssertionError) once neither did for that long. A loaded machine makes
    the page slow, not stuck. Wrap the page before its first `goto`, so its DOM changes are counted.
    Everything else is the page's own (its actions keep Playwright's default timeout:
    they act on what a wait found)."""

    SLICE_MS = 2_000

    def __init__(self, page: Any, progress: Callable[[], object] | None = None) -> None:
        self._page, self._progress, self._responses = page, progress, 0
        page.add_init_script(_COUNT_MUTATIONS)
        page.on("response", self._count)

    def _count(self, _response: Any) -> None:
        self._responses += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._page, name)

    def _state(self) -> tuple[object, ...]:
        from playwright.sync_api import Error
        try:
            mutations = self._page.evaluate("window.__threadlineMutations ?? 0")
        except Error:  # navigating: no context to ask right now
            mutations = None
        return mutations, self._responses, None if self._progress is None else self._progress()

    def _patiently(self, wait: Callable[[float], T], timeout: float) -> T:
        """`wait` in slices, for as long as `streams.testing.process.wait_for` waits
        on the page's progress (AssertionError after `timeout` ms without any)."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        def done() -> tuple[T] | None:  # a tuple: a wait may return None (state="hidden")
            try:
                return (wait(min(self.SLICE_MS, timeout)),)
            except PlaywrightTimeout:
                return None
        found = wait_for(done, timeout / 1000, interval=0, progress=self._state)
        assert found is not None  # wait_for returns a true value
        return found[0]

    def wait_for_function(self, expression: str, *, timeout: float = 30_000,
                          **options: Any) -> Any:
        """`Page.wait_for_function`, `timeout` ms without progress at most."""
        return self._patiently(lambda ms: self._page.wait_for_function(
            expression, timeout=ms, **options), timeout)

    def wait_for_selector(self, selector: str, *, timeout: float = 30_000, **options: Any) -> Any:
        """`Page.wait_for_selector`, `timeout` ms without progress at most."""
        return self._patiently(lambda ms: self._page.wait_for_selector(
            selector, timeout=ms, **options), timeout)


@contextlib.contextmanager
def launched() -> Iterator[Any]:
    """Debian's Chromium, headless, launched through Playwright; closed after."""
    from playwright.sync_api import sync_playwright  # only where a module got past its skip
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium(), args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def app_on_its_own_origin(entry: str, title: str, site: Path) -> Iterator[str]:
    """A test app (`entry`, a JSX file under tests/node) bundled with the pinned esbuild
    into `site` with an index page, served from an origin of its own (a port of
    127.0.0.1); yields the origin. The app reads `config.json` from it."""
    built = subprocess.run(
        [str(NODE_DIR / "node_modules" / ".bin" / "esbuild"), entry, "--bundle",
         "--format=esm", "--jsx=automatic", "--define:process.env.NODE_ENV=\"production\"",
         f"--outfile={site / 'app.js'}", "--log-level=warning"],
        cwd=NODE_DIR, capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    (site / "index.html").write_text(
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        '</head><body><div id="root"></div><script type="module" src="app.js"></script>'
        '</body></html>')
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def give_browser_token(site: Path, stack: ProcessStack, api_url: str) -> None:
    """Write the app's `config.json`: `api_url` and a tenant-wide browser token minted
    as the tenant's backend would (never the API key)."""
    status, token = stack.call("POST", "/v1/browser_tokens", {"ttl_s": 3600})
    assert status == 201, token
    (site / "config.json").write_text(json.dumps({"apiUrl": api_url, "token": token["token"]}))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass
