"""A thread's display title: what a person reads in a list of threads. Pure.

Every API creates threads, and not all give them a readable title: `POST /v1/threads`
may have none, the LangGraph API keeps the client's thread id in the title (usually a
UUID, `gateway.adapters.langgraph.views`). The stored title stays as it is (the
LangGraph API reads its ids back from it); `display_title` is derived at read time
(`GET /v1/threads`, `GET /v1/threads/{id}`: `display_title`):

1. the title, if it is readable: not blank and not a bare id (a UUID, or 16 or more
   hex digits with or without dashes);
2. else the thread's first message (the first user message, as stored), if any;
3. else "Untitled thread".

Whitespace runs become one space and control characters are dropped; the result is at
most `MAX_DISPLAY_CHARS` characters, cut at a word boundary when one is near, with an
ellipsis. Reading it costs one bounded store read per thread that needs the message.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["MAX_DISPLAY_CHARS", "UNTITLED", "display_title", "needs_message"]

MAX_DISPLAY_CHARS = 80
UNTITLED = "Untitled thread"
# Characters of the text read for a title: enough for MAX_DISPLAY_CHARS after
# whitespace is folded, without scanning a message of 100,000 characters.
_SCAN_CHARS = 4 * MAX_DISPLAY_CHARS
_BARE_ID = re.compile(r"(?:[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}|[0-9a-fA-F-]{16,})")


def _fold(text: str) -> str:
    """`text` (its start) with whitespace runs as one space and control characters gone."""
    kept = "".join(" " if c.isspace() else c for c in text[:_SCAN_CHARS]
                   if c.isspace() or unicodedata.category(c)[0] != "C")
    return " ".join(kept.split())


def _clip(text: str) -> str:
    if len(text) <= MAX_DISPLAY_CHARS:
        return text
    cut = text[:MAX_DISPLAY_CHARS - 1]
    space = cut.rfind(" ")
    if space >= MAX_DISPLAY_CHARS // 2:  # a word boundary not far back
        cut = cut[:space]
    return cut.rstrip(" .,;:") + "…"


def needs_message(title: str) -> bool:
    """Whether `title` is not readable, so the first message is needed."""
    folded = _fold(title)
    return not folded or _BARE_ID.fullmatch(folded) is not None


def display_title(title: str, first_message: str | None = None) -> str:
    """The thread's display title (see the module) from its stored title and the text of
    its first message (None if it has none, or if the title is readable)."""
    if not needs_message(title):
        return _clip(_fold(title))
    folded = _fold(first_message or "")
    return _clip(folded) if folded else UNTITLED
