"""Headless Chromium (Debian's package) drives the web console against the real stack,
with the gateway and the worker killed under it; axe-core (npm, pinned in tests/node)
checks every state at 1280x800 and 375x812, and the screenshots of each state
(`<n>-<state>-desktop.png`, `<n>-<state>-phone.png`; a few more at 1280x800 only) go
to a temp folder, or to docs/console/ with `make console-shots`
(THREADLINE_CONSOLE_SHOTS): a test run leaves the checkout as it found it.

One test per defect of issue #31, beside the original walk-through:

* the timeline's times are the records' own, equal before and after a reload, and a
  reload lists every run of the thread (`test_the_console_streams_resumes_and_stops`);
* on a phone, opening a thread shows the chat, back returns to the list, and the
  header covers nothing (`test_on_a_phone_opening_a_thread_shows_the_chat`);
* no stale message: "another run is active" goes with the Stop, "Signed in" (not "Not
  connected") after signing in, "1 message" while the first answer streams;
* a LangGraph thread is listed by its first message, not its UUID;
* an interrupt is answered from the console (`test_an_interrupt_is_answered_...`);
* a hostile answer runs nothing (`test_a_hostile_answer_runs_nothing`);
* the page's files, favicon included, load without a key.

Waits are for markers in the page (data-state attributes, the connection status,
what `window.threadlineConsole` saw) or on the server, never fixed sleeps; WAIT_MS is
only a backstop."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gateway.adapters.console.timeline import TIMELINE_EVENTS
from tests.browser_kit import PatientPage, chromium, launched
from tests.frontends.stack import KEY, ProcessStack, process_stack
from tests.npm_kit import node_modules

pytestmark = pytest.mark.kafka

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = chromium()

SHOTS = Path(os.environ.get("THREADLINE_CONSOLE_SHOTS") or tempfile.mkdtemp(prefix="console-shots-"))
WAIT_MS = 90_000
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 812}
TERMINAL = "'li.msg.assistant[data-state=completed], li.msg.assistant[data-state=failed], " \
           "li.msg.assistant[data-state=cancelled]'"


@pytest.fixture(scope="module")
def processes(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> \
        Iterator[ProcessStack]:
    """Processor, worker and gateway as processes (tests/frontends/stack.py)."""
    # Attempts enough for the worker killed below to come back on a loaded machine:
    # started again, it took 17 s once, and three attempts of 4 s heartbeat timeouts
    # and 0.5-1 s backoffs had timed out meanwhile, failing the run.
    with process_stack(kafka_bootstrap, tmp_path_factory.mktemp("console"),
                       THREADLINE_MAX_ATTEMPTS="8") as stack:
        yield stack


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium for the module; each test opens its own pages."""
    with launched() as chromium_browser:
        yield chromium_browser


@pytest.fixture(scope="module")
def axe_js() -> Path:
    """axe-core's script, pinned in tests/node."""
    return node_modules() / "axe-core" / "axe.min.js"


@dataclass
class Watch:
    """What a page did that it should not: script errors, console errors, dialogs, and
    the gateway's answers of 400 and above."""

    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def _page(browser: Any, base: str, viewport: dict[str, int] = DESKTOP, *,
          bypass_csp: bool = True) -> tuple[Any, Watch]:
    """A page in a fresh context (its own sessionStorage) and what it is watched for.
    bypass_csp only lets the test inject axe-core; the hostile-answer test also reads
    the answer with the page's CSP on."""
    context = browser.new_context(viewport=viewport, bypass_csp=bypass_csp)
    page = PatientPage(context.new_page())
    watch = Watch()
    page.on("pageerror", lambda exc: watch.page_errors.append(str(exc)))
    page.on("console", lambda m: watch.console_errors.append(m.text) if m.type == "error" else None)

    def dialog(d: Any) -> None:
        watch.dialogs.append(f"{d.type}: {d.message}")
        d.dismiss()

    page.on("dialog", dialog)
    page.on("response", lambda r: watch.failed.append(f"{r.status} {r.url}")
            if r.status >= 400 and r.url.startswith(base) else None)
    return page, watch


