"""A React chat built on the LangGraph SDK's `useStream` hook
(`@langchain/langgraph-sdk/react`, pinned in tests/node), in headless Chromium, served
from its own origin and calling the gateway's LangGraph API across origins with a
browser token (never the API key).

The app is tests/node/react_chat/app.jsx, bundled here with the pinned esbuild. It
records what it showed, render by render (`window.screens`), so the test can say what
a person saw: a message streams; a reload in the middle of an answer rejoins the run
(`reconnectOnMount`) and nothing is shown twice; a second message sent while an answer
streams is enqueued on the server and answered after it; an interrupt shows as an
approval card, survives a reload, and approving it finishes the run. Each time the
screen ends equal to the stored thread.

Skipped where Chromium, Playwright, node or npm is absent (failed under CI=true)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from streams.testing.process import wait_for
from tests.browser_kit import (
    PatientPage,
    app_on_its_own_origin,
    chromium,
    give_browser_token,
    launched,
)
from tests.frontends.stack import ProcessStack, process_stack
from tests.npm_kit import node_modules

pytestmark = pytest.mark.kafka

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
CHROMIUM = chromium()

# A backstop for one browser wait: what each test waits for is a marker on screen or
# on the server, and the runs it waits on make progress all along.
SCREEN_TIMEOUT_MS = 180_000

@dataclass
class ChatApp:
    """The app's origin and the stack behind it."""

    origin: str
    stack: ProcessStack

    def thread(self, thread_id: str) -> dict[str, Any]:
        """The LangGraph view of the thread (its `status`)."""
        status, body = self.stack.call("GET", f"/langgraph/threads/{thread_id}")
        assert status == 200, body
        return dict(body)

    def stored(self, thread_id: str) -> list[tuple[str, str]]:
        """The stored thread's messages, as (type, text), once it is idle."""
        wait_for(lambda: self.thread(thread_id)["status"] == "idle", timeout=120,
                 progress=self.progress)
        return self.messages(thread_id)

    def messages(self, thread_id: str) -> list[tuple[str, str]]:
        """The thread's messages as its state has them now, as (type, text)."""
        status, state = self.stack.call("GET", f"/langgraph/threads/{thread_id}/state")
        assert status == 200, state
        return [(m["type"], _text(m)) for m in state["values"]["messages"]]

    def progress(self) -> tuple[int, ...]:
        """Grows while the roles work (their logs)."""
        return self.stack.progress()


def _text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChatApp]:
    """The bundled app on its own origin, allowed by the gateway's CORS setting, with a
    browser token in its config (as a backend would hand it out)."""
    node_modules()
    site = tmp_path_factory.mktemp("react-chat-site")
    with app_on_its_own_origin("react_chat/app.jsx", "Chat", site) as origin, \
            process_stack(kafka_bootstrap, tmp_path_factory.mktemp("react-chat"),
                          THREADLINE_CORS_ORIGINS=origin) as stack:
        give_browser_token(site, stack, stack.base + "/langgraph")
        yield ChatApp(origin, stack)


@pytest.fixture
def browser(app: ChatApp) -> Iterator[Any]:
    """Debian's Chromium, headless, for one test."""
    with launched() as chromium_browser:
        yield chromium_browser


def _open(browser: Any, app: ChatApp, thread_id: str | None = None) -> Any:
    page: Any = PatientPage(browser.new_page(), app.progress)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app.origin + "/index.html" + (f"?thread={thread_id}" if thread_id else ""))
    page.wait_for_selector("form", timeout=SCREEN_TIMEOUT_MS)
    page.errors = errors
    return page


def _send(page: Any, text: str) -> None:
    page.fill("input[name=message]", text)
    page.click("button[type=submit]")


def _thread_of(page: Any) -> str:
    page.wait_for_function("document.querySelector('main').dataset.thread !== ''",
                           timeout=SCREEN_TIMEOUT_MS)
    return str(page.eval_on_selector("main", "m => m.dataset.thread"))


def _screen(page: Any) -> list[tuple[str, str]]:
    return [(kind, text) for kind, text in page.eval_on_selector_all(
        "#messages li", "items => items.map(li => [li.className, li.textContent])")]


def _settles_on(page: Any, stored: list[tuple[str, str]]) -> None:
    """Wait until the page is idle and shows exactly the stored thread."""
    page.wait_for_function(
        """expected => document.querySelector('main').dataset.loading === 'false' &&
             JSON.stringify([...document.querySelectorAll('#messages li')].map(
               li => [li.className, li.textContent])) === JSON.stringify(expected)""",
        arg=[list(m) for m in stored], timeout=SCREEN_TIMEOUT_MS)


