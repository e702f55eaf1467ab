"""An agent backed by any OpenAI-compatible chat-completions endpoint, with tools.

It uses the official `openai` SDK (`AsyncOpenAI`, `max_retries=0`: the processor
owns retries) and streams each model turn. A turn that asks for tool calls is
recorded in the run's journal (its text and calls), then each call runs through
`streams.agents.runtime.call_tool` (journaled, replayed on a later attempt), the
results go back to the model as `tool` messages, and the loop goes on until a turn
answers without calling a tool. A later attempt replays the recorded turns and
tool results and asks the model only from after the last completed step.

Failures map to `AgentError`: HTTP 408, 409, 429 and 5xx, connection errors,
timeouts, an error inside the stream and a stream cut short are retryable; other
4xx (a bad key, an unknown model, a request the server refuses) are not.

Settings (`settings.worker.extra`, typed and given their defaults in `OpenAIAgentEnv`): the
server's base URL, a key sent as a bearer token if set, the model, an optional
system prompt, the connect and read timeout, and optional tools: `package.module:attr`
naming a sequence of `Tool`s, or a function of the settings that returns one; and
the tools of the MCP servers of `THREADLINE_AGENT_MCP_SERVERS` (`streams.agents.mcp`),
listed afresh at the start of each execution and named `server__tool`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

import openai
from pydantic import Field

from streams.agents import AgentError, AgentOutput, TextChunk
from streams.agents.mcp import MCPTools
from streams.agents.runtime import call_tool, current, model_turn_json
from streams.agents.tools import Tool, ToolContext, ToolError, by_name
from streams.config import Settings
from streams.core.journal import MODEL_TURN
from streams.core.records import HistoryMessage
from streams.env import Section

__all__ = ["TURN_STEP_NAME", "OpenAIAgent", "OpenAIAgentEnv"]

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_ERROR_CHARS = 300
TURN_STEP_NAME = "chat"  # the journal name of a model turn (not the model: it may change)


@dataclass(slots=True)
class _Turn:
    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finished: bool = False

    def tool_calls(self) -> list[dict[str, str]]:
        return [self.calls[i] for i in sorted(self.calls)]


class OpenAIAgent:
    """An agent that streams answers from an OpenAI-compatible chat completions API."""

    def __init__(
        self,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        system_prompt: str | None = None,
        timeout_s: float = 60.0,
        tools: Sequence[Tool] = (),
        mcp: MCPTools | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.model = model
        self.system_prompt = system_prompt
        self.timeout_s = timeout_s
        self.tools = by_name(tools)
        self.mcp = mcp  # more tools, listed at the start of each execution
        self._client: openai.AsyncOpenAI | None = None  # made on first use, in the loop

    @property
    def url(self) -> str:
        """The chat completions endpoint."""
        return self.base_url + "/chat/completions"

    @classmethod
    def from_settings(cls, settings: Settings, tools: Sequence[Tool] | None = None) -> OpenAIAgent:
        """The agent configured from THREADLINE_AGENT_OPENAI_* settings."""
        env = OpenAIAgentEnv.read(settings.worker.extra)
        return cls(
            base_url=env.base_url,
            api_key=env.api_key,
            model=env.model,
            system_prompt=env.system_prompt,
            timeout_s=env.timeout_s,
            tools=tools if tools is not None else _load_tools(settings, env.tools),
            mcp=MCPTools.from_settings(settings),
        )

    def messages(self, history: Sequence[HistoryMessage], message: str) -> list[dict[str, Any]]:
        """The conversation the first turn sends: system prompt, history, then the message."""
        messages: list[dict[str, Any]] = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        messages += [{"role": m.role, "content": m.text} for m in history]
        messages.append({"role": "user", "content": message})
        return messages

    async def run(
        self, history: Sequence[HistoryMessage], message: str
    ) -> AsyncIterator[AgentOutput]:
        """Run the function-calling loop, streaming each turn's text, until the answer."""
        messages = self.messages(history, message)
        context = current()
        tools = await self._tools()
        while True:
            entry = context.replay(MODEL_TURN, TURN_STEP_NAME)
            if entry is not None:
                recorded = json.loads(entry.output_json)
                text, calls = str(recorded["text"]), list(recorded["tool_calls"])
                if text:
                    yield TextChunk(text)
            else:
                turn = _Turn()
                async for chunk in self._stream_turn(messages, turn, tools):
                    yield chunk
                text, calls = "".join(turn.text), turn.tool_calls()
                if not calls:
                    return  # the answer: the worker reports it, nothing to journal
                await context.record(MODEL_TURN, TURN_STEP_NAME, "", model_turn_json(text, calls))
            if not calls:
                return
            messages.append({"role": "assistant", "content": text or None, "tool_calls": [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]})
            for call in calls:
                result = await call_tool(tools.get(call["name"]) or _unknown(call["name"]),
                                         call["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": result.for_model()})

    async def _tools(self) -> dict[str, Tool]:
        """The function tools and the MCP servers' tools as they are listed now."""
        if self.mcp is None:
            return self.tools
        try:
            return by_name([*self.tools.values(), *await self.mcp.tools()])
        except ValueError as exc:  # a function tool named like an MCP tool
            raise AgentError(str(exc), retryable=False) from None

    async def _stream_turn(self, messages: list[dict[str, Any]], turn: _Turn,
                           tools: Mapping[str, Tool]) -> AsyncIterator[AgentOutput]:
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key or "unused", max_retries=0,
                timeout=self.timeout_s)
        request: dict[str, Any] = {"model": self.model, "messages": messages, "stream": True}
        if tools:
            request["tools"] = [t.openai_schema() for t in tools.values()]
        try:
            stream = await self._client.chat.completions.create(**request)
            async for chunk in stream:
                if not chunk.choices:
                    continue  # e.g. a usage-only chunk
                choice = chunk.choices[0]
                delta = choice.delta
                if delta is not None and delta.content:
                    turn.text.append(delta.content)
                    yield TextChunk(delta.content)
                for piece in (delta.tool_calls if delta is not None else None) or ():
                    call = turn.calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = piece.id or call["id"] or f"call_{piece.index}"
                    if piece.function is not None:
                        call["name"] += piece.function.name or ""
                        call["arguments"] += piece.function.arguments or ""
                if choice.finish_reason:
                    turn.finished = True
        except openai.APIStatusError as exc:
            status = exc.status_code
            raise AgentError(f"HTTP {status} from {self.url}: {str(exc)[:_ERROR_CHARS]}",
                             retryable=status in _RETRYABLE_STATUS or status >= 500) from exc
        except openai.APIConnectionError as exc:
            raise AgentError(f"{type(exc).__name__} talking to {self.url}: {exc}",
                             retryable=True) from exc
        except openai.APIError as exc:  # an error event inside the stream
            raise AgentError(f"error in completion stream: {str(exc)[:_ERROR_CHARS]}",
                             retryable=True) from exc
        if not turn.finished:
            raise AgentError("the completion stream ended before a finish reason", retryable=True)

    def start(self) -> None:
        """Start the MCP sessions, if any (the worker calls this as it starts)."""
        if self.mcp is not None:
            self.mcp.start()

    async def aclose(self) -> None:
        """Close the HTTP client and the MCP sessions, if opened."""
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self.mcp is not None:
            await self.mcp.aclose()


