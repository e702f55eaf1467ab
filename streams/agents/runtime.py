"""The run an agent is part of: its journal, its caps, and the calls that use them.

The worker runs each execution's agent inside a `RunContext` (a context variable,
so an agent and its tools reach it with `current()` without passing it around):

- `call_tool(tool, arguments)` replays a tool call the journal already holds (the
  function is not called again) or calls it with its idempotency key, records the
  result, and streams the `tool_call` / `tool_result` steps and the result's
  sources as citations;
- `replay(kind, name)` and `record(...)` are the same for any other step, e.g. a
  model turn (the OpenAI agent records each turn's text and tool calls);
- `fence()` returns once every step recorded so far is durable.

When a step is durable: `record()` returns once it is (it waits at the fence), but
`call_tool` does not wait for its own result's record: the agent goes on (a model
turn, say) while the report travels, and the next tool call waits at the fence
before its function starts; so does the worker before it reports the outcome.
The one window (docs/agents.md) stays one call wide, and a run pays one round trip
between two tool calls, not two.
- the caps of `JournalLimits` end a runaway agent with a non-retryable
  `AgentError` (`too_many_steps: ...`, `too_many_tool_calls: ...`); a tool result
  too large to record goes back to the model as an error instead.

Steps replay in order: an agent must ask for the same steps in the same order
for the same input (as Temporal workflows must); a mismatch fails the attempt.

`drive(agent, history, message, context)` runs an agent and yields everything it
streams, its own outputs and those its tool calls emit, in order; outside a
worker it uses an in-memory journal.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams.agents import Agent, AgentCitations, AgentError, AgentOutput, AgentStep
from streams.agents.tools import Tool, ToolContext, ToolError, ToolResult
from streams.core.domain import Step
from streams.core.journal import (
    INTERRUPT,
    MODEL_TURN,
    TOOL_CALL,
    JournalEntry,
    JournalLimits,
    admit,
    idempotency_key,
    merge,
)
from streams.core.reasons import FailureCode
from streams.core.records import HistoryMessage

__all__ = ["MODEL_TURN", "SCHEMA_KEY", "InterruptRequested", "Recorder", "RunContext", "call_tool", "current",
           "drive", "interrupt", "model_turn_json"]

# Sends an entry on its way; the fence (`RunContext.durable`) learns when it lands.
Recorder = Callable[[JournalEntry], Awaitable[None]]


class InterruptRequested(Exception):
    """Raised by `interrupt()` in a run that has no resume value yet: the worker reports
    the interrupt and ends the execution; a resume runs the agent again."""

    def __init__(self, step: int, payload_json: str) -> None:
        super().__init__(f"interrupt at step {step}: {payload_json[:200]}")
        self.step = step
        self.payload_json = payload_json


async def _in_memory(entry: JournalEntry) -> None:
    return None


async def _at_once() -> None:
    return None


@dataclass(eq=False)
class RunContext:
    """One execution's view of its run: the journal so far and where replay stands."""

    run_id: str = "local"
    attempt: int = 1
    execution_id: str = "local"
    journal: list[JournalEntry] = field(default_factory=list)
    limits: JournalLimits = field(default_factory=JournalLimits)
    recorder: Recorder = _in_memory
    durable: Callable[[], Awaitable[None]] = _at_once  # every entry sent so far has landed
    emit: Callable[[AgentOutput], None] = lambda output: None
    cursor: int = 0  # the next step: below len(journal) it is replayed
    in_tool: bool = False  # a tool's function is running (the worker keeps beating)
    # The worker's barrier: the steps recorded up to this execution's start, once every
    # report before it is decided (None: the journal given is complete, e.g. no worker).
    sync: Callable[[], Awaitable[list[JournalEntry]]] | None = None
    synced: bool = False

    async def ensure_synced(self) -> None:
        """Before the execution's first new step: wait for the worker's barrier and take
        in the steps it shows (a step an earlier execution reported but the processor
        had not decided when this one began)."""
        if self.synced or self.sync is None:
            return
        known = await self.sync()
        self.synced = True
        merged = merge(self.journal, known)
        if len(merged) > len(self.journal):
            self.journal = list(merged)

    @property
    def replaying(self) -> bool:
        """Whether the next step is one the journal holds already."""
        return self.cursor < len(self.journal)

    def next_key(self) -> str:
        """The idempotency key of the next step."""
        return idempotency_key(self.run_id, self.cursor)

    def replay(self, kind: str, name: str) -> JournalEntry | None:
        """The journaled entry of the next step if there is one (the cursor moves on);
        None if the next step is new. A journaled step of another kind or name fails
        the attempt, not retryably: the agent does not repeat itself."""
        if not self.replaying:
            return None
        entry = self.journal[self.cursor]
        if entry.kind == INTERRUPT and kind == TOOL_CALL:
            return None  # the tool asked a human: it runs again and its interrupt() replays
        if (entry.kind, entry.name) != (kind, name):
            raise AgentError(
                f"journal mismatch at step {self.cursor}: it holds {entry.kind} {entry.name!r}, "
                f"the agent asked for {kind} {name!r}", retryable=False)
        self.cursor += 1
        return entry

    def refusal(self, kind: str, name: str, input_json: str, output_json: str) -> str | None:
        """Why a step like this could not be recorded next (see `streams.core.journal.admit`)."""
        entry = JournalEntry(self.cursor, kind, name, input_json, output_json, self.execution_id)
        return admit(tuple(self.journal), entry, self.limits)

    async def fence(self) -> None:
        """Wait until every step recorded so far is durable: before a side effect."""
        await self.durable()

    async def record(self, kind: str, name: str, input_json: str,
                     output_json: str, *, wait: bool = True) -> JournalEntry:
        """Record the next step and move on, once it is durable unless `wait` is False
        (then the next `fence()` waits for it); a cap or size refusal raises a
        non-retryable `AgentError` naming it."""
        if self.replaying:
            raise AgentError(f"step {self.cursor} is journaled already; replay it",
                             retryable=False)
        await self.ensure_synced()
        if self.replaying:  # the journal was behind when this execution began
            raise AgentError(f"step {self.cursor} was recorded by an earlier execution that "
                             "this one did not know of; a new attempt replays it",
                             retryable=True)
        reason = self.refusal(kind, name, input_json, output_json)
        if reason is not None:
            raise AgentError(reason, retryable=False)
        entry = JournalEntry(self.cursor, kind, name, input_json, output_json, self.execution_id)
        await self.recorder(entry)
        self.journal.append(entry)
        self.cursor += 1
        if wait:
            await self.durable()
        return entry


