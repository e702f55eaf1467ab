"""Tools an agent may call: a name, a JSON schema of the arguments, an async function.

A tool's function takes the parsed arguments and a `ToolContext`, whose
`idempotency_key` (`run_id:step`) is the same in every attempt of the run that
reaches the call: pass it on to an external API (an `Idempotency-Key` header, a
client reference) so that the one call the journal cannot cover, one that started
but never finished before a crash, is not done twice.

A tool that fails in a way the model should hear about raises `ToolError`: the
model gets `{"error": ...}` as the result. Any other exception fails the attempt
(retryably). Agents call tools through `streams.agents.runtime.call_tool`, which
journals them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams.core.domain import Citation

__all__ = ["Tool", "ToolContext", "ToolError", "ToolResult", "log_side_effect"]


class ToolError(Exception):
    """The tool could not do what was asked; the message goes back to the model."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a tool knows of the call: its run, its step and its idempotency key."""

    run_id: str
    step: int
    idempotency_key: str


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's result: `content` for the model, `sources` cited in the answer, or an `error`."""

    content: Any = None  # anything json.dumps takes
    sources: tuple[Citation, ...] = ()
    error: str | None = None

    def to_json(self) -> str:
        """The result as journaled and shown in the `tool_result` step."""
        body: dict[str, Any] = {"content": self.content}
        if self.sources:
            body["sources"] = [{"url": c.url, "title": c.title} for c in self.sources]
        if self.error is not None:
            body = {"error": self.error}
        return json.dumps(body, ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> ToolResult:
        """A result read back from the journal."""
        body = json.loads(raw)
        if "error" in body:
            return cls(error=str(body["error"]))
        sources = tuple(Citation(str(s.get("url", "")), str(s.get("title", "")))
                        for s in body.get("sources") or ())
        return cls(content=body.get("content"), sources=sources)

    def for_model(self) -> str:
        """The text a model gets back as the tool message."""
        if self.error is not None:
            return json.dumps({"error": self.error}, ensure_ascii=False)
        if isinstance(self.content, str):
            return self.content
        return json.dumps(self.content, ensure_ascii=False, sort_keys=True)


ToolFunction = Callable[[Mapping[str, Any], ToolContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool: its name, a description for the model, the JSON schema of its arguments,
    and the async function that does it (returning a `ToolResult` or plain JSON content)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    function: ToolFunction = field(repr=False)
    # A digest of the schema the tool had when it was listed (MCP tools): journaled with
    # each call, and a replay whose tool now has another digest, or none, fails.
    schema_digest: str | None = None

    def openai_schema(self) -> dict[str, Any]:
        """The tool as the chat completions API's `tools` entry."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": dict(self.parameters)}}


def by_name(tools: Sequence[Tool]) -> dict[str, Tool]:
    """The tools keyed by name; a name twice is an error."""
    named: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in named:
            raise ValueError(f"two tools are named {tool.name!r}")
        named[tool.name] = tool
    return named


def log_side_effect(path: str | None, what: str, key: str) -> None:
    """Append `<what> <key> <pid> <ms>` to `path` in one write (O_APPEND keeps lines
    whole across processes); nothing without a path. The example tools log their
    calls so the crash tests and the chaos tool audit can count them. `<ms>` has
    microseconds: the peers benchmark reads steps a few milliseconds long from it."""
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key} {os.getpid()} {time.time_ns() / 1e6:.3f}\n".encode())
    finally:
        os.close(fd)
