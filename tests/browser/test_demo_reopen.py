"""The demo page in a real browser (headless Chromium) against a scripted server: where
EventSource gives up for good (an answer that is not a 200 stream, such as a proxy's
503 while every gateway is out), the page opens a new one from the last id it saw.
Skipped where Chromium or Playwright is absent."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest

from gateway.adapters.demo import PAGE
from tests.browser_kit import LAUNCH_ARGS, PatientPage, chromium

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = chromium()

# Each stream request in turn: a 503; one event, then the connection ends (EventSource
# reconnects by itself); a 503 again; the next event.
SCRIPT = [
    (503, b""),
    (200, b'retry: 100\n\nid: a1\nevent: text_delta\ndata: {"delta": "hello"}\n\n'),
    (503, b""),
    (200, b'id: a2\nevent: done\ndata: {}\n\n'),
]


class _Scripted(BaseHTTPRequestHandler):
    asked: ClassVar[list[tuple[dict[str, list[str]], str | None]]] = []

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def do_GET(self) -> None:
        """The page, or the next scripted answer to a stream request."""
        url = urlsplit(self.path)
        if url.path == "/demo":
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if not url.path.endswith("/stream"):
            self.send_error(404)
            return
        turn = len(self.asked)
        self.asked.append((parse_qs(url.query), self.headers.get("Last-Event-ID")))
        status, body = SCRIPT[turn] if turn < len(SCRIPT) else (503, b"")
        self.send_response(status)
        self.send_header("Content-Type", "text/event-stream" if status == 200 else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_the_demo_page_opens_a_new_eventsource_from_the_last_id_after_a_503() -> None:
    """Chromium's EventSource closes for good on each 503; the page opens a new one,
    the second time with `last_event_id` of the event it had; between, EventSource's
    own reconnect sends `Last-Event-ID`. Each event arrives once."""
    _Scripted.asked = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
            page = PatientPage(browser.new_page())
            page.goto(f"http://127.0.0.1:{server.server_port}/demo#key=k&thread=t1")
            page.wait_for_function(
                "window.threadline.events.some(e => e.type === 'done')", timeout=60_000)
            events = page.evaluate("window.threadline.events.map(e => e.id)")
            reopens = page.evaluate("window.threadline.reopens")
            browser.close()
    finally:
        server.shutdown()
    assert events == ["a1", "a2"]
    assert reopens == 2
    queries = [(q.get("last_event_id"), header) for q, header in _Scripted.asked[:4]]
    # 503; first stream; EventSource's own reconnect (header) got a 503; the page's
    # new one from the last id (query).
    assert queries == [(None, None), (None, None), (None, "a1"), (["a1"], None)], queries