_CURRENT: contextvars.ContextVar[RunContext] = contextvars.ContextVar("threadline_run")


def current() -> RunContext:
    """The run context of the agent running in this task (a fresh in-memory one if none)."""
    try:
        return _CURRENT.get()
    except LookupError:
        context = RunContext()
        _CURRENT.set(context)
        return context


def _args_json(arguments: Mapping[str, Any] | str) -> tuple[str, Mapping[str, Any]]:
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError as exc:
            raise ToolError(f"arguments are not JSON: {exc}") from exc
    else:
        parsed = arguments
    if not isinstance(parsed, dict):
        raise ToolError("arguments must be a JSON object")
    return json.dumps(parsed, ensure_ascii=False, sort_keys=True), parsed


async def call_tool(tool: Tool, arguments: Mapping[str, Any] | str) -> ToolResult:
    """Call `tool` as the run's next step, or replay its journaled result."""
    context = current()
    entry = context.replay(TOOL_CALL, tool.name)
    if entry is not None:
        return _replayed(context, tool, entry)
    await context.ensure_synced()  # before any side effect: is this call recorded already?
    entry = context.replay(TOOL_CALL, tool.name)
    if entry is not None:
        return _replayed(context, tool, entry)
    result: ToolResult | None = None
    try:
        args_json, parsed = _args_json(arguments)
    except ToolError as exc:  # the model hears of it like of any tool error
        args_json, parsed = json.dumps({"raw": str(arguments)}), {}
        result = ToolResult(error=str(exc))
    # The caps come before the call: a runaway agent is stopped before a side effect.
    reason = context.refusal(TOOL_CALL, tool.name, args_json, "")
    if reason is not None and not reason.startswith(FailureCode.STEP_TOO_LARGE):
        raise AgentError(reason, retryable=False)
    if reason is not None:
        result = ToolResult(error=f"arguments refused: {reason}")
    context.emit(AgentStep(Step("tool_call", tool.name, args_json)))
    if result is None:
        await context.fence()  # the calls before this one are recorded: the one window
        tool_context = ToolContext(context.run_id, context.cursor, context.next_key())
        context.in_tool = True
        try:
            value = await tool.function(parsed, tool_context)
            result = value if isinstance(value, ToolResult) else ToolResult(content=value)
        except ToolError as exc:
            result = ToolResult(error=str(exc))
        finally:
            context.in_tool = False
    output_json = _with_schema(tool, result.to_json())
    reason = context.refusal(TOOL_CALL, tool.name, args_json, output_json)
    if reason is not None and reason.startswith(FailureCode.STEP_TOO_LARGE):
        # Refused with a clear error to the agent; the model may ask for less.
        result = ToolResult(error=f"result refused: {reason}")
        output_json = _with_schema(tool, result.to_json())
        if context.refusal(TOOL_CALL, tool.name, args_json, output_json) is not None:
            result = ToolResult(error=FailureCode.STEP_TOO_LARGE.value)  # the shortest that says why
            output_json = _with_schema(tool, result.to_json())
    await context.record(TOOL_CALL, tool.name, args_json, output_json, wait=False)
    _emit_result(context, tool.name, result)
    return result