def _sign_in(page: Any, base: str, thread_id: str | None = None) -> None:
    page.goto(f"{base}/console" + (f"#thread={thread_id}" if thread_id else ""))
    page.wait_for_selector("#key-form", state="visible")
    page.fill("#key", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#connection[data-state=ready], #connection[data-state=live]",
                           timeout=WAIT_MS)


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


def _newest_answer_state(page: Any) -> str:
    return str(page.evaluate("[...document.querySelectorAll('li.msg.assistant')].pop().dataset.state"))


def _send(page: Any, text: str) -> str:
    """Send a message; the run id of its answer once the stream names it."""
    before = page.evaluate("document.querySelectorAll('li.msg.assistant').length")
    page.fill("#input", text)
    page.click("#send-button")
    page.wait_for_function(
        f"document.querySelectorAll('li.msg.assistant').length > {before}", timeout=WAIT_MS)
    return str(page.evaluate(
        "[...document.querySelectorAll('li.msg.assistant')].pop().dataset.runId"))


def _wait_done(page: Any, run_id: str, state: str = "completed") -> None:
    page.wait_for_selector(f"li.msg.assistant[data-run-id='{run_id}'][data-state={state}]",
                           timeout=WAIT_MS)


def _axe(page: Any, axe_js: Path) -> list[dict[str, Any]]:
    """axe-core's violations on the page as it is, of every impact."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(axe_js))
    return list(page.evaluate("axe.run(document).then(r => r.violations.map(v => "
                              "({id: v.id, impact: v.impact, help: v.help, "
                              "nodes: v.nodes.map(n => n.target.join(' '))})))"))


def _shots(page: Any, name: str, axe_js: Path, show: str | None = None,
           block: str = "end") -> None:
    """The state at 1280x800 and at 375x812: no axe violation, no sideways scroll, and
    a screenshot of what the viewport shows (`show`, if given, scrolled into view as
    a person would). Back to 1280x800 after."""
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(size)
        page.evaluate("document.querySelector('#threads').scrollTop = 0")
        if show:
            page.evaluate(f"document.querySelector({json.dumps(show)})"
                          f".scrollIntoView({{block: {json.dumps(block)}}})")
        assert page.evaluate("document.documentElement.scrollWidth") <= size["width"], label
        assert _axe(page, axe_js) == [], (name, label)
        page.screenshot(path=str(SHOTS / f"{name}-{label}.png"))
    page.set_viewport_size(DESKTOP)


def _shot(page: Any, name: str) -> None:
    page.screenshot(path=str(SHOTS / name))


def _stored_answers(processes: ProcessStack, thread_id: str) -> dict[str, str]:
    status, listing = processes.call("GET", f"/v1/threads/{thread_id}/messages")
    assert status == 200
    return {m["run_id"]: m["text"] for m in listing["messages"] if m["role"] == "assistant"}


def _timeline(page: Any) -> list[list[str]]:
    """Each run of the timeline: its id, then each entry's datetime and text."""
    return list(page.evaluate(
        "[...document.querySelectorAll('#timeline li.run')].map(run => [run.dataset.runId, "
        "...[...run.querySelectorAll('li[data-seq]')].map(li => "
        "li.querySelector('time').dateTime + ' | ' + li.textContent)])"))


def _thread_meta(page: Any, thread_id: str) -> str:
    return str(page.evaluate(
        f"document.querySelector('#thread-list button[data-thread-id=\"{thread_id}\"] "
        ".thread-meta').textContent"))


