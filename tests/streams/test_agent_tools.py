"""Agents with tools, on their own (no Kafka): loading an agent by name, the builtin
tool mode, the OpenAI agent's function-calling loop against the scripted server,
replay of a journal cut at every step, and the per-run caps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from streams.agents import (
    AgentCitations,
    AgentError,
    AgentOutput,
    AgentStep,
    TextChunk,
    create_agent,
    load_factory,
)
from streams.agents.builtin import BuiltinAgent
from streams.agents.example import create as create_example
from streams.agents.example import ticket_tool
from streams.agents.openai import OpenAIAgent
from streams.agents.runtime import RunContext, call_tool, drive
from streams.agents.tools import Tool, ToolContext, ToolResult
from streams.config import Settings
from streams.core.journal import MODEL_TURN, TOOL_CALL, JournalEntry, JournalLimits
from streams.testing.openai_server import ScriptedOpenAI, answer_for


async def _run(agent: Any, message: str, context: RunContext) -> list[AgentOutput]:
    return [o async for o in drive(agent, (), message, context)]


def _text(outputs: Sequence[AgentOutput]) -> str:
    return "".join(o.text for o in outputs if isinstance(o, TextChunk))


def _steps(outputs: Sequence[AgentOutput]) -> list[tuple[str, str]]:
    return [(o.step.kind, o.step.name) for o in outputs if isinstance(o, AgentStep)]


def _log(path: Path) -> list[str]:
    """The side-effect log's lines, without the process ids."""
    return [" ".join(line.split()[:2]) for line in path.read_text().splitlines()] \
        if path.exists() else []


# --- bring your own agent ------------------------------------------------------------


def test_agents_load_by_name_module_path_and_entry_point() -> None:
    """THREADLINE_AGENT takes the named agents, package.module:factory and entry points."""
    assert isinstance(create_agent(Settings.from_env({"THREADLINE_AGENT": "builtin"})), BuiltinAgent)
    by_path = create_agent(Settings.from_env({"THREADLINE_AGENT": "streams.agents.example:create"}))
    by_entry_point = create_agent(Settings.from_env({"THREADLINE_AGENT": "ticket-example"}))
    for agent in (by_path, by_entry_point):
        assert isinstance(agent, OpenAIAgent) and list(agent.tools) == ["open_ticket"]
    assert load_factory("ticket-example") is create_example
    with pytest.raises(ValueError, match=r"unknown agent 'nope'.*ticket-example"):
        load_factory("nope")
    with pytest.raises(ValueError, match="cannot be loaded"):
        load_factory("streams.agents.example:missing")
    with pytest.raises(ValueError, match="has no run"):
        create_agent(Settings.from_env({"THREADLINE_AGENT": "builtins:str"}))


# --- the builtin tool mode -------------------------------------------------------------


async def test_builtin_tool_mode_journals_turns_and_calls_and_replays_them(tmp_path: Path) -> None:
    """In tool mode each turn and lookup is a journaled step; replay calls no tool again."""
    log = tmp_path / "tools.log"
    agent = BuiltinAgent(tokens_per_s=0, words=3, tools=2, tool_log=str(log))
    first = RunContext(run_id="r")
    outputs = await _run(agent, "weather", first)
    assert [e.kind for e in first.journal] == [MODEL_TURN, TOOL_CALL] * 2
    assert _steps(outputs) == [("tool_call", "lookup"), ("tool_result", "lookup")] * 2
    assert sum(isinstance(o, AgentCitations) for o in outputs) == 2
    assert _log(log) == ["start r:1", "done r:1", "start r:3", "done r:3"]
    assert "Facts:" in _text(outputs)
    for cut in range(len(first.journal) + 1):
        log.unlink()
        again = RunContext(run_id="r", journal=list(first.journal[:cut]))
        replayed = await _run(agent, "weather", again)
        assert _text(replayed) == _text(outputs)
        assert _steps(replayed) == _steps(outputs)
        assert again.journal == first.journal
        assert _log(log) == [f"{w} r:{s}" for s in (1, 3) if s >= cut for w in ("start", "done")]


async def test_builtin_tool_mode_without_turns_journals_the_calls_alone(tmp_path: Path) -> None:
    """THREADLINE_AGENT_TURNS=0: the calls in a row, each a journaled step, no model turn
    and no sentence between them; replay calls no tool again."""
    log = tmp_path / "tools.log"
    agent = BuiltinAgent.from_settings(Settings.from_env({
        "THREADLINE_AGENT_TOKENS_PER_S": "0", "THREADLINE_AGENT_WORDS": "3",
        "THREADLINE_AGENT_TOOLS": "3", "THREADLINE_AGENT_TURNS": "0",
        "THREADLINE_AGENT_TOOL_LOG": str(log)}))
    first = RunContext(run_id="r")
    outputs = await _run(agent, "weather", first)
    assert [e.kind for e in first.journal] == [TOOL_CALL] * 3
    assert _log(log) == [f"{w} r:{s}" for s in range(3) for w in ("start", "done")]
    assert "Step 1" not in _text(outputs) and "Facts:" in _text(outputs)
    log.unlink()
    again = RunContext(run_id="r", journal=list(first.journal))
    assert _text(await _run(agent, "weather", again)) == _text(outputs)
    assert not log.exists()


