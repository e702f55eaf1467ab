"""MCP tool calls against kill -9 (issue #29): the builtin agent's tool mode calls a real
MCP server's `lookup` (streams/testing/mcp_server.py, the official SDK's `MCPServer`,
THREADLINE_AGENT_MCP_TOOL), over stdio (each worker starts its own server) and over
streamable HTTP (one server the test runs, the worker named in a header taken from
the environment). Workers are SIGKILLed inside calls and between them, with a real
processor on the session broker.

The server logs each execution with its key (`start`/`done`, `cancelled`, and `dedup`
for a key done before: the one window, closed by the server's dedupe on the key).
Each completed, recorded call is `done` exactly once; each run has exactly one stored
answer, whose steps are in the stream and in the stored message.

Sizes: in `make test`, 6 runs of 3 calls with 4 kills per transport stand for the
chaos-sized run (`-m chaos`): 50 runs of 3 calls with 10 kills per transport."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from streams.agents.builtin import BuiltinAgent
from streams.agents.runtime import RunContext, drive
from streams.agents.tools import Tool, ToolContext, ToolResult
from streams.core.domain import Event, RetryScheduled, RunCompleted, RunFailed, StepRecorded
from streams.core.records import StepOutput
from streams.devtools.broker import free_port
from streams.testing.mcp_server import fact_for
from streams.testing.process import ChildProcess, wait_for
from tests.streams.worker.test_journal_crash import _completed, kill_among_calls
from tests.streams.worker.test_worker import (
    FAST,
    Stack,
    _executions,
    _lifecycle,
    _of_run,
    _output_of,
    _read_stream,
    _stack,
    _text_of,
)


@dataclass(frozen=True)
class Line:
    """One line of the MCP server's execution log."""

    what: str  # start | done | cancelled | dedup
    run_id: str
    step: int
    who: str  # the worker: its pid (stdio) or its instance id (HTTP)
    ms: int


def _lines(log: Path) -> list[Line]:
    if not log.exists():
        return []
    lines = []
    for raw in log.read_text().splitlines():
        what, key, who, ms = raw.split()
        run_id, _, step = key.rpartition(":")
        lines.append(Line(what, run_id, int(step), who, int(ms)))
    return lines


def _open(log: Path) -> list[Line]:
    """Executions started and not (yet) done or cancelled, by the same caller."""
    lines = _lines(log)
    ended = {(x.run_id, x.step, x.who) for x in lines if x.what in ("done", "cancelled")}
    return [x for x in lines if x.what == "start" and (x.run_id, x.step, x.who) not in ended]


def _victim(stack: Stack, who: str) -> str | None:
    return next((name for name, p in stack.workers.items()
                 if p.alive() and who in (name, str(p.pid))), None)


class _SameAnswers:
    """Stands for the MCP servers when computing the expected text: `kb__lookup`
    answering as the test server does."""

    async def tools(self) -> Sequence[Tool]:
        async def lookup(arguments: Mapping[str, object], context: ToolContext) -> ToolResult:
            query = str(arguments["query"])
            return ToolResult({"query": query, "fact": fact_for(query)})
        return (Tool("kb__lookup", "", {}, lookup),)

    async def aclose(self) -> None:
        return None


async def _expected(message: str, tools: int = 3) -> str:
    agent = BuiltinAgent(tokens_per_s=0, words=4, tools=tools, mcp_tool="kb__lookup",
                         mcp=_SameAnswers())  # type: ignore[arg-type]
    outputs = [o async for o in drive(agent, (), message, RunContext(run_id="expected"))]
    return "".join(getattr(o, "text", "") for o in outputs)


def _check(stack: Stack, events: list[Event], run: str, text: str, log: Path) -> None:
    of_run = _of_run(events, run)
    completed = [e for e in of_run if isinstance(e, RunCompleted)]
    assert len(completed) == 1 and not any(isinstance(e, RunFailed) for e in of_run), (
        run, [(type(e).__name__, getattr(e, "error", "")) for e in of_run
              if not isinstance(e, StepRecorded)], stack.logs())
    answer = completed[0].message
    assert answer.text == text
    recorded = sorted({e.entry.step for e in of_run
                       if isinstance(e, StepRecorded) and e.entry.kind == "tool_call"})
    assert recorded == [1, 3, 5], recorded
    done = Counter(x.step for x in _lines(log) if x.what == "done" and x.run_id == run)
    assert done == Counter(recorded), (run, done)  # each completed, recorded call exactly once
    assert [(s.kind, s.name) for s in answer.steps] == [("tool_call", "kb__lookup"),
                                                        ("tool_result", "kb__lookup")] * 3
    records = _read_stream(stack.settings, lambda r: bool(_lifecycle(r, run, "run_completed")))
    final = _executions(_output_of(records, run))[-1]
    assert _text_of(final) == answer.text  # the client's last message is the stored answer
    assert sum(isinstance(r.out.payload, StepOutput) for r in final) == len(answer.steps)