def _wait_idle(processes: ProcessStack, thread_id: str) -> None:
    """Until the thread has no active run (a server marker; 90 s is only a backstop)."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        status, thread = processes.call("GET", f"/v1/threads/{thread_id}")
        if status == 200 and thread["active_run"] is None and thread["last_run"] is not None:
            return
        time.sleep(0.2)
    raise AssertionError(f"thread {thread_id} still has an active run")


def _run(processes: ProcessStack, title: str, *messages: str) -> str:
    """A thread made over the API with each message answered in turn."""
    status, created = processes.call("POST", "/v1/threads", {"title": title})
    assert status == 201, created
    thread_id = str(created["thread_id"])
    for text in messages:
        status, posted = processes.call("POST", f"/v1/threads/{thread_id}/user_message",
                                        {"input_text": text})
        assert status == 202, posted
        _wait_idle(processes, thread_id)
    return thread_id


@contextlib.contextmanager
def _driven(page: Any, processes: ProcessStack, failure: str) -> Iterator[None]:
    """On an exception: a screenshot (SHOTS/<failure>, its path printed) and the roles' logs."""
    try:
        yield
    except Exception:
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / failure))
        print(f"screenshot: {SHOTS / failure}")
        print(processes.logs())
        raise


def test_the_console_streams_resumes_and_stops_in_a_real_browser(
        processes: ProcessStack, browser: Any, axe_js: Path) -> None:
    """Sign in, page threads, a LangGraph thread listed by its first message, create a
    thread, answers streamed across a gateway kill and a worker kill, a stop that clears
    the conflict it answers, Markdown with tool steps and sources, a failed run; then a
    reload shows every run with the same times."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for n in range(11):  # one page more than the console's page of 10
        assert processes.call("POST", "/v1/threads", {"title": f"older thread {n}"})[0] == 201
    # A thread made over the LangGraph API: its stored title is the client's id (a UUID).
    status, lg_thread = processes.call("POST", "/langgraph/threads", {})
    assert status == 200, lg_thread
    lg_id = lg_thread["thread_id"]
    status, _ = processes.call("POST", f"/langgraph/threads/{lg_id}/runs/wait", {
        "assistant_id": "agent",
        "input": {"messages": [{"role": "user", "content": "A question asked over LangGraph"}]}})
    assert status == 200
    page, watch = _page(browser, processes.base)
    with _driven(page, processes, "failure.png"):
        _drive(page, watch, processes, axe_js, lg_id)
    assert watch.page_errors == [], watch.page_errors
    page.context.close()


def _drive(page: Any, watch: Watch, processes: ProcessStack, axe_js: Path, lg_id: str) -> None:
    page.goto(f"{processes.base}/console")
    page.wait_for_selector("#key-form", state="visible")
    page.wait_for_load_state("load")
    # Its files and the favicon loaded without a key: no 401, nothing in the console.
    assert page.evaluate("fetch('/favicon.ico').then(r => r.status)") == 204
    assert watch.failed == [] and watch.console_errors == [], (watch.failed, watch.console_errors)
    assert page.evaluate("typeof marked === 'object' && typeof DOMPurify === 'function'")
    _shots(page, "1-sign-in", axe_js)

    page.fill("#key", KEY)
    page.click("#key-form button[type=submit]")
    page.wait_for_selector("#workspace", state="visible")
    # Signed in with no thread open: the status says so ("Not connected" was untrue).
    page.wait_for_selector("#connection[data-state=ready]", timeout=WAIT_MS)
    assert page.inner_text("#connection") == "Signed in"
    assert page.evaluate("sessionStorage.getItem('threadline.key')") == KEY
    page.reload()  # the key is kept for the session: no second sign-in
    page.wait_for_selector("#thread-list li", timeout=WAIT_MS)
    assert page.inner_text("#connection") == "Signed in"
    assert page.is_visible("#more-threads")
    page.click("#more-threads")
    page.wait_for_function("document.querySelectorAll('#thread-list li').length >= 12",
                           timeout=WAIT_MS)
    threads = page.inner_text("#thread-list")
    assert "A question asked over LangGraph" in threads and lg_id not in threads, threads
    assert "older thread 0" in threads
    _shots(page, "2-threads", axe_js)

    page.fill("#title", "console test")
    page.click("#new-thread button[type=submit]")
    page.wait_for_selector("#connection[data-state=live]", timeout=WAIT_MS)
    thread_id = page.evaluate("new URLSearchParams(location.hash.slice(1)).get('thread')")
    assert _thread_meta(page, thread_id).startswith("0 messages ·")

    # The first answer streams: the list counts its message ("1 message", singular).
    first = _send(page, "[slow] hello console")
    _wait_streaming_text(page)
    page.wait_for_function(
        f"document.querySelector('#thread-list button[data-thread-id=\"{thread_id}\"] "
        ".thread-meta').textContent.startsWith('1 message ·')", timeout=WAIT_MS)
    assert _newest_answer_state(page) == "streaming", "the count came only after the answer"
    _shots(page, "3-streaming", axe_js, show="li.msg.assistant:last-child")
    # A message while it streams is refused; Stop ends the run and the refusal's
    # message with it.
    assert _newest_answer_state(page) == "streaming", "the answer ended during the screenshots"
    page.fill("#input", "a message too soon")
    page.click("#send-button")
    page.wait_for_function("document.querySelector('#send-error').textContent"
                           ".includes('another run is active')", timeout=WAIT_MS)
    assert page.is_visible("#send-error")
    page.click("#stop")
    _wait_done(page, first, "cancelled")
    page.wait_for_function("document.querySelector('#send-error').textContent === ''",
                           timeout=WAIT_MS)
    assert not page.is_visible("#send-error")
    _shot(page, "9-stopped.png")
    page.fill("#input", "")

    # The second answer across a gateway kill -9 and restart.
    second = _send(page, "[slow] a second question")
    _wait_streaming_text(page)
    processes.gateway.kill9()
    page.wait_for_selector("#connection[data-state=reconnecting]", timeout=WAIT_MS)
    _shot(page, "7-reconnecting.png")
    processes.restart(processes.gateway)
    page.wait_for_selector("#connection[data-state=live]", timeout=WAIT_MS)
    _wait_done(page, second)

    # The worker killed mid-answer and away long enough for its heartbeats to time out
    # (a worker restarted at once takes its dispatch back, same attempt): the attempt
    # is rescheduled, the answer starts over and ends equal to the stored one.
    third = _send(page, "[slow] a third question, through a worker crash")
    _wait_streaming_text(page)
    page.wait_for_function("document.querySelector('#liveness').textContent.includes('heartbeat')",
                           timeout=WAIT_MS)
    processes.worker.kill9()
    page.wait_for_function("document.querySelector('#timeline').textContent.includes('retry scheduled')",
                           timeout=WAIT_MS)
    processes.worker.start()
    # Attempt 2, or a later one when the worker took longer to start again than an
    # attempt's heartbeat timeout (4 s here; seen under load).
    page.wait_for_function(
        "/Attempt [2-8]\\b/.test(document.querySelector('#liveness').textContent)",
        timeout=WAIT_MS)
    _shot(page, "8-worker-retry.png")
    _wait_done(page, third)

    # Markdown, rendered; tool steps and sources collapsed until opened.
    fourth = _send(page, "Please **summarize** the `offsets`:\n\n- first point\n- second point\n\n"
                         "> a quote\n\nThanks")
    _wait_done(page, fourth)
    answer = f"li.msg.assistant[data-run-id='{fourth}']"
    assert page.inner_text(f"{answer} .text strong") == "summarize"
    assert page.inner_text(f"{answer} .text code") == "offsets"
    assert page.evaluate(f"document.querySelectorAll(\"{answer} .text li\").length") == 2
    assert page.evaluate(f"[...document.querySelectorAll(\"{answer} details\")].map(d => d.open)") \
        == [False, False]
    assert not page.is_visible(f"{answer} details.steps pre")
    page.click(f"{answer} details.steps summary")
    page.click(f"{answer} details.sources summary")
    assert "Called search" in page.inner_text(f"{answer} details.steps")
    assert "example.com" in page.inner_text(f"{answer} details.sources")
    _shots(page, "5-done", axe_js, show=answer, block="start")

    # A run that fails shows why, in the answer and the timeline.
    fifth = _send(page, "[fail-fatal] this question fails")
    _wait_done(page, fifth, "failed")
    assert "[fail-fatal] requested" in page.inner_text(f"li.msg.assistant[data-run-id='{fifth}']")
    _shots(page, "6-error", axe_js, show=f"li.msg.assistant[data-run-id='{fifth}']")

    seen = page.evaluate("window.threadlineConsole")
    ids = [e["id"] for e in seen["events"]]
    assert len(ids) == len(set(ids)), "an event reached the console twice"
    assert seen["opens"] >= 2, "the console should have reconnected after the gateway kill"
    stored = _stored_answers(processes, thread_id)
    for run_id in (second, third, fourth):
        finished = seen["finished"][run_id]
        assert finished["state"] == "completed"
        assert finished["streamed"] == finished["stored"] == stored[run_id]
    assert seen["finished"][first]["state"] == "cancelled"
    assert seen["finished"][fifth]["state"] == "failed"
    # The second answer across the gateway kill: each of its deltas exactly once.
    deltas = [e for e in seen["events"] if e["type"] == "text_delta" and e["run_id"] == second]
    assert len(deltas) == len({e["id"] for e in deltas}) > 0
    text = page.inner_text("#timeline")
    for marker in ("accepted", "dispatched", "started", "retry scheduled", "started over",
                   "completed", "cancelled", "failed"):
        assert marker in text, (marker, text)
    runs = [first, second, third, fourth, fifth]

    # A reload: every run is listed again, each entry at the same time (the record's).
    before = _timeline(page)
    assert [r[0] for r in before] == runs
    page.reload()
    page.wait_for_function(
        f"document.querySelectorAll('#timeline li.run').length >= {len(runs)} && "
        "[...document.querySelectorAll('#timeline li.run')].every(r => "
        "r.querySelector('li[data-event^=run_c], li[data-event=run_failed]'))", timeout=WAIT_MS)
    after = _timeline(page)
    assert after == before
    # The failed run's answer says so after the reload too.
    page.wait_for_selector(f"li.msg.assistant[data-run-id='{fifth}'][data-state=failed]",
                           timeout=WAIT_MS)
    page.wait_for_function(
        f"document.querySelector(\"li.msg.assistant[data-run-id='{fifth}'] .run-state\")"
        ".textContent.includes('[fail-fatal] requested')", timeout=WAIT_MS)
    status, thread = processes.call("GET", f"/v1/threads/{thread_id}")
    assert status == 200
    count = thread["message_count"]
    assert _thread_meta(page, thread_id).startswith(f"{count} messages ·")


def test_on_a_phone_opening_a_thread_shows_the_chat(processes: ProcessStack, browser: Any,
                                                     axe_js: Path) -> None:
    """At 375x812: the list, a tap opens the chat (the list gone, the chat at the top,
    nothing under the header), back (the page's button, then the browser's) returns
    to the list."""
    thread_id = _run(processes, "on a phone", "hello from a phone", "and a second message")
    page, watch = _page(browser, processes.base, PHONE)
    with _driven(page, processes, "failure-phone.png"):
        _sign_in(page, processes.base)
        button = f"#thread-list button[data-thread-id='{thread_id}']"
        page.wait_for_selector(button, timeout=WAIT_MS)
        assert page.is_visible("#threads") and not page.is_visible("#chat")
        for back in ("button", "browser"):
            page.click(button)
            page.wait_for_selector("#chat", state="visible", timeout=WAIT_MS)
            _wait_answers(page, "completed", 2)
            assert not page.is_visible("#threads")
            assert page.inner_text("#chat-title") == "on a phone"
            assert page.evaluate("document.activeElement.id") == "chat-title"
            _assert_uncovered(page, ["#chat-title", "li.msg.user"])
            page.evaluate("document.querySelector('#send-button').scrollIntoView({block: 'end'})")
            _assert_uncovered(page, ["#send-button", "#input"])
            assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
            assert _axe(page, axe_js) == []
            if back == "button":
                page.click("#back")
            else:
                page.go_back()
            page.wait_for_selector("#threads", state="visible", timeout=WAIT_MS)
            assert not page.is_visible("#chat")
            assert page.evaluate("location.hash") == ""
    assert watch.page_errors == [], watch.page_errors
    page.context.close()


def _assert_uncovered(page: Any, selectors: list[str]) -> None:
    """The page itself never scrolls, the header sits above the scrolling main, and the
    point at the middle of each element is that element's (nothing lies over it)."""
    geometry = page.evaluate(
        "(() => { const h = document.querySelector('header.top').getBoundingClientRect();"
        " const m = document.querySelector('main').getBoundingClientRect();"
        " return {header: h.bottom, height: h.height, main: m.top,"
        " page: document.scrollingElement.scrollHeight, view: innerHeight}; })()")
    assert geometry["header"] <= geometry["main"] + 0.5, geometry
    assert geometry["height"] <= 60, geometry  # one line, not ~100 px
    assert geometry["page"] <= geometry["view"], geometry
    for selector in selectors:
        hit = page.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " const r = e.getBoundingClientRect();"
            " if (r.bottom <= 0 || r.top >= innerHeight) return 'off screen';"
            " const top = Math.max(r.top, 0), bottom = Math.min(r.bottom, innerHeight);"
            " const at = document.elementFromPoint(r.left + Math.min(r.width / 2, 20),"
            " (top + bottom) / 2);"
            " return e.contains(at) ? 'ok' : (at ? at.outerHTML.slice(0, 80) : 'nothing'); })()")
        assert hit == "ok", (selector, hit)