async def test_a_tool_call_starts_only_once_every_step_before_it_is_durable() -> None:
    """`call_tool` goes on without waiting for its result's record (the report travels
    while the agent thinks), but the next call's function starts only at the fence:
    the one window stays one call wide. Without the fence, `b` starts before `a`'s
    record has landed and the first assertion fails."""
    sent: list[int] = []
    landed = asyncio.Event()  # the broker's ack, when the test says so
    durable_upto = 0
    starts: list[tuple[int, int]] = []  # (step, steps durable when the function began)

    async def recorder(entry: JournalEntry) -> None:
        sent.append(entry.step)

    async def durable() -> None:
        nonlocal durable_upto
        if durable_upto < len(sent):
            await landed.wait()
            durable_upto = len(sent)

    async def work(arguments: Mapping[str, Any], context: ToolContext) -> str:
        starts.append((context.step, durable_upto))
        return "ok"

    tools = [Tool(name, "", {"type": "object"}, work) for name in ("a", "b")]

    class TwoCalls:
        async def run(self, history: Sequence[Any], message: str) -> Any:
            for tool in tools:
                await call_tool(tool, {})
            yield TextChunk("done")

    context = RunContext(run_id="r", recorder=recorder, durable=durable)
    run = asyncio.create_task(_run(TwoCalls(), "go", context))
    while not sent:  # a's result is on its way
        await asyncio.sleep(0)
    for _ in range(100):  # the loop turns: nothing but the fence holds b back
        await asyncio.sleep(0)
    assert starts == [(0, 0)], "b began before a's record was durable"
    landed.set()
    assert _text(await run) == "done"
    assert starts == [(0, 0), (1, 1)] and sent == [0, 1]


# --- the OpenAI agent against the scripted server ----------------------------------------


async def test_openai_agent_runs_the_tool_loop_and_replays_any_cut(tmp_path: Path) -> None:
    """The OpenAI agent calls tools until the answer; a journal cut anywhere replays the
    completed turns and calls (model not asked again, tool not called again)."""
    log = tmp_path / "tickets.log"
    message = "printer broken [tools=3]"
    async with ScriptedOpenAI() as server:
        agent = OpenAIAgent(server.base_url, api_key="k", tools=[ticket_tool(str(log))])
        try:
            first = RunContext(run_id="run")
            outputs = await _run(agent, message, first)
            assert server.requests == [0, 1, 2, 3]
            results = [json.loads(e.output_json) for e in first.journal if e.kind == TOOL_CALL]
            assert len(first.journal) == 6 and len(results) == 3
            assert [e.kind for e in first.journal] == [MODEL_TURN, TOOL_CALL] * 3
            for_model = [json.dumps(r["content"], ensure_ascii=False, sort_keys=True) for r in results]
            assert _text(outputs).endswith(answer_for(message, for_model))
            assert _steps(outputs) == [("tool_call", "open_ticket"), ("tool_result", "open_ticket")] * 3
            assert sum(isinstance(o, AgentCitations) for o in outputs) == 3
            for cut in range(len(first.journal) + 1):
                log.unlink(missing_ok=True)
                asked = len(server.requests)
                again = RunContext(run_id="run", journal=list(first.journal[:cut]))
                replayed = await _run(agent, message, again)
                assert _text(replayed) == _text(outputs) and again.journal == first.journal
                # Turns at steps 0, 2, 4 and the answer: only those past the cut are asked.
                assert server.requests[asked:] == [k for k in range(4) if 2 * k >= cut]
                assert _log(log) == [f"{w} run:{s}" for s in (1, 3, 5) if s >= cut
                                     for w in ("start", "done")]
        finally:
            await agent.aclose()


async def test_caps_end_a_runaway_agent_not_retryably(tmp_path: Path) -> None:
    """Past the tool-call or step cap the attempt fails, not retryably, before the call."""
    log = tmp_path / "tools.log"
    agent = BuiltinAgent(tokens_per_s=0, words=2, tools=5, tool_log=str(log))
    for limits, reason in ((JournalLimits(max_tool_calls=2), "too_many_tool_calls"),
                           (JournalLimits(max_steps=3), "too_many_steps")):
        log.unlink(missing_ok=True)
        with pytest.raises(AgentError, match=reason) as failure:
            await _run(agent, "loop", RunContext(run_id="r", limits=limits))
        assert failure.value.retryable is False
        assert len([line for line in _log(log) if line.startswith("done")]) <= 2


async def test_an_oversize_tool_result_goes_back_to_the_model_as_an_error() -> None:
    """A result too large to record is refused with a clear error the model sees; the run goes on."""
    async def huge(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
        return ToolResult("x" * 10_000)

    tool = Tool("huge", "", {"type": "object", "properties": {"q": {"type": "string"}},
                             "required": ["q"]}, huge)
    async with ScriptedOpenAI() as server:
        agent = OpenAIAgent(server.base_url, tools=[tool])
        try:
            context = RunContext(run_id="r", limits=JournalLimits(max_entry_bytes=2_000))
            outputs = await _run(agent, "big [tools=1]", context)
        finally:
            await agent.aclose()
    recorded = json.loads(context.journal[1].output_json)
    assert "step_too_large" in recorded["error"] and "10" in recorded["error"]
    assert "refused" in _text(outputs)  # the model quoted the error in its answer


async def test_a_journal_that_disagrees_with_the_agent_fails_not_retryably() -> None:
    """Replaying a journal whose step is another kind fails the attempt, not retryably."""
    wrong = JournalEntry(0, TOOL_CALL, "lookup", "{}", '{"content": 1}', "e")
    with pytest.raises(AgentError, match="journal mismatch at step 0") as failure:
        await _run(BuiltinAgent(tokens_per_s=0, tools=1), "x", RunContext(journal=[wrong]))
    assert failure.value.retryable is False
