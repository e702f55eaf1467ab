"""Tools from MCP servers (streams/agents/mcp.py, mcp_names.py), without Kafka.

The pure part (the settings, the names, the schema digests) with examples and
properties; then a real MCP server (streams/testing/mcp_server.py, the official SDK's
`MCPServer`) over stdio and streamable HTTP, driven through `call_tool` with an
in-memory journal: the key in `_meta`, the timeout, a cancellation, the step cap,
two servers with one tool name, the server killed mid-call, and a tool renamed or
changed between attempts."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.agents import AgentError
from streams.agents.builtin import BuiltinAgent
from streams.agents.mcp import MCPTools
from streams.agents.mcp_names import (
    MAX_NAME,
    Listed,
    ServerSpec,
    describe,
    expand,
    namespace,
    parse_servers,
    schema_digest,
    tool_name,
)
from streams.agents.runtime import RunContext, call_tool, drive
from streams.agents.tools import Tool, ToolContext, ToolResult
from streams.core.journal import JournalEntry, JournalLimits
from streams.testing.mcp_server import fact_for

T = TypeVar("T")

# --- the pure part ---------------------------------------------------------------------


def test_the_servers_setting_names_stdio_and_http_servers() -> None:
    """A JSON object of servers: a command line (list or string) or a URL with headers."""
    specs = parse_servers(json.dumps({
        "files": {"command": ["python", "-m", "srv", "/srv"], "env": {"ROOT": "${HOME}"}},
        "tickets": {"url": "https://tickets.example/mcp",
                    "headers": {"Authorization": "Bearer ${TICKETS_TOKEN}"}},
        "db": {"command": "db-mcp --read-only"}}))
    assert [(s.name, s.transport) for s in specs] == [("files", "stdio"), ("tickets", "http"),
                                                      ("db", "stdio")]
    assert specs[0].command == ("python", "-m", "srv", "/srv")
    assert specs[2].command == ("db-mcp", "--read-only")
    assert parse_servers("") == () and parse_servers(None) == ()


@pytest.mark.parametrize(("raw", "says"), [
    ("{", "not JSON"),
    ("[]", "must be a JSON object"),
    ('{"a_b": {"command": ["x"]}}', "no '_'"),
    ('{"a": {"command": ["x"], "url": "http://h"}}', "exactly one of"),
    ('{"a": {}}', "exactly one of"),
    ('{"a": {"url": "ftp://h"}}', "http:// or https://"),
    ('{"a": {"command": []}}', "non-empty list"),
    ('{"a": {"command": ["x"], "headers": {}}}', "for HTTP servers"),
    ('{"a": {"url": "http://h", "env": {}}}', "for stdio servers"),
    ('{"a": {"url": "http://h", "headers": {"X": 1}}}', "object of strings"),
    ('{"a": {"url": "http://h", "retries": 3}}', "unknown keys"),
    ('{"a": "x"}', "expected an object"),
])
def test_a_bad_servers_setting_is_a_clear_error(raw: str, says: str) -> None:
    """Each mistake names the server and what is wrong."""
    with pytest.raises(ValueError, match=says):
        parse_servers(raw)


def test_secrets_are_referenced_resolved_late_and_never_described() -> None:
    """`${NAME}` is resolved from the environment when the server starts; an unset one
    names the variable; the description shows header names only."""
    spec = parse_servers('{"t": {"url": "http://h/mcp", "headers": {"Authorization": '
                         '"Bearer ${TOKEN}"}}}')[0]
    assert expand(spec.headers, {"TOKEN": "s3cret"}, "t") == {"Authorization": "Bearer s3cret"}
    with pytest.raises(ValueError, match=r"\$\{TOKEN\}, which is not set"):
        expand(spec.headers, {}, "t")
    assert "Authorization" in describe(spec) and "Bearer" not in describe(spec)
    assert "Bearer" not in repr(spec)


def test_tool_names_are_namespaced_by_server() -> None:
    """`server__tool`, unsafe characters replaced; two tools that would get one name, or
    a name past 64 characters, are refused with both named."""
    assert tool_name("files", "read") == "files__read"
    assert tool_name("files", "read.file/v2") == "files__read_file_v2"
    named = namespace([Listed("a", "lookup", "", {}), Listed("b", "lookup", "", {})])
    assert sorted(named) == ["a__lookup", "b__lookup"]
    with pytest.raises(ValueError, match=r"'x\.y' and 'x_y' of server 'a'"):
        namespace([Listed("a", "x.y", "", {}), Listed("a", "x_y", "", {})])
    with pytest.raises(ValueError, match="longer than 64"):
        namespace([Listed("a", "t" * 70, "", {})])


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=10)


@given(st.dictionaries(st.text(max_size=8), _JSON, max_size=6), st.randoms())
def test_a_schema_digest_ignores_key_order_and_sees_any_change(
        schema: dict[str, object], rnd: object) -> None:
    """The digest of a schema is the same in any key order, and differs once a key is added."""
    keys = list(schema)
    rnd.shuffle(keys)  # type: ignore[attr-defined]
    assert schema_digest({k: schema[k] for k in keys}) == schema_digest(schema)
    assert schema_digest({**schema, "\x00added": 1}) != schema_digest(schema)


@given(st.lists(st.tuples(st.sampled_from(["a", "b-2", "files"]),
                          st.text(min_size=1, max_size=20)), max_size=12))
def test_namespaced_names_are_safe_unique_or_refused(tools: list[tuple[str, str]]) -> None:
    """Any listing either names every tool uniquely with a safe name of its server's
    prefix, or is refused."""
    listings = [Listed(server, tool, "", {}) for server, tool in dict.fromkeys(tools)]
    try:
        named = namespace(listings)
    except ValueError:
        return
    assert len(named) == len(listings)
    for name, listed in named.items():
        assert name.startswith(listed.server + "__") and len(name) <= MAX_NAME
        assert all(c.isascii() and (c.isalnum() or c in "_-") for c in name)


# --- a real server -------------------------------------------------------------------------


def _stdio(name: str, log: Path, *extra: str, delay: float = 0.0) -> ServerSpec:
    return ServerSpec(name, command=(sys.executable, "-m", "streams.testing.mcp_server",
                                     "--log", str(log), "--delay", str(delay), *extra))


async def _until(predicate: Callable[[], T], timeout: float = 60) -> T:
    """`predicate()` once it is true, polled without blocking the loop (a hang guard)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := predicate()):
        assert asyncio.get_running_loop().time() < deadline, "no progress"
        await asyncio.sleep(0.05)
    return value