def test_an_interrupt_is_answered_from_the_console(processes: ProcessStack, browser: Any,
                                                   axe_js: Path) -> None:
    """The builtin agent asks before answering a message with [approve]: the console
    shows the question and a form, which survives a reload; a value typed there, Approve
    and Reject each resume the run, which goes on on screen and ends with that value."""
    page, watch = _page(browser, processes.base)
    with _driven(page, processes, "failure-interrupt.png"):
        _sign_in(page, processes.base)
        page.fill("#title", "approvals")
        page.click("#new-thread button[type=submit]")
        page.wait_for_selector("#connection[data-state=live]", timeout=WAIT_MS)
        thread_id = page.evaluate("new URLSearchParams(location.hash.slice(1)).get('thread')")
        run_id = _send(page, "[approve] May I ship the release?")
        form = f"li.msg.assistant[data-run-id='{run_id}'] form.interrupt"
        page.wait_for_selector(form, state="visible", timeout=WAIT_MS)
        assert "May I answer '[approve] May I ship the release?'?" in page.inner_text(form)
        assert page.inner_text("#timeline").count("interrupted: the agent asks") == 1
        _shots(page, "4-interrupted", axe_js, show=form)
        page.reload()  # the question is still there: it is the run's state, not the tab's
        page.wait_for_selector(form, state="visible", timeout=WAIT_MS)
        page.fill(f"{form} input[name=value]", "ship it on Monday")
        page.click(f"{form} button[type=submit]")
        _wait_done(page, run_id)
        assert not page.is_visible(form)
        shown = page.inner_text(f"li.msg.assistant[data-run-id='{run_id}'] .text")
        assert "Approved: ship it on Monday." in shown
        assert "dispatched again" in page.inner_text("#timeline")
        stored = _stored_answers(processes, thread_id)
        assert stored[run_id].endswith("Approved: ship it on Monday.")
        for button, value in (("Approve", "True"), ("Reject", "False")):
            run_id = _send(page, f"[approve] and now {button}?")
            form = f"li.msg.assistant[data-run-id='{run_id}'] form.interrupt"
            page.wait_for_selector(form, state="visible", timeout=WAIT_MS)
            page.click(f"{form} button:text-is('{button}')")
            _wait_done(page, run_id)
            assert _stored_answers(processes, thread_id)[run_id].endswith(f"Approved: {value}.")
        resumed = page.evaluate("window.threadlineConsole.resumed")  # since the reload
        assert [r["value"] for r in resumed] == ["ship it on Monday", True, False]
    assert watch.page_errors == [], watch.page_errors
    page.context.close()