async def _kill_test(test_env: dict[str, str], tmp_path: Path, transport: str, runs: int,
                     kills: int) -> None:
    log = tmp_path / "mcp.log"
    server_args = ["-m", "streams.testing.mcp_server", "--log", str(log), "--delay", "1.0"]
    server: ChildProcess | None = None
    servers: dict[str, dict[str, object]]
    if transport == "stdio":
        servers = {"kb": {"command": [sys.executable, *server_args]}}
    else:
        port_file = tmp_path / "mcp.port"
        server = ChildProcess("mcp", [*server_args, "--transport", "http", "--port-file",
                                      str(port_file)], {}, tmp_path / "mcp.out").start()
        port = server.wait_for_file(port_file)
        servers = {"kb": {"url": f"http://127.0.0.1:{port}/mcp",
                          "headers": {"X-Threadline-Worker": "${THREADLINE_INSTANCE_ID}"}}}
    env = {**test_env, **FAST, "THREADLINE_HEARTBEAT_TIMEOUT_S": "30",
           "THREADLINE_AGENT_TOKENS_PER_S": "10", "THREADLINE_AGENT_WORDS": "4",
           "THREADLINE_AGENT_TOOLS": "3", "THREADLINE_AGENT_MCP_TOOL": "kb__lookup",
           "THREADLINE_AGENT_MCP_SERVERS": json.dumps(servers),
           "THREADLINE_AGENT_MCP_CONNECT_TIMEOUT_S": "120"}
    try:
        with _stack(env, tmp_path, ["w1", "w2"]) as stack:
            posted = [stack.post(f"order {i}") for i in range(runs)]
            landed = kill_among_calls(stack, kills, lines=lambda: _lines(log),
                                      open_lines=lambda: _open(log),
                                      worker_of=lambda x: _victim(stack, x.who))
            events = _completed(stack, [r for _, r in posted], timeout=120 + 10 * runs)
            for i, (_, run) in enumerate(posted):
                _check(stack, events, run, await _expected(f"order {i}"), log)
            assert landed["inside"] >= 1 and landed["between"] >= 1, landed
            lines = _lines(log)
            started = Counter((x.run_id, x.step) for x in lines if x.what == "start")
            windows = sum(x.what == "dedup" for x in lines) + sum(
                n - 1 for n in started.values() if n > 1)
            assert windows >= 1, Counter(x.what for x in lines)  # a killed call was asked again
    finally:
        if server is not None:
            server.kill9()


@pytest.mark.kafka
@pytest.mark.chaos
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_sigkill_inside_and_between_mcp_calls_repeats_no_completed_call(
        test_env: dict[str, str], tmp_path: Path, transport: str) -> None:
    """6 runs of 3 MCP calls, 4 kills (stands for the chaos-sized test below)."""
    await _kill_test(test_env, tmp_path, transport, runs=6, kills=4)


@pytest.mark.kafka
@pytest.mark.chaos
@pytest.mark.chaos_sized
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_sigkill_across_50_runs_of_3_mcp_calls(
        test_env: dict[str, str], tmp_path: Path, transport: str) -> None:
    """Issue #29's kill test: 50 runs of 3 MCP calls, the worker killed 10 times."""
    await _kill_test(test_env, tmp_path, transport, runs=50, kills=10)


@pytest.mark.kafka
@pytest.mark.chaos
async def test_the_server_killed_mid_call_fails_the_attempt_and_the_retry_calls_again(
        test_env: dict[str, str], tmp_path: Path) -> None:
    """The HTTP server is SIGKILLed inside a run's first call and started again on its
    port: the attempt fails retryably (`went away during a call`), the next attempt
    replays the first turn and calls again with the same key, and the run completes
    once. The window, counted: that key was started twice and done once."""
    log, port = tmp_path / "mcp.log", free_port()
    server = ChildProcess("mcp", ["-m", "streams.testing.mcp_server", "--log", str(log),
                                  "--delay", "1.0", "--transport", "http", "--port", str(port)],
                          {}, tmp_path / "mcp.out").start()
    servers = {"kb": {"url": f"http://127.0.0.1:{port}/mcp"}}
    env = {**test_env, **FAST, "THREADLINE_HEARTBEAT_TIMEOUT_S": "30",
           "THREADLINE_AGENT_TOKENS_PER_S": "0", "THREADLINE_AGENT_WORDS": "4",
           "THREADLINE_AGENT_MCP_TOOL": "kb__lookup", "THREADLINE_MAX_ATTEMPTS": "5",
           "THREADLINE_AGENT_MCP_SERVERS": json.dumps(servers),
           "THREADLINE_AGENT_MCP_CONNECT_TIMEOUT_S": "120"}
    try:
        with _stack(env, tmp_path, ["w1"]) as stack:
            _, run = stack.post("order 1 [tools=2]")
            first = wait_for(lambda: next((x for x in _open(log) if x.run_id == run), None), 120,
                             interval=0.02, progress=stack.progress)
            assert first is not None and first.step == 1
            server.kill9()
            server.start()
            events = _completed(stack, [run], timeout=240)
            retried = [e for e in _of_run(events, run) if isinstance(e, RetryScheduled)]
            assert retried and "went away during a call" in retried[0].reason, retried
            completed = [e for e in _of_run(events, run) if isinstance(e, RunCompleted)]
            assert len(completed) == 1, stack.logs()
            assert completed[0].message.text == await _expected("order 1 [tools=2]", tools=2)
            of_key = Counter(x.what for x in _lines(log) if (x.run_id, x.step) == (run, 1))
            assert of_key["start"] == 2 and of_key["done"] == 1, of_key
    finally:
        server.kill9()