# The key of a journaled tool result that holds its tool's schema digest (MCP tools).
SCHEMA_KEY = "tool_schema"


def _with_schema(tool: Tool, output_json: str) -> str:
    if tool.schema_digest is None:
        return output_json
    body = json.loads(output_json)
    body[SCHEMA_KEY] = tool.schema_digest
    return json.dumps(body, ensure_ascii=False, sort_keys=True)


def _replayed(context: RunContext, tool: Tool, entry: JournalEntry) -> ToolResult:
    """The journaled result of a call, once its tool is checked: a call recorded with a
    schema digest (an MCP tool's) replays only while the tool exists with that schema;
    otherwise the attempt fails as a journal mismatch does (not retryably)."""
    recorded = json.loads(entry.output_json).get(SCHEMA_KEY)
    if recorded is not None and recorded != tool.schema_digest:
        why = ("no longer exists" if tool.schema_digest is None
               else f"changed its input schema ({recorded} -> {tool.schema_digest})")
        raise AgentError(f"journal mismatch at step {entry.step}: the recorded call of tool "
                         f"{tool.name!r} must be replayed, but the tool {why}", retryable=False)
    replayed = ToolResult.from_json(entry.output_json)
    _emit_call(context, tool.name, entry.input_json, replayed)
    return replayed


async def interrupt(payload: Any) -> Any:
    """Ask a human: the run moves to `interrupted` with `payload` (anything json.dumps
    takes) until `POST .../runs/{run_id}/resume {"value": ...}`; then this returns the
    value. The agent runs again from its start to get here: the steps before replay.
    Called from a tool, the tool's function runs again on resume (with the same
    idempotency key) and this call returns the value; its result is the next step."""
    context = current()
    entry = context.replay(INTERRUPT, INTERRUPT)
    if entry is not None:
        return json.loads(entry.output_json)
    await context.ensure_synced()
    entry = context.replay(INTERRUPT, INTERRUPT)
    if entry is not None:
        return json.loads(entry.output_json)
    payload_json = json.dumps(payload, ensure_ascii=False, sort_keys=True)
    reason = context.refusal(INTERRUPT, INTERRUPT, payload_json, "")
    if reason is not None:
        raise AgentError(reason, retryable=False)
    raise InterruptRequested(context.cursor, payload_json)


def _emit_call(context: RunContext, name: str, args_json: str, result: ToolResult) -> None:
    context.emit(AgentStep(Step("tool_call", name, args_json)))
    _emit_result(context, name, result)


def _emit_result(context: RunContext, name: str, result: ToolResult) -> None:
    context.emit(AgentStep(Step("tool_result", name, result.to_json())))
    if result.sources:
        context.emit(AgentCitations(result.sources))


def model_turn_json(text: str, tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """A model turn as journaled: its text and the tool calls it asked for."""
    return json.dumps({"text": text, "tool_calls": list(tool_calls)}, ensure_ascii=False,
                      sort_keys=True)


_DONE = object()


async def drive(agent: Agent, history: Sequence[HistoryMessage], message: str,
                context: RunContext | None = None) -> AsyncIterator[AgentOutput]:
    """Run `agent` in `context` and yield its outputs and its tool calls' steps, in order."""
    queue: asyncio.Queue[object] = asyncio.Queue()
    run_context = context or RunContext()
    run_context.emit = queue.put_nowait

    async def pump() -> None:
        _CURRENT.set(run_context)
        try:
            async for output in agent.run(history, message):
                queue.put_nowait(output)
            queue.put_nowait(_DONE)
        except BaseException as exc:
            queue.put_nowait(exc)
            if not isinstance(exc, Exception):
                raise

    task = asyncio.create_task(pump())
    try:
        while True:
            item = await queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