def _lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
async def kb(tmp_path: Path) -> AsyncIterator[MCPTools]:
    """One stdio server, `kb`, with a 1 s call timeout."""
    tools = MCPTools([_stdio("kb", tmp_path / "kb.log")], call_timeout_s=1.0,
                     connect_timeout_s=120)
    try:
        yield tools
    finally:
        await tools.aclose()


async def _named(mcp: MCPTools) -> dict[str, Tool]:
    return {t.name: t for t in await mcp.tools()}


async def _in(context: RunContext, tool: Tool, arguments: dict[str, object]) -> ToolResult:
    """`call_tool` inside `context`, as an agent of a worker would."""
    async def agent() -> ToolResult:
        from streams.agents.runtime import _CURRENT
        _CURRENT.set(context)
        return await call_tool(tool, arguments)
    return await asyncio.create_task(agent())


async def test_a_call_carries_its_key_in_meta_and_is_replayed_not_called(
        kb: MCPTools, tmp_path: Path) -> None:
    """The server sees `run_id:step` under `io.threadline/idempotency-key`; the journaled
    result replays without a second call."""
    lookup = (await _named(kb))["kb__lookup"]
    assert lookup.parameters["required"] == ["query"]
    first = RunContext(run_id="run-a")
    result = await _in(first, lookup, {"query": "q"})
    assert result.content == {"query": "q", "fact": fact_for("q")}
    assert [(w, k) for w, k, *_ in _lines(tmp_path / "kb.log")] == [("start", "run-a:0"),
                                                                      ("done", "run-a:0")]
    again = RunContext(run_id="run-a", journal=list(first.journal))
    assert await _in(again, lookup, {"query": "q"}) == result
    assert len(_lines(tmp_path / "kb.log")) == 2  # replayed, not called


