"""A React chat on the AI SDK's `useChat` (`@ai-sdk/react` and `ai` 7, pinned in
tests/node), in headless Chromium, served from its own origin and calling the gateway's
`/v1/ai/chat` across origins with a browser token (never the API key).

The app is tests/node/ai_approval/app.jsx, bundled here with the pinned esbuild. The
agent's `confirm` tool asks a person (`[confirm]`: an interrupt inside a tool), which
the page shows as the SDK's tool approval: a question with Approve and Deny buttons
that call `addToolApprovalResponse`; `sendAutomaticallyWhen` sends the answer and the
run goes on in the same message. Approved: the run completes on screen with the
stored answer. A reload while the approval waits shows the same approval again
(`resume: true` replays the run), and Deny, clicked there, finishes the run too.

Skipped where Chromium, Playwright, node or npm is absent (failed under CI=true)."""

from __future__ import annotations

import json
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

# A backstop for one browser wait: each wait is for a marker on screen, and the run it
# waits on makes progress all along.
SCREEN_TIMEOUT_MS = 180_000

CONFIRM = '.tool[data-tool="confirm"]'


@dataclass
class ApprovalApp:
    """The app's origin and the stack behind it."""

    origin: str
    stack: ProcessStack

    def stored(self, chat_id: str) -> list[dict[str, Any]]:
        """The chat's stored messages (`UIMessage`s), once its run has ended."""
        def ended() -> list[dict[str, Any]]:
            status, body = self.stack.call("GET", f"/v1/ai/chat/{chat_id}/messages")
            assert status == 200, body
            messages: list[dict[str, Any]] = body["messages"]
            return messages if messages and messages[-1]["role"] == "assistant" else []

        return wait_for(ended, timeout=120, progress=self.progress)

    def progress(self) -> tuple[int, ...]:
        """Grows while the roles work (their logs)."""
        return self.stack.progress()


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApprovalApp]:
    """The bundled app on its own origin, allowed by the gateway's CORS setting, with a
    browser token in its config (as a backend would hand it out)."""
    node_modules()
    site = tmp_path_factory.mktemp("ai-approval-site")
    with app_on_its_own_origin("ai_approval/app.jsx", "Approvals", site) as origin, \
            process_stack(kafka_bootstrap, tmp_path_factory.mktemp("ai-approval"),
                          THREADLINE_CORS_ORIGINS=origin) as stack:
        give_browser_token(site, stack, stack.base)
        yield ApprovalApp(origin, stack)


@pytest.fixture
def browser(app: ApprovalApp) -> Iterator[Any]:
    """Debian's Chromium, headless, for one test."""
    with launched() as chromium_browser:
        yield chromium_browser


def _open(browser: Any, app: ApprovalApp, chat_id: str | None = None) -> Any:
    page: Any = PatientPage(browser.new_page(), app.progress)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app.origin + "/index.html" + (f"?chat={chat_id}" if chat_id else ""))
    page.wait_for_selector("form", timeout=SCREEN_TIMEOUT_MS)
    page.errors = errors
    return page


def _asks(page: Any) -> dict[str, str]:
    """Wait for the approval on screen, the response over: the question and the chat."""
    page.wait_for_selector(f'main[data-status="ready"] {CONFIRM}[data-state="approval-requested"]',
                           timeout=SCREEN_TIMEOUT_MS)
    return {"question": page.inner_text(f"{CONFIRM} .question"),
            "approval": str(page.eval_on_selector(CONFIRM, "t => t.dataset.approval")),
            "chat": str(page.eval_on_selector("main", "m => m.dataset.chat"))}


def _finishes(page: Any, app: ApprovalApp, chat_id: str) -> tuple[str, str, str]:
    """Wait for the run's end on screen: (the answer shown, the tool's output shown, the
    stored answer's text), the screen being equal to the store."""
    stored = app.stored(chat_id)
    text = "".join(p["text"] for p in stored[-1]["parts"] if p["type"] == "text")
    page.wait_for_function(
        """text => document.querySelector('main').dataset.status === 'ready' &&
             document.querySelector('#messages li.assistant:last-child p.text')?.textContent === text""",
        arg=text, timeout=SCREEN_TIMEOUT_MS)
    page.wait_for_selector(f'{CONFIRM}[data-state="output-available"]', timeout=SCREEN_TIMEOUT_MS)
    return (page.inner_text("#messages li.assistant:last-child p.text"),
            page.inner_text(f"{CONFIRM} .output"), text)


def test_approve_in_the_page_and_the_run_completes_on_screen(
        app: ApprovalApp, browser: Any) -> None:
    """The first response ends at the approval (the chat `ready`, the question shown);
    Approve sends the answer and the same message goes on to the stored answer, which
    used `{"approved": true, "reason": null}`."""
    page = _open(browser, app)
    page.fill("input[name=message]", "[tools=1] deploy it [confirm]")
    page.click("button[type=submit]")
    asked = _asks(page)
    assert asked["question"] == "May I deploy it?" and asked["approval"].endswith(":interrupt:1")
    page.click(f"{CONFIRM} button:text('Approve')")
    shown, output, stored = _finishes(page, app, asked["chat"])
    assert shown == stored and stored.endswith('Confirmed: {"approved": true, "reason": null}.')
    assert json.loads(output) == {"approved": True, "reason": None}
    assert page.eval_on_selector_all("#messages li", "items => items.map(li => li.className)") \
        == ["user", "assistant"]
    assert page.errors == []


def test_a_reload_shows_the_same_approval_and_deny_finishes_the_run(
        app: ApprovalApp, browser: Any) -> None:
    """Reloaded while the approval waits: the stored user message and the replayed run
    show the same approval again (question and id); Deny, clicked after the reload, resumes the run with
    `{"approved": false, "reason": ...}` and it completes on screen."""
    page = _open(browser, app)
    page.fill("input[name=message]", "deploy it [confirm]")
    page.click("button[type=submit]")
    asked = _asks(page)
    page.reload()
    assert _asks(page) == asked  # the same question, approval id and chat
    page.click(f"{CONFIRM} button:text('Deny')")
    shown, output, stored = _finishes(page, app, asked["chat"])
    assert shown == stored
    assert stored.endswith('Confirmed: {"approved": false, "reason": "not from the browser"}.')
    assert json.loads(output) == {"approved": False, "reason": "not from the browser"}
    assert page.errors == []
