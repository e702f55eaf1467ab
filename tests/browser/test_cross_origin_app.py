"""A browser app on its own origin, in a real browser (headless Chromium): a page served
from an allowed origin calls the gateway with its key in `Authorization` (so the
browser sends a preflight first) and reads the answer; the same page from another
origin is refused by the browser, because the gateway does not allow that origin.
Skipped where Chromium or Playwright is absent (failed under CI=true)."""

from __future__ import annotations

import functools
import http.server
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess, wait_for
from tests.browser_kit import LAUNCH_ARGS, chromium

pytestmark = pytest.mark.kafka

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = chromium()

# The app: one page whose script calls the gateway with its key and records the outcome.
PAGE = """<!doctype html><title>app</title><script>
window.call = async (gateway) => {
  try {
    const r = await fetch(gateway + "/v1/threads", {headers: {Authorization: "Bearer k1"}});
    return {status: r.status, body: await r.json()};
  } catch (e) { return {error: String(e)}; }
};
</script>"""


@pytest.fixture
def app_origins(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The page served on two origins (two ports): the allowed one, and another."""
    (tmp_path / "index.html").write_text(PAGE)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        a, b = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
        yield a, b
    finally:
        for server in servers:
            server.shutdown()


def test_an_allowed_origin_reads_the_api_and_another_is_refused(
        test_env: dict[str, str], tmp_path: Path, app_origins: tuple[str, str]) -> None:
    """From the allowed origin the page reads the thread list (after a preflight); from
    the other the browser refuses the call, so the page learns nothing."""
    allowed, other = app_origins
    port = free_port()
    env = {**test_env, "THREADLINE_API_KEYS": "k1=tenant", "THREADLINE_HTTP_PORT": str(port),
           "THREADLINE_CORS_ORIGINS": allowed}
    ensure_topics(Settings.from_env(env))
    gateway_url = f"http://127.0.0.1:{port}"
    gateway = RoleProcess("gateway", env, tmp_path / "gateway.log").start()
    try:
        wait_for(lambda: _serving(gateway_url), timeout=60, progress=lambda: len(gateway.output()))
        outcomes: dict[str, Any] = {}
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
            try:
                for origin in (allowed, other):
                    page = browser.new_page()
                    page.goto(f"{origin}/index.html")
                    outcomes[origin] = page.evaluate("gateway => window.call(gateway)", gateway_url)
                    page.close()
            finally:
                browser.close()
    finally:
        gateway.stop()
    assert outcomes[allowed]["status"] == 200, (outcomes, gateway.tail())
    assert outcomes[allowed]["body"]["threads"] == []
    assert "error" in outcomes[other] and "Failed to fetch" in outcomes[other]["error"], outcomes


def _serving(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/livez", timeout=5) as response:
            return bool(response.status == 200 and b'"loaded": true' in response.read())
    except Exception:
        return False