async def test_a_call_past_the_timeout_is_cancelled_and_the_model_hears_it(
        kb: MCPTools, tmp_path: Path) -> None:
    """Past THREADLINE_AGENT_MCP_CALL_TIMEOUT_S the server gets MCP's cancellation and
    the step's result is a `timed_out` error; the run goes on."""
    context = RunContext(run_id="run-t")
    result = await _in(context, (await _named(kb))["kb__slow"], {"seconds": 30})
    assert result.error is not None and result.error.startswith("timed_out: MCP tool 'kb__slow'")
    assert len(context.journal) == 1
    await _until(lambda: ["cancelled", "run-t:0"] in [line[:2] for line in _lines(tmp_path / "kb.log")])



async def test_a_cancelled_execution_cancels_its_call_in_flight(kb: MCPTools, tmp_path: Path) -> None:
    """An execution cancelled (deposed, the run cancelled) mid-call sends the server
    `notifications/cancelled`: the handler stops, nothing is journaled."""
    slow = (await _named(kb))["kb__slow"]
    context = RunContext(run_id="run-c")
    kb.call_timeout_s = 60
    task = asyncio.create_task(_in(context, slow, {"seconds": 0.9 * 60}))
    await _until(lambda: ["start", "run-c:0"] in [line[:2] for line in _lines(tmp_path / "kb.log")])

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: ["cancelled", "run-c:0"] in [line[:2] for line in _lines(tmp_path / "kb.log")])

    assert context.journal == []


async def test_a_result_past_the_step_cap_goes_back_to_the_model_refused(kb: MCPTools) -> None:
    """A result over THREADLINE_MAX_STEP_BYTES is not recorded: the model gets
    `result refused: step_too_large` (recorded instead) and the run goes on."""
    context = RunContext(run_id="run-b", limits=JournalLimits(max_entry_bytes=1000))
    result = await _in(context, (await _named(kb))["kb__big"], {"size": 5000})
    assert result.error is not None and result.error.startswith("result refused: step_too_large")
    assert len(context.journal) == 1 and len(context.journal[0].output_json) < 1000
    small = await _in(context, (await _named(kb))["kb__big"], {"size": 10})
    assert small.content == {"result": "x" * 10}  # the SDK wraps a str in structured content


async def test_two_servers_with_one_tool_name_are_both_callable(tmp_path: Path) -> None:
    """Two servers both serving `lookup`: the agent sees `a__lookup` and `b__lookup`,
    and each call reaches its own server."""
    mcp = MCPTools([_stdio("a", tmp_path / "a.log"), _stdio("b", tmp_path / "b.log")],
                   connect_timeout_s=120)
    try:
        named = await _named(mcp)
        assert {"a__lookup", "b__lookup"} <= set(named)
        context = RunContext(run_id="run-2")
        await _in(context, named["b__lookup"], {"query": "x"})
        await _in(context, named["a__lookup"], {"query": "y"})
        assert [line[:2] for line in _lines(tmp_path / "b.log")] == [["start", "run-2:0"],
                                                                    ["done", "run-2:0"]]
        assert [line[:2] for line in _lines(tmp_path / "a.log")] == [["start", "run-2:1"],
                                                                    ["done", "run-2:1"]]
    finally:
        await mcp.aclose()


