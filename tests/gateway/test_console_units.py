"""The web console's pure parts, without a broker: the display title rule
(gateway/model/titles.py), what the run timeline keeps of an event
(gateway/adapters/console/timeline.py), the console's files being public, and the
vendored libraries being the files their README names."""

from __future__ import annotations

import hashlib
import json
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.adapters.console import CONSOLE_PATHS, STATIC
from gateway.adapters.console.timeline import MAX_DETAIL_CHARS, TIMELINE_EVENTS, timeline_entry
from gateway.adapters.langgraph.views import internal_thread_id
from gateway.http.auth import is_public
from gateway.model.titles import MAX_DISPLAY_CHARS, UNTITLED, display_title, needs_message


def test_a_readable_title_is_kept() -> None:
    """A title a person gave is the title, whitespace folded."""
    assert display_title("printer", "my printer is on fire") == "printer"
    assert display_title("  two\n\twords  ") == "two words"
    assert not needs_message("printer")


@pytest.mark.parametrize("title", ["", "   ", str(uuid.uuid4()), str(uuid.uuid4()).upper(),
                                   uuid.uuid4().hex, "0123456789abcdef0123"],
                         # Fixed ids, not the random uuids: the same test ids in every
                         # collection (a failed case can be rerun by its id; pytest-xdist's
                         # workers must collect the same ids).
                         ids=["empty", "blank", "uuid4", "uuid4-upper", "uuid4-hex", "hex-20"])
def test_a_blank_or_bare_id_title_gives_way_to_the_first_message(title: str) -> None:
    """The LangGraph API keeps the client's thread id (a uuid4 by default) as the title;
    the native API may have none: the first message names the thread."""
    assert needs_message(title)
    assert display_title(title, "Where is my\n parcel?") == "Where is my parcel?"
    assert display_title(title, None) == UNTITLED
    assert display_title(title, " \n ") == UNTITLED


def test_a_langgraph_threads_title_is_its_client_id() -> None:
    """What the rule is for: a thread the LangGraph API made for `threads.create()`."""
    lg_id = str(uuid.uuid4())
    assert internal_thread_id("tenant", lg_id) != lg_id  # the title holds lg_id itself
    assert display_title(lg_id, "hello from langgraph") == "hello from langgraph"


def test_a_long_first_message_is_cut_at_a_word_with_an_ellipsis() -> None:
    """Bounded: at most MAX_DISPLAY_CHARS, cut at a word if one is near."""
    text = "word " * 100
    title = display_title("", text)
    assert len(title) <= MAX_DISPLAY_CHARS and title.endswith("word…")
    one_long_word = "x" * 500
    assert display_title("", one_long_word) == "x" * (MAX_DISPLAY_CHARS - 1) + "…"


def test_control_characters_are_dropped() -> None:
    """Escape sequences and invisible characters are not part of a title."""
    assert display_title("", "bell\x07 and\x1b[31m red\u200b") == "bell and[31m red"


@given(st.text(), st.one_of(st.none(), st.text()))
def test_a_display_title_is_bounded_one_line_and_never_empty(title: str,
                                                             first: str | None) -> None:
    """Whatever the title and the message: one line, not empty, bounded."""
    shown = display_title(title, first)
    assert 0 < len(shown) <= MAX_DISPLAY_CHARS
    assert shown == shown.strip() and "\n" not in shown and "  " not in shown


def test_the_timeline_keeps_lifecycle_events_and_leaves_the_answer_out() -> None:
    """Lifecycle events keep their run, attempt, time, id and detail; the answer's
    parts (and a terminal event's whole message) stay out."""
    data = {"thread_id": "t", "run_id": "r", "attempt": 2, "message_id": "m", "detail": "boom",
            "ts": "2026-01-01T00:00:00.000Z", "seq": "tok", "id": "m", "part_id": "p",
            "user_message_id": "u", "message": {"text": "the whole answer"}}
    entry = timeline_entry("run_failed", json.dumps(data).encode())
    assert entry == {"event": "run_failed", "run_id": "r", "attempt": 2, "ts": data["ts"],
                     "seq": "tok", "detail": "boom"}
    for name in ("text_delta", "text_start", "text_end", "step", "citations", "done"):
        assert timeline_entry(name, json.dumps(data)) is None
    assert "interrupt" in TIMELINE_EVENTS and "message_start" in TIMELINE_EVENTS


def test_a_long_detail_is_cut_but_an_interrupts_payload_is_whole() -> None:
    """A retry's reason is cut; an interrupt's payload is JSON the console parses."""
    long = "x" * (3 * MAX_DETAIL_CHARS)
    cut = timeline_entry("retry_scheduled", json.dumps({"run_id": "r", "detail": long}))
    assert cut is not None and len(cut["detail"]) == MAX_DETAIL_CHARS + 1
    payload = json.dumps({"question": long})
    whole = timeline_entry("interrupt", json.dumps({"run_id": "r", "detail": payload}))
    assert whole is not None and whole["detail"] == payload


def test_the_consoles_files_are_public_and_its_api_is_not() -> None:
    """The page and everything it loads answer without a key (a 401 on a script or the
    favicon would break the page or log an error); /v1/console needs one."""
    for path in CONSOLE_PATHS:
        assert is_public(path), path
    assert is_public("/favicon.ico")
    assert not is_public("/v1/console/threads/x/run")
    assert not is_public("/v1/threads")
    for name in ("index.html", "console.js", "console.css"):
        assert (STATIC / name).is_file()


def test_the_vendored_libraries_are_the_files_their_readme_names() -> None:
    """static/vendor/README.md's table: file, version, sha256; the file's own banner
    names the same version."""
    readme = (STATIC / "vendor" / "README.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| \[[^\]]+\]\([^)]+\) \| ([0-9.]+) \|.*\| `([0-9a-f]{64})` \|$",
                      readme, re.MULTILINE)
    assert {name for name, _, _ in rows} == {"marked.umd.js", "purify.min.js"}
    for name, version, digest in rows:
        body = (STATIC / "vendor" / name).read_bytes()
        assert hashlib.sha256(body).hexdigest() == digest, name
        assert f" {version} ".encode() in body[:400] or f"v{version} ".encode() in body[:400], name
        assert f"/console/vendor/{name}" in CONSOLE_PATHS
    for license_file in ("LICENSE-marked.txt", "LICENSE-dompurify.txt"):
        assert (STATIC / "vendor" / license_file).stat().st_size > 500
