"""The example agent of docs/agents.md: an OpenAI-compatible model with one tool
that has a side effect, `open_ticket`.

Run it with `THREADLINE_AGENT=streams.agents.example:create` (and the
THREADLINE_AGENT_OPENAI_* settings of `streams.agents.openai`). The tool's side
effect is a line in THREADLINE_AGENT_TICKET_LOG (`start <key> <pid> <ms>`,
after THREADLINE_AGENT_TICKET_DELAY_S seconds `done <key> <pid> <ms>`): a real one would pass
`context.idempotency_key` on to the ticket system, which then opens one ticket per
key however often it is asked, and that covers the one window the journal cannot:
a call that started but never finished before a crash.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from streams.agents.openai import OpenAIAgent
from streams.agents.tools import Tool, ToolContext, ToolError, ToolResult, log_side_effect
from streams.config import Settings
from streams.core.domain import Citation
from streams.env import Section

__all__ = ["TicketAgentEnv", "create", "ticket_tool"]


class TicketAgentEnv(Section):
    """The example's own variables (`Settings.worker.extra`; docs/operations.md)."""

    ticket_log: Path | None = Field(None, alias="THREADLINE_AGENT_TICKET_LOG")
    ticket_delay_s: float = Field(0.0, ge=0, alias="THREADLINE_AGENT_TICKET_DELAY_S")


def ticket_tool(log_path: str | None = None, delay_s: float = 0.0) -> Tool:
    """`open_ticket(title)`: opens a ticket (a line in `log_path`), returns its number."""

    async def open_ticket(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        title = str(arguments.get("title", "")).strip()
        if not title:
            raise ToolError("a ticket needs a title")  # the model hears this and may try again
        log_side_effect(log_path, "start", context.idempotency_key)
        await asyncio.sleep(delay_s)
        number = int(hashlib.sha256(context.idempotency_key.encode()).hexdigest()[:6], 16)
        log_side_effect(log_path, "done", context.idempotency_key)
        return ToolResult({"ticket": number, "title": title},
                          (Citation(f"https://tickets.example.com/{number}", title),))

    return Tool("open_ticket", "Open a support ticket with this title.",
                {"type": "object", "properties": {"title": {"type": "string"}},
                 "required": ["title"], "additionalProperties": False}, open_ticket)


def create(settings: Settings) -> OpenAIAgent:
    """The factory THREADLINE_AGENT names: the OpenAI agent with `open_ticket`."""
    env = TicketAgentEnv.read(settings.worker.extra)
    tool = ticket_tool(str(env.ticket_log) if env.ticket_log is not None else None,
                       env.ticket_delay_s)
    return OpenAIAgent.from_settings(settings, tools=[tool])