def _children(marker: str) -> list[int]:
    """This process's child processes whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and marker in cmdline:
                found.append(int(entry.name))
    return found


async def test_a_server_killed_mid_call_fails_the_attempt_retryably_and_is_restarted(
        tmp_path: Path) -> None:
    """The stdio server is SIGKILLed inside a call: the attempt fails retryably, the
    session is started again (a new server process), and the next attempt's call, with
    the same key, completes. The killed call is the window: a `start` without `done`."""
    log = tmp_path / "kb.log"
    mcp = MCPTools([_stdio("kb", log, delay=30)], connect_timeout_s=120)
    try:
        lookup = (await _named(mcp))["kb__lookup"]
        (pid,) = _children("streams.testing.mcp_server")
        task = asyncio.create_task(_in(RunContext(run_id="run-k"), lookup, {"query": "q"}))
        await _until(lambda: ["start", "run-k:0"] in [line[:2] for line in _lines(log)])
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(AgentError, match="went away during a call") as failed:
            await task
        assert failed.value.retryable
        server = mcp.servers["kb"]
        await server.ready()
        assert server.starts == 2 and _children("streams.testing.mcp_server") != [pid]
    finally:
        await mcp.aclose()
    assert _children("streams.testing.mcp_server") == []  # stopped on close
    # The next attempt, against a quick server, calls again with the same key.
    mcp = MCPTools([_stdio("kb", log)], connect_timeout_s=120)
    try:
        context = RunContext(run_id="run-k")
        await _in(context, (await _named(mcp))["kb__lookup"], {"query": "q"})
    finally:
        await mcp.aclose()
    lines = [line[:2] for line in _lines(log)]
    assert lines == [["start", "run-k:0"], ["start", "run-k:0"], ["done", "run-k:0"]]


class _Stub:
    """Stands for MCPTools in the expected text: `kb__lookup` answering like the server."""

    async def tools(self) -> Sequence[Tool]:
        async def lookup(arguments: object, context: ToolContext) -> ToolResult:
            query = str(dict(arguments)["query"])  # type: ignore[call-overload]
            return ToolResult({"query": query, "fact": fact_for(query)})
        return (Tool("kb__lookup", "", {}, lookup),)

    async def aclose(self) -> None:
        return None


async def _attempt(agent: BuiltinAgent, journal: Sequence[JournalEntry]) -> tuple[str, RunContext]:
    context = RunContext(run_id="run-r", journal=list(journal))
    outputs = [o async for o in drive(agent, (), "renamed", context)]
    return "".join(getattr(o, "text", "") for o in outputs), context


@pytest.mark.parametrize("change", ["--rename", "--schema-v2"])
async def test_a_tool_changed_between_attempts_fails_only_when_replay_needs_it(
        tmp_path: Path, change: str) -> None:
    """Attempt 1 calls `kb__lookup` twice. The server is redeployed with the tool renamed
    (or its schema changed): an attempt that must replay a recorded call of it fails
    as a journal mismatch, not retryably, naming the tool; one whose journal stops
    before the first call goes on with the new list (the model hears that the tool
    is gone, or the server refuses the old arguments)."""
    before = MCPTools([_stdio("kb", tmp_path / "v1.log")], connect_timeout_s=120)
    try:
        agent = BuiltinAgent(tokens_per_s=0, words=2, tools=2, mcp_tool="kb__lookup", mcp=before)
        text, first = await _attempt(agent, [])
    finally:
        await before.aclose()
    assert [e.kind for e in first.journal] == ["model_turn", "tool_call", "model_turn", "tool_call"]
    assert fact_for("renamed #2") in text
    after = MCPTools([_stdio("kb", tmp_path / "v2.log", change)], connect_timeout_s=120)
    try:
        agent = BuiltinAgent(tokens_per_s=0, words=2, tools=2, mcp_tool="kb__lookup", mcp=after)
        why = "no longer exists" if change == "--rename" else "changed its input schema"
        with pytest.raises(AgentError, match=f"journal mismatch at step 1: .*'kb__lookup'.*{why}") \
                as failed:
            await _attempt(agent, first.journal[:2])
        assert not failed.value.retryable
        text, second = await _attempt(agent, first.journal[:1])  # only the first turn
        results = [json.loads(e.output_json) for e in second.journal if e.kind == "tool_call"]
        assert len(results) == 2 and all("error" in r for r in results), results
        assert text.startswith("Step 1: looking up") and text.endswith("Facts: .")
    finally:
        await after.aclose()


async def test_over_http_the_headers_reference_the_environment_and_stay_out_of_logs(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A streamable-HTTP server gets the headers with `${NAME}` resolved (the test server
    logs the `X-Threadline-Worker` header as the caller); no log line holds a value."""
    from streams.testing.process import ChildProcess

    port_file = tmp_path / "port"
    server = ChildProcess("mcp", ["-m", "streams.testing.mcp_server", "--transport", "http",
                                  "--port-file", str(port_file), "--log", str(tmp_path / "h.log")],
                          {}, tmp_path / "mcp.out").start()
    caplog.set_level(logging.DEBUG)
    port = await asyncio.to_thread(server.wait_for_file, port_file)
    mcp = MCPTools([ServerSpec("h", url=f"http://127.0.0.1:{port}/mcp",
                               headers={"X-Threadline-Worker": "${WHO}",
                                        "Authorization": "Bearer ${SECRET}"})],
                   connect_timeout_s=120, environ={"WHO": "w7", "SECRET": "hunter2-secret"})
    try:
        await _in(RunContext(run_id="run-h"), (await _named(mcp))["h__lookup"], {"query": "q"})
    finally:
        await mcp.aclose()
        server.kill9()
    assert [line[:3] for line in _lines(tmp_path / "h.log")] == [["start", "run-h:0", "w7"],
                                                                ["done", "run-h:0", "w7"]]
    assert not any("hunter2" in r.getMessage() for r in caplog.records)