def test_a_message_streams_and_a_reload_in_the_middle_resumes_it(
        app: ChatApp, browser: Any) -> None:
    """Text shows before the reload and, rejoined, after it; at no render is any text
    shown that is not a prefix of the stored answer (so none twice); the screen ends
    equal to the stored thread."""
    page = _open(browser, app)
    _send(page, "[slow] tell me how a log works")
    thread_id = _thread_of(page)
    page.wait_for_function(  # a few words of the answer are on screen, and more to come
        """() => document.querySelector('main').dataset.loading === 'true' &&
                 (document.querySelector('#messages li.ai')?.textContent ?? '').split(' ').length > 6""",
        timeout=SCREEN_TIMEOUT_MS)
    before = page.evaluate("window.screens")
    page.reload()
    page.wait_for_selector("#messages li.ai", timeout=SCREEN_TIMEOUT_MS)
    stored = app.stored(thread_id)
    _settles_on(page, stored)
    after = page.evaluate("window.screens")
    answer = stored[-1][1]
    assert [kind for kind, _ in stored] == ["human", "ai"] and answer.startswith("You said:")
    shown_before = [s["ai"][0] for s in before if s["ai"] and s["ai"][0]]
    shown_after = [s["ai"][0] for s in after if s["ai"] and s["ai"][0]]
    assert any(s["loading"] and s["ai"] and s["ai"][0] for s in before), before
    # After the reload the app rejoined the run: a stream ran and showed text.
    assert any(s["loading"] and s["ai"] and s["ai"][0] for s in after), after
    assert all(answer.startswith(text) for text in shown_before + shown_after), \
        (answer, shown_before, shown_after)
    assert page.errors == []


def test_a_second_message_sent_while_an_answer_streams_is_enqueued(
        app: ChatApp, browser: Any) -> None:
    """From a second tab on the same thread, a message sent while the first answer
    streams is queued by the server (`multitaskStrategy: "enqueue"`, not a 409) and
    answered after it; both tabs end with the stored answers."""
    # Both tabs are open before the first question, so the second can send the moment
    # the first answer shows (well inside its seconds of streaming), not after a page
    # load that a loaded machine can stretch past the answer's end.
    status, created = app.stack.call("POST", "/langgraph/threads", {})
    assert status == 200, created
    thread_id = created["thread_id"]
    first, second = _open(browser, app, thread_id), _open(browser, app, thread_id)
    _send(first, "[slow] first question")
    first.wait_for_function(
        "(document.querySelector('#messages li.ai')?.textContent ?? '').length > 0",
        timeout=SCREEN_TIMEOUT_MS)
    assert app.thread(thread_id)["status"] == "busy"  # the first run is still answering
    _send(second, "second question")
    # Idle alone is not enough: the queued run may not have started when the first ended.
    wait_for(lambda: len(app.messages(thread_id)) == 4, timeout=120, progress=app.progress)
    stored = app.stored(thread_id)
    assert [kind for kind, _ in stored] == ["human", "ai", "human", "ai"]
    assert (stored[0][1], stored[2][1]) == ("[slow] first question", "second question")
    _settles_on(second, stored)
    first.wait_for_function("document.querySelector('main').dataset.loading === 'false'",
                            timeout=SCREEN_TIMEOUT_MS)
    assert _screen(first)[:2] == stored[:2]
    status, runs = app.stack.call("GET", f"/langgraph/threads/{thread_id}/runs")
    assert status == 200 and sorted(r["status"] for r in runs) == ["success", "success"], runs
    assert first.errors == [] and second.errors == []


def test_an_interrupt_is_an_approval_card_that_survives_a_reload_and_approves(
        app: ChatApp, browser: Any) -> None:
    """The agent asks; the card shows the question, and again after a reload (read from
    the server); Approve resumes the run, which ends with the value on screen."""
    page = _open(browser, app)
    _send(page, "[approve] deploy it")
    thread_id = _thread_of(page)
    page.wait_for_selector("#approval", timeout=SCREEN_TIMEOUT_MS)
    question = "May I answer '[approve] deploy it'?"
    assert page.text_content("#question") == question
    page.reload()
    page.wait_for_selector("#approval", timeout=SCREEN_TIMEOUT_MS)
    assert page.text_content("#question") == question
    assert app.thread(thread_id)["status"] == "interrupted"
    page.click("#approve")
    page.wait_for_selector("#approval", state="detached", timeout=SCREEN_TIMEOUT_MS)
    stored = app.stored(thread_id)
    assert [kind for kind, _ in stored] == ["human", "ai"]
    assert stored[-1][1].endswith("Approved: approved.")
    _settles_on(page, stored)
    assert page.errors == []


def test_the_app_holds_no_api_key(app: ChatApp) -> None:
    """What the browser is given is a browser token, not the tenant's key."""
    with urllib.request.urlopen(app.origin + "/config.json", timeout=30) as response:
        site_config = json.loads(response.read())
    assert site_config["token"].startswith("tlb1.")
    assert app.stack.env["THREADLINE_API_KEYS"].split("=")[0] not in json.dumps(site_config)