_OPENAI = OpenAIAgent()


class OpenAIAgentEnv(Section):
    """The OpenAI agent's variables (`Settings.worker.extra`; docs/operations.md); the
    defaults are `OpenAIAgent`'s."""

    base_url: str = Field(_OPENAI.base_url, alias="THREADLINE_AGENT_OPENAI_BASE_URL")
    api_key: str | None = Field(None, alias="THREADLINE_AGENT_OPENAI_API_KEY")
    model: str = Field(_OPENAI.model, alias="THREADLINE_AGENT_OPENAI_MODEL")
    system_prompt: str | None = Field(None, alias="THREADLINE_AGENT_OPENAI_SYSTEM_PROMPT")
    timeout_s: float = Field(_OPENAI.timeout_s, gt=0, alias="THREADLINE_AGENT_OPENAI_TIMEOUT_S")
    tools: str | None = Field(None, alias="THREADLINE_AGENT_OPENAI_TOOLS")


def _unknown(name: str) -> Tool:
    async def refuse(arguments: Mapping[str, Any], context: ToolContext) -> None:
        raise ToolError(f"there is no tool named {name!r}")

    return Tool(name, "", {}, refuse)


def _load_tools(settings: Settings, target: str | None) -> Sequence[Tool]:
    if not target:
        return ()
    module_name, _, attrs = target.partition(":")
    loaded: Any = import_module(module_name)
    for attr in attrs.split("."):
        loaded = getattr(loaded, attr)
    tools = loaded(settings) if callable(loaded) else loaded
    if not all(isinstance(t, Tool) for t in tools):
        raise ValueError(f"THREADLINE_AGENT_OPENAI_TOOLS={target!r} is not a sequence of Tool")
    return tuple(tools)