# The builtin agent echoes the message ("You said: <message>."), so a message carries
# the hostile answer: a script, an event handler, javascript: links (Markdown and
# HTML), an image whose error handler would run. Inline, not at a line's start, so
# Markdown makes a link of the first one.
HOSTILE = ("look: [click me](javascript:alert('md-link')) and "
           "<a href=\"javascript:alert('html-link')\">or me</a> and "
           "<img src=x onerror=\"alert('onerror')\"> and "
           "<script>window.pwned = true; alert('script')</script> and "
           "<b onmouseover=\"alert('hover')\">hover me</b>")


def test_a_hostile_answer_runs_nothing(processes: ProcessStack, browser: Any) -> None:
    """The answer holding a script, handlers and javascript: links runs no script: no
    dialog, no console error (a CSP violation would log one), nothing left in the DOM
    that could run; with the page's CSP bypassed (the sanitizer alone) and with it on."""
    thread_id = _run(processes, "hostile", HOSTILE)
    stored = _stored_answers(processes, thread_id)
    assert any("<script>" in text for text in stored.values())
    for bypass_csp in (True, False):
        page, watch = _page(browser, processes.base, bypass_csp=bypass_csp)
        with _driven(page, processes, "failure-hostile.png"):
            _sign_in(page, processes.base, thread_id)
            page.wait_for_selector("li.msg.assistant[data-state=completed] .text a",
                                   timeout=WAIT_MS)
            answer = "li.msg.assistant[data-state=completed] .text"
            dangerous = page.evaluate(
                f"(() => {{ const t = document.querySelector({json.dumps(answer)});"
                " return [...t.querySelectorAll('*')].flatMap(e => ["
                " e.tagName === 'SCRIPT' || e.tagName === 'IMG' ? e.tagName : null,"
                " ...[...e.attributes].map(a => /^on/i.test(a.name) || "
                " /^\\s*javascript:/i.test(a.value) ? e.tagName + ' ' + a.name + '=' + a.value"
                " : null)]).filter(Boolean); })()")
            assert dangerous == [], dangerous
            shown = page.inner_text(answer)
            assert "click me" in shown and "<script>" in shown  # shown as text, not run
            page.click(f"{answer} a")  # the Markdown link, its href removed
            page.hover(f"{answer}")
            page.evaluate("1")  # a round trip: a dialog from the click would be in by now
            assert page.evaluate("window.pwned") is None
            user = page.inner_text("li.msg.user .text")
            assert user.startswith("look: [click me](javascript:")  # the message, as typed
        assert watch.dialogs == [], watch.dialogs
        assert watch.console_errors == [], (bypass_csp, watch.console_errors)
        assert watch.page_errors == [], watch.page_errors
        page.context.close()