async def test_the_openai_agent_calls_mcp_tools_and_replays_any_cut(tmp_path: Path) -> None:
    """The OpenAI agent, against the scripted model, offers the MCP tools (namespaced)
    and calls `kb__lookup` three times through the journal; a journal cut anywhere
    replays the recorded calls without calling the server again."""
    from streams.agents.openai import OpenAIAgent
    from streams.testing.openai_server import ScriptedOpenAI

    log = tmp_path / "kb.log"
    message = "where is my parcel [tools=3]"
    mcp = MCPTools([_stdio("kb", log)], connect_timeout_s=120)
    async with ScriptedOpenAI() as model:
        agent = OpenAIAgent(model.base_url, api_key="k", mcp=mcp)
        agent.start()
        try:
            first = RunContext(run_id="run-o")
            outputs = [o async for o in drive(agent, (), message, first)]
            calls = [e for e in first.journal if e.kind == "tool_call"]
            assert [e.name for e in calls] == ["kb__lookup"] * 3
            assert [json.loads(e.output_json)["content"]["fact"] for e in calls] == [
                fact_for(f"{message} #{k}") for k in (1, 2, 3)]
            text = "".join(getattr(o, "text", "") for o in outputs)
            assert fact_for(f"{message} #3") in text
            assert [x[:2] for x in _lines(log) if x[0] == "done"] == [
                ["done", "run-o:1"], ["done", "run-o:3"], ["done", "run-o:5"]]
            for cut in range(len(first.journal) + 1):
                before = len(_lines(log))
                again = RunContext(run_id="run-o", journal=list(first.journal[:cut]))
                replayed = [o async for o in drive(agent, (), message, again)]
                assert "".join(getattr(o, "text", "") for o in replayed) == text
                assert again.journal == first.journal
                # Only the calls past the cut reach the server (which dedupes their keys).
                new = [x[1] for x in _lines(log)[before:] if x[0] in ("start", "dedup")]
                assert new == [f"run-o:{s}" for s in (1, 3, 5) if s >= cut]
        finally:
            await agent.aclose()
