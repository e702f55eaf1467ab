"""Headless Chromium (Debian's package) drives the web console against the real stack,
with the gateway and the worker killed under it; axe-core (npm, pinned in tests/node)
checks the page; a 375 px viewport has no horizontal scroll. Screenshots of each
state go to docs/console/.

Waits are for markers in the page (data-state attributes, the connection status,
what `window.threadlineConsole` saw), never fixed sleeps."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser_kit import chromium
from tests.frontends.stack import KEY, ProcessStack, process_stack
from tests.npm_kit import node_modules

pytestmark = pytest.mark.kafka

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = chromium()

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
WAIT_MS = 90_000


@pytest.fixture(scope="module")
def processes(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> \
        Iterator[ProcessStack]:
    """Processor, worker and gateway as processes (tests/frontends/stack.py)."""
    with process_stack(kafka_bootstrap, tmp_path_factory.mktemp("console")) as stack:
        yield stack


def _answers(page: Any, state: str) -> int:
    return int(page.evaluate(
        f"document.querySelectorAll('li.msg.assistant[data-state=\"{state}\"]').length"))


def _wait_answers(page: Any, state: str, count: int) -> None:
    page.wait_for_function(
        f"document.querySelectorAll('li.msg.assistant[data-state=\"{state}\"]').length >= {count}",
        timeout=WAIT_MS)


def _wait_streaming_text(page: Any) -> None:
    """The newest answer is streaming and shows some text."""
    page.wait_for_function(
        "(() => { const a = [...document.querySelectorAll('li.msg.assistant')].pop();"
        " return a && a.dataset.state === 'streaming' && a.querySelector('.text').textContent; })()",
        timeout=WAIT_MS)


def _send(page: Any, text: str) -> str:
    """Send a message; the run id of its answer once the stream names it."""
    before = page.evaluate("document.querySelectorAll('li.msg.assistant').length")
    page.fill("#input", text)
    page.click("#send-button")
    page.wait_for_function(
        f"document.querySelectorAll('li.msg.assistant').length > {before}", timeout=WAIT_MS)
    return str(page.evaluate(
        "[...document.querySelectorAll('li.msg.assistant')].pop().dataset.runId"))


def _shot(page: Any, name: str) -> None:
    """A full-page screenshot from the top (the sticky header where it belongs)."""
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(SHOTS / name), full_page=True)


def _axe(page: Any, axe_js: Path) -> list[dict[str, Any]]:
    """axe-core's serious and critical violations on the page as it is."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(axe_js))
    violations = page.evaluate("axe.run(document).then(r => r.violations.map(v => "
                               "({id: v.id, impact: v.impact, help: v.help, "
                               "nodes: v.nodes.map(n => n.target.join(' '))})))")
    return [v for v in violations if v["impact"] in ("serious", "critical")]


def _stored_answers(processes: ProcessStack, thread_id: str) -> dict[str, str]:
    status, listing = processes.call("GET", f"/v1/threads/{thread_id}/messages")
    assert status == 200
    return {m["run_id"]: m["text"] for m in listing["messages"] if m["role"] == "assistant"}


def test_the_console_streams_resumes_and_stops_in_a_real_browser(
        processes: ProcessStack) -> None:
    """Sign in, page threads, create a thread, two answers streamed, a gateway kill
    and a worker kill mid-answer, a stop; accessible, and narrow without scrolling."""
    axe_js = node_modules() / "axe-core" / "axe.min.js"
    SHOTS.mkdir(parents=True, exist_ok=True)
    for n in range(11):  # one page more than the console's page of 10
        assert processes.call("POST", "/v1/threads", {"title": f"older thread {n}"})[0] == 201
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        # bypass_csp: only so the test can inject axe-core; the page itself loads
        # nothing but its own three files.
        page = browser.new_page(viewport={"width": 1280, "height": 900}, bypass_csp=True)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            _drive(page, processes, axe_js)
        except Exception:
            _shot(page, "failure.png")
            print(processes.logs())
            raise
        finally:
            browser.close()
    assert errors == [], errors


