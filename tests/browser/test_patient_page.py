"""The browser tests' page waits (`tests.browser_kit.PatientPage`): bounded by the
page's progress, not by the clock. Skipped where Chromium or Playwright is absent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from tests.browser_kit import PatientPage, chromium, launched

playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
chromium()

# A page that changes its DOM every 50 ms, 60 times, then says it is done.
BUSY = """<ul id="log"></ul><script>
let n = 0;
const tick = setInterval(() => {
  document.getElementById("log").append(document.createElement("li"));
  if (++n === 60) { clearInterval(tick); window.finished = true; }
}, 50);
</script>"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium for the module."""
    with launched() as chromium_browser:
        yield chromium_browser


def test_a_page_that_keeps_changing_is_waited_for_past_the_timeout(browser: Any) -> None:
    """A wait whose page changes all along goes on past `timeout` (here a third of the
    page's 3 s of work, more on a loaded machine), until the condition holds."""
    page = PatientPage(browser.new_page())
    try:
        page.goto("data:text/html," + quote(BUSY))  # a navigation: counted from its start
        page.wait_for_function("window.finished === true", timeout=1000)
        assert page.evaluate("document.querySelectorAll('#log li').length") == 60
    finally:
        page.close()


def test_a_page_that_does_nothing_fails_the_wait(browser: Any) -> None:
    """A page with no change, no response and no outside progress fails the wait once
    `timeout` passed without any."""
    page = PatientPage(browser.new_page())
    try:
        page.goto("data:text/html,<p>still</p>")
        with pytest.raises(AssertionError, match="no progress"):
            page.wait_for_selector("#never", timeout=300)
    finally:
        page.close()


def test_outside_progress_keeps_a_quiet_page_waited_for(browser: Any) -> None:
    """A quiet page is waited for while `progress()` moves (the stack at work), and
    the wait fails once it stops."""
    ticks = iter(range(4))
    page = PatientPage(browser.new_page(), progress=lambda: next(ticks, "stopped"))
    try:
        page.goto("data:text/html,<p>still</p>")
        with pytest.raises(AssertionError, match="no progress"):
            page.wait_for_selector("#never", timeout=300)
        assert next(ticks, "used") == "used"  # every tick was read: the wait went on through them
    finally:
        page.close()
