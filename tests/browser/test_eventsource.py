"""A real browser's EventSource (headless Chromium) watches a thread while the
gateway process is killed and restarted under it: every run arrives complete and
unbroken, with no repeated event. Skipped where Chromium or Playwright is absent."""

from __future__ import annotations

import collections
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.topics import ensure_topics
from streams.testing.process import RoleProcess, logs_of, wait_for
from tests.browser_kit import LAUNCH_ARGS, PatientPage, chromium

pytestmark = pytest.mark.kafka

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = chromium()


def _call(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        base + path, method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": "Bearer k1", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_a_browser_eventsource_sees_every_run_whole_across_gateway_restarts(
    test_env: dict[str, str], tmp_path: Path
) -> None:
    """A real browser's EventSource sees every run whole, with no repeats, across gateway restarts."""
    port = free_port()
    env = {**test_env, "THREADLINE_API_KEYS": "k1=tenant", "THREADLINE_HTTP_PORT": str(port),
           "THREADLINE_AGENT_TOKENS_PER_S": "40", "THREADLINE_AGENT_WORDS": "30"}
    ensure_topics(Settings.from_env(env))
    base = f"http://127.0.0.1:{port}"
    processor = RoleProcess("processor", env, tmp_path / "processor.log").start()
    worker = RoleProcess("worker", env, tmp_path / "worker.log").start()
    gateway = RoleProcess("gateway", env, tmp_path / "gateway.log").start()
    try:
        wait_for(lambda: _healthy(base), timeout=60, progress=logs_of(gateway.log))
        status, thread = _call(base, "POST", "/v1/threads", {"title": "browser"})
        assert status == 201
        thread_id = thread["thread_id"]
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
            page = PatientPage(browser.new_page(), logs_of(gateway.log))
            page.goto(f"{base}/demo#key=k1&thread={thread_id}")
            page.wait_for_function("window.threadline && window.threadline.opens >= 1", timeout=30_000)
            runs = []
            deltas = "window.threadline.events.filter(e => e.type === 'text_delta').length"
            for n in range(3):
                before = page.evaluate(deltas)
                status, accepted = _call(base, "POST", f"/v1/threads/{thread_id}/user_message",
                                         {"input_text": f"message {n}"})
                assert status == 202, accepted
                runs.append(accepted["run_id"])
                # Mid-stream: once the browser has this run's first token (not after a
                # 0.4 s sleep that may land before the run or after it), restart the
                # gateway under the browser.
                page.wait_for_function(f"{deltas} > {before}", timeout=60_000)
                gateway.kill9()
                gateway.start()
                wait_for(lambda: _healthy(base), timeout=60, progress=logs_of(gateway.log))
                page.wait_for_function(
                    f"window.threadline.events.filter(e => e.type === 'done').length >= {n + 1}",
                    timeout=60_000)
            events = page.evaluate("window.threadline.events")
            opens = page.evaluate("window.threadline.opens")
            browser.close()
        status, listing = _call(base, "GET", f"/v1/threads/{thread_id}/messages")
        assert status == 200
    finally:
        gateway.stop()
        worker.stop()
        processor.stop()

    assert opens >= 4, "the browser should have reconnected after each restart"
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), "an event reached the browser twice"
    by_run: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for event in events:
        data = json.loads(event["data"]) if event["data"] != "[DONE]" else {}
        by_run[data.get("run_id", (by_run and list(by_run)[-1]) or "")].append({**event, **data})
    answers = [m for m in listing["messages"] if m["role"] == "assistant"]
    assert [a["run_id"] for a in answers] == runs
    for run_id, answer in zip(runs, answers, strict=True):
        seen = by_run[run_id]
        kinds = [e["type"] for e in seen]
        assert kinds[0] == "run_accepted" and kinds[-1] == "done", kinds
        assert kinds.count("run_completed") == 1 and kinds.count("done") == 1
        streamed = "".join(e["delta"] for e in seen if e["type"] == "text_delta")
        assert streamed == answer["text"]


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=5) as response:
            return bool(response.status == 200)
    except Exception:
        return False
