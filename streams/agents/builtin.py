"""A deterministic agent with no network: for development, demos and tests.

It answers "You said: <message>." followed by words derived from a hash of the
message, one token per word, at a fixed rate. Markers in the message text drive
failure modes per message, so a test can pick its scenario by what it posts:

    [fail]        fail the attempt after a few tokens, retryably
    [fail-fatal]  fail it after a few tokens, not retryably
    [hang]        stop after a few tokens and never finish (nor make progress)
    [crash]       kill the whole worker process (exit status 137) after a few tokens
    [slow]        stream at the slow rate instead of the normal one
    [approve]     before the reply, ask a human (`interrupt`) and end the reply
                  with `Approved: <the resume value>.`
    [confirm]     before the reply, call the `confirm` tool, which asks a human from
                  inside the tool (`interrupt` in a tool: the AI SDK's tool approval),
                  and end the reply with `Confirmed: <the resume value as JSON>.`

Settings (`settings.worker.extra`, typed and given their defaults in `BuiltinAgentEnv`):
its token rates, the words after the echo, whether a tool call, its result and a
citation follow the text (shown, not journaled), the tool mode (below), how long each
`lookup` call takes, and a file each `lookup` call appends its side effects to
(`start <key>`, then `done <key>`).

The tool mode, for tests and chaos without a network: before the reply the agent
takes n turns, each a sentence (`Step i: looking up "<message> #i".`, a model
turn, journaled) and a call of the `lookup` tool (journaled). `lookup` answers a
fact derived from its query and cites a source; the reply ends with the facts.
A message with `[tools=k]` takes k turns instead. With `THREADLINE_AGENT_TURNS=0` the
calls are made in a row with no model turn between them, as a workflow makes them
(the peers benchmark's workload, whose peers journal the calls alone). Every call goes
through `streams.agents.runtime.call_tool`, so a retried attempt replays the calls that
completed and calls `lookup` again only for the rest. With `THREADLINE_AGENT_MCP_TOOL`
(and the servers of `THREADLINE_AGENT_MCP_SERVERS`), each turn calls that MCP tool
(`server__tool`, with `{"query": ...}`) instead of `lookup`: the tests and the chaos
program exercise MCP tools this way, without a model. A message marked `[lookup]`
calls `lookup` all the same (the chaos program mixes both).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from streams.agents import AgentCitations, AgentError, AgentOutput, AgentStep, TextChunk
from streams.agents.mcp import MCPEnv, MCPTools
from streams.agents.runtime import call_tool, current, interrupt, model_turn_json
from streams.agents.tools import Tool, ToolContext, ToolError, ToolResult, log_side_effect
from streams.config import Settings
from streams.core.domain import Citation, Step
from streams.core.journal import MODEL_TURN
from streams.core.records import HistoryMessage
from streams.env import Section, SettingsError

__all__ = ["BuiltinAgent", "BuiltinAgentEnv", "confirm_tool", "lookup_tool", "reply_for"]

# Tokens streamed before a [fail], [hang] or [crash] takes effect.
TOKENS_BEFORE_TROUBLE = 3
# Before exiting on [crash]: time for the producer to send the tokens already streamed.
CRASH_GRACE_S = 0.3
CRASH_EXIT_STATUS = 137

_VOCABULARY = (
    "stream", "event", "offset", "partition", "replica", "durable", "thread", "answer",
    "token", "record", "broker", "commit", "worker", "attempt", "retry", "fence",
    "ledger", "signal", "quiet", "river", "amber", "orbit", "lantern", "meadow",
    "copper", "harbor", "violet", "summit", "willow", "cinder", "pebble", "thistle",
)


def reply_for(message: str, words: int) -> str:
    """The builtin answer to `message`: the same message always gets the same reply."""
    digest = hashlib.shake_256(message.encode("utf-8", "surrogatepass")).digest(max(words, 1))
    tail = " ".join(_VOCABULARY[b % len(_VOCABULARY)] for b in digest[:words])
    echo = f"You said: {message.strip()}."
    return f"{echo} {tail}." if tail else echo


def _fact(query: str) -> str:
    digest = hashlib.shake_256(query.encode("utf-8", "surrogatepass")).digest(3)
    return " ".join(_VOCABULARY[b % len(_VOCABULARY)] for b in digest)


def lookup_tool(delay_s: float = 0.0, log_path: str | None = None) -> Tool:
    """The builtin `lookup` tool: a fact derived from the query, after `delay_s`,
    with `start <key> <pid> <ms>` and `done <key> <pid> <ms>` appended to `log_path` around the wait."""

    async def lookup(arguments: Mapping[str, object], context: ToolContext) -> ToolResult:
        query = str(arguments.get("query", ""))
        log_side_effect(log_path, "start", context.idempotency_key)
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        log_side_effect(log_path, "done", context.idempotency_key)
        source = hashlib.sha256(query.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        return ToolResult({"query": query, "fact": _fact(query)},
                          (Citation(f"https://example.com/lookup/{source}", f"Lookup: {query}"),))

    return Tool("lookup", "Look a fact up.", {
        "type": "object", "properties": {"query": {"type": "string"}},
        "required": ["query"], "additionalProperties": False}, lookup)


def confirm_tool() -> Tool:
    """The builtin `confirm` tool: asks a human to confirm `action` (an `interrupt`
    from inside the tool) and returns the action with the answer."""

    async def confirm(arguments: Mapping[str, object], context: ToolContext) -> ToolResult:
        action = str(arguments.get("action", ""))
        answer = await interrupt({"question": f"May I {action}?", "tool": "confirm"})
        return ToolResult({"action": action, "answer": answer})

    return Tool("confirm", "Ask a person to confirm an action first.", {
        "type": "object", "properties": {"action": {"type": "string"}},
        "required": ["action"], "additionalProperties": False}, confirm)


_TOOLS_MARKER = re.compile(r"\[tools=(\d+)\]")
_MARKER = re.compile(r"\[[^\[\]]*\]")


def _tokens(reply: str) -> list[str]:
    # Each token keeps the whitespace before it, so the tokens join to the reply.
    return re.findall(r"\s*\S+", reply)


@dataclass(frozen=True, slots=True)
class BuiltinAgent:
    """The offline agent: a hash-derived reply at a fixed token rate, with failures chosen by markers."""
    tokens_per_s: float = 50.0
    slow_tokens_per_s: float = 5.0
    words: int = 24
    steps: bool = False
    tools: int = 0
    turns: bool = True  # the tool mode: a journaled model turn before each call
    tool_delay_s: float = 0.0
    tool_log: str | None = None
    mcp_tool: str | None = None  # the tool mode calls this MCP tool instead of `lookup`
    mcp: MCPTools | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> BuiltinAgent:
        """The agent with its rates, length and steps from THREADLINE_AGENT_* settings."""
        env = BuiltinAgentEnv.read(settings.worker.extra)
        mcp_tool = MCPEnv.read(settings.worker.extra).tool
        mcp = MCPTools.from_settings(settings) if mcp_tool else None
        if mcp_tool and mcp is None:
            raise SettingsError("THREADLINE_AGENT_MCP_TOOL names an MCP tool, but "
                                "THREADLINE_AGENT_MCP_SERVERS names no server")
        return cls(
            tokens_per_s=env.tokens_per_s,
            slow_tokens_per_s=env.slow_tokens_per_s,
            words=env.words,
            steps=env.steps,
            tools=env.tools,
            turns=env.turns,
            tool_delay_s=env.tool_delay_s,
            tool_log=str(env.tool_log) if env.tool_log is not None else None,
            mcp_tool=mcp_tool,
            mcp=mcp,
        )

    async def run(
        self, history: Sequence[HistoryMessage], message: str
    ) -> AsyncIterator[AgentOutput]:
        """Stream the reply token by token, acting out any failure marker in the message."""
        rate = self.slow_tokens_per_s if "[slow]" in message else self.tokens_per_s
        pause = 1.0 / rate if rate > 0 else 0.0
        marker = _TOOLS_MARKER.search(message)
        turns = int(marker.group(1)) if marker else self.tools
        facts: list[str] = []
        if turns > 0:
            tool = await self._tool(message)
            for turn in range(1, turns + 1):
                query = f"{message.strip()} #{turn}"
                if self.turns:
                    async for chunk in self._turn(turn, query, pause, tool.name):
                        yield chunk
                result = await call_tool(tool, {"query": query})
                if isinstance(result.content, dict):
                    facts.append(str(result.content.get("fact", "")))
        confirmed: object = None
        if "[confirm]" in message:
            action = " ".join(_MARKER.sub(" ", message).split())  # the message, no markers
            result = await call_tool(confirm_tool(), {"action": action})
            confirmed = result.content.get("answer") if isinstance(result.content, dict) \
                else None
        approval = None
        if "[approve]" in message:
            approval = await interrupt({"question": f"May I answer {message.strip()!r}?"})
        reply = reply_for(message, self.words)
        if turns > 0:
            reply = " " + reply + " Facts: " + "; ".join(facts) + "."
        if approval is not None:
            reply += f" Approved: {approval}."
        if "[confirm]" in message:
            reply += f" Confirmed: {json.dumps(confirmed, sort_keys=True)}."
        for index, token in enumerate(_tokens(reply)):
            if index == TOKENS_BEFORE_TROUBLE:
                await self._trouble(message)
            await asyncio.sleep(pause)
            yield TextChunk(token)
        if self.steps:
            query = json.dumps({"query": message})
            yield AgentStep(Step("tool_call", "search", query))
            yield AgentStep(Step("tool_result", "search", json.dumps({"hits": 1})))
            source = hashlib.sha256(message.encode("utf-8", "surrogatepass")).hexdigest()[:12]
            yield AgentCitations((Citation(f"https://example.com/threadline/{source}",
                                           "Threadline builtin source"),))

    async def _tool(self, message: str) -> Tool:
        """`lookup`, or the MCP tool named by THREADLINE_AGENT_MCP_TOOL as it is listed now
        (absent: a stand-in whose calls answer the model an error)."""
        if self.mcp_tool is None or self.mcp is None or "[lookup]" in message:
            return lookup_tool(self.tool_delay_s, self.tool_log)
        found = {t.name: t for t in await self.mcp.tools()}.get(self.mcp_tool)
        return found or _absent(self.mcp_tool)

    @staticmethod
    async def _turn(turn: int, query: str, pause: float,
                    tool: str = "lookup") -> AsyncIterator[AgentOutput]:
        """One journaled model turn: its sentence, streamed, or replayed whole."""
        context = current()
        entry = context.replay(MODEL_TURN, "builtin")
        if entry is not None:
            yield TextChunk(json.loads(entry.output_json)["text"])
            return
        text = (" " if turn > 1 else "") + \
            f"Step {turn}: looking up {json.dumps(query, ensure_ascii=False)}."
        for token in _tokens(text):
            await asyncio.sleep(pause)
            yield TextChunk(token)
        call = {"name": tool, "arguments": json.dumps({"query": query})}
        await context.record(MODEL_TURN, "builtin", "", model_turn_json(text, [call]))

    def start(self) -> None:
        """Start the MCP sessions, if any (the worker calls this as it starts)."""
        if self.mcp is not None:
            self.mcp.start()

    async def aclose(self) -> None:
        """Stop the MCP sessions, if any (and so the stdio servers)."""
        if self.mcp is not None:
            await self.mcp.aclose()

    @staticmethod
    async def _trouble(message: str) -> None:
        if "[fail-fatal]" in message:
            raise AgentError("builtin agent: [fail-fatal] requested", retryable=False)
        if "[fail]" in message:
            raise AgentError("builtin agent: [fail] requested", retryable=True)
        if "[hang]" in message:
            await asyncio.Event().wait()  # forever, until cancelled
        if "[crash]" in message:
            await asyncio.sleep(CRASH_GRACE_S)
            os._exit(CRASH_EXIT_STATUS)


def _absent(name: str) -> Tool:
    async def refuse(arguments: Mapping[str, object], context: ToolContext) -> None:
        raise ToolError(f"there is no MCP tool named {name!r}")

    return Tool(name, "", {}, refuse)


_BUILTIN = BuiltinAgent()


class BuiltinAgentEnv(Section):
    """The builtin agent's variables (`Settings.worker.extra`; docs/operations.md); the
    defaults are `BuiltinAgent`'s."""

    # 0: as fast as possible
    tokens_per_s: float = Field(_BUILTIN.tokens_per_s, ge=0, alias="THREADLINE_AGENT_TOKENS_PER_S")
    slow_tokens_per_s: float = Field(_BUILTIN.slow_tokens_per_s, ge=0,
                                     alias="THREADLINE_AGENT_SLOW_TOKENS_PER_S")
    words: int = Field(_BUILTIN.words, ge=0, alias="THREADLINE_AGENT_WORDS")
    steps: bool = Field(_BUILTIN.steps, alias="THREADLINE_AGENT_STEPS")
    tools: int = Field(_BUILTIN.tools, ge=0, alias="THREADLINE_AGENT_TOOLS")
    turns: bool = Field(_BUILTIN.turns, alias="THREADLINE_AGENT_TURNS")
    tool_delay_s: float = Field(_BUILTIN.tool_delay_s, ge=0, alias="THREADLINE_AGENT_TOOL_DELAY_S")
    tool_log: Path | None = Field(None, alias="THREADLINE_AGENT_TOOL_LOG")