def _drive(page: Any, processes: ProcessStack, axe_js: Path) -> None:
    page.goto(f"{processes.base}/console")
    page.wait_for_selector("#key-form", state="visible")
    assert _axe(page, axe_js) == []
    _shot(page, "01-sign-in.png")
    page.fill("#key", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#workspace", state="visible")
    assert page.evaluate("sessionStorage.getItem('threadline.key')") == KEY
    page.reload()  # the key is kept for the session: no second sign-in
    page.wait_for_selector("#thread-list li", timeout=WAIT_MS)
    assert page.is_visible("#more-threads")
    page.click("#more-threads")
    page.wait_for_function("document.querySelectorAll('#thread-list li').length >= 11",
                           timeout=WAIT_MS)

    page.fill("#title", "console test")
    page.click("#new-thread button[type=submit]")
    page.wait_for_selector("#connection[data-state=live]", timeout=WAIT_MS)
    thread_id = page.evaluate("new URLSearchParams(location.hash.slice(1)).get('thread')")

    # Two messages, both answers streamed: the first whole, the second across a
    # gateway kill -9 and restart.
    first = _send(page, "hello console")
    _wait_streaming_text(page)
    _shot(page, "02-streaming.png")
    _wait_answers(page, "completed", 1)
    second = _send(page, "[slow] a second question")
    _wait_streaming_text(page)
    processes.gateway.kill9()
    page.wait_for_selector("#connection[data-state=reconnecting]", timeout=WAIT_MS)
    _shot(page, "03-reconnecting.png")
    processes.restart(processes.gateway)
    page.wait_for_selector("#connection[data-state=live]", timeout=WAIT_MS)
    _wait_answers(page, "completed", 2)
    _shot(page, "04-resumed.png")

    # The worker killed mid-answer and away long enough for its heartbeats to time out
    # (a worker restarted at once takes its dispatch back, same attempt): the attempt
    # is rescheduled, the answer starts over and ends equal to the stored one.
    third = _send(page, "[slow] a third question, through a worker crash")
    _wait_streaming_text(page)
    processes.worker.kill9()
    page.wait_for_function("document.querySelector('#timeline').textContent.includes('retry scheduled')",
                           timeout=WAIT_MS)
    processes.worker.start()
    _wait_answers(page, "completed", 3)
    page.wait_for_function("document.querySelector('#timeline').textContent.includes('heartbeat')",
                           timeout=WAIT_MS)
    _shot(page, "05-worker-retry.png")

    # Stop.
    fourth = _send(page, "[slow] a fourth question, to stop")
    _wait_streaming_text(page)
    page.click("#stop")
    _wait_answers(page, "cancelled", 1)
    _shot(page, "06-stopped.png")
    assert _axe(page, axe_js) == []

    page.set_viewport_size({"width": 375, "height": 800})
    assert page.evaluate("document.documentElement.scrollWidth") <= 375
    assert _axe(page, axe_js) == []
    _shot(page, "07-narrow.png")

    seen = page.evaluate("window.threadlineConsole")
    ids = [e["id"] for e in seen["events"]]
    assert len(ids) == len(set(ids)), "an event reached the console twice"
    assert seen["opens"] >= 2, "the console should have reconnected after the gateway kill"
    stored = _stored_answers(processes, thread_id)
    assert set(stored) == {first, second, third}
    for run_id in (first, second, third):
        finished = seen["finished"][run_id]
        assert finished["state"] == "completed"
        assert finished["streamed"] == finished["stored"] == stored[run_id]
    assert seen["finished"][fourth]["state"] == "cancelled"
    timeline = page.inner_text("#timeline")
    for marker in ("accepted", "dispatched", "started", "retry scheduled", "heartbeat",
                   "completed", "cancelled"):
        assert marker in timeline, (marker, timeline)
    # The second answer across the gateway kill: each of its deltas exactly once.
    deltas = [e for e in seen["events"] if e["type"] == "text_delta" and e["run_id"] == second]
    assert len(deltas) == len({e["id"] for e in deltas}) > 0