def test_the_runs_history_is_every_ended_run_with_its_records_times(
        processes: ProcessStack) -> None:
    """GET /v1/console/threads/{id}/runs: the runs that ended, oldest first, each entry
    the same event, id and time as the run's own SSE stream; an untitled thread is
    titled by its first message."""
    thread_id = _run(processes, "", "first message of an untitled thread", "[fail-fatal] two")
    status, thread = processes.call("GET", f"/v1/threads/{thread_id}")
    assert status == 200 and thread["title"] == ""
    assert thread["display_title"] == "first message of an untitled thread"
    status, history = processes.call("GET", f"/v1/console/threads/{thread_id}/runs")
    assert status == 200
    assert [r["status"] for r in history["runs"]] == ["completed", "failed"]
    assert history["more"] is False
    for run in history["runs"]:
        assert run["retained"] is True
        stream = [(name, data) for name, data in
                  processes.events(f"/v1/runs/{run['run_id']}/events")
                  if name in TIMELINE_EVENTS]
        assert [(e["event"], e["seq"], e["ts"]) for e in run["events"]] == \
            [(name, data["seq"], data["ts"]) for name, data in stream]
        assert run["events"][0]["event"] == "run_accepted"
        assert run["events"][-1]["event"] == f"run_{run['status']}"
    status, one = processes.call("GET", f"/v1/console/threads/{thread_id}/runs?limit=1")
    assert status == 200 and [r["status"] for r in one["runs"]] == ["failed"] and one["more"]
    assert processes.call("GET", f"/v1/console/threads/{thread_id}/runs?limit=0")[0] == 400
