"""The agents on their own: the builtin agent's determinism and switches, and the
OpenAI-compatible client against a small fake chat-completions server."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from streams.agents import (
    AgentCitations,
    AgentError,
    AgentOutput,
    AgentStep,
    TextChunk,
    create_agent,
)
from streams.agents.builtin import BuiltinAgent, reply_for
from streams.agents.openai import OpenAIAgent
from streams.config import Settings
from streams.core.records import HistoryMessage


async def _collect(outputs: AsyncIterator[AgentOutput]) -> list[AgentOutput]:
    return [o async for o in outputs]


def _text(outputs: Sequence[AgentOutput]) -> str:
    return "".join(o.text for o in outputs if isinstance(o, TextChunk))


# --- builtin -------------------------------------------------------------------------


async def test_builtin_echoes_then_streams_deterministic_words() -> None:
    """The builtin agent echoes the message, then words derived from it, alike each time, one per chunk."""
    agent = BuiltinAgent(tokens_per_s=0, words=7)
    first = await _collect(agent.run((), "hello there"))
    second = await _collect(agent.run((), "hello there"))
    other = await _collect(agent.run((), "something else"))
    assert _text(first) == _text(second) == reply_for("hello there", 7)
    assert _text(first).startswith("You said: hello there. ")
    assert len(_text(first).split()) == 4 + 7
    assert len(first) == 11  # one chunk per word
    assert _text(other) != _text(first)
    assert not [o for o in first if not isinstance(o, TextChunk)]


async def test_builtin_paces_tokens_at_the_configured_rate() -> None:
    """The builtin agent waits between tokens at its rate, and at the slow rate for [slow] messages."""
    start = time.monotonic()
    await _collect(BuiltinAgent(tokens_per_s=100, words=6).run((), "pace"))  # 9 tokens
    assert time.monotonic() - start >= 0.08
    start = time.monotonic()
    await _collect(BuiltinAgent(tokens_per_s=1000, slow_tokens_per_s=50, words=6).run((), "[slow]"))
    assert time.monotonic() - start >= 0.15


async def test_builtin_steps_and_citations_follow_the_text() -> None:
    """With steps on, the text is followed by a search call, its result and one citation."""
    outputs = await _collect(BuiltinAgent(tokens_per_s=0, words=3, steps=True).run((), "q"))
    kinds = [type(o).__name__ for o in outputs]
    assert kinds == ["TextChunk"] * 6 + ["AgentStep", "AgentStep", "AgentCitations"]
    steps = [o.step for o in outputs if isinstance(o, AgentStep)]
    assert [(s.kind, s.name) for s in steps] == [("tool_call", "search"), ("tool_result", "search")]
    assert json.loads(steps[0].payload_json) == {"query": "q"}
    citations = [c for o in outputs if isinstance(o, AgentCitations) for c in o.citations]
    assert len(citations) == 1 and citations[0].url.startswith("https://example.com/")


@pytest.mark.parametrize(("text", "retryable"), [("please [fail]", True),
                                                 ("please [fail-fatal]", False)])
async def test_builtin_failure_switches_fail_after_a_few_tokens(text: str, retryable: bool) -> None:
    """[fail] and [fail-fatal] raise a retryable and a fatal error after three tokens."""
    seen: list[AgentOutput] = []
    with pytest.raises(AgentError) as failure:
        async for output in BuiltinAgent(tokens_per_s=0).run((), text):
            seen.append(output)
    assert failure.value.retryable is retryable
    assert len(seen) == 3


async def test_builtin_hang_never_finishes() -> None:
    """[hang] yields three tokens and then never ends."""
    seen: list[AgentOutput] = []

    async def consume() -> None:
        async for output in BuiltinAgent(tokens_per_s=0).run((), "[hang]"):
            seen.append(output)

    consuming = asyncio.create_task(consume())
    while len(seen) < 3 and not consuming.done():  # a marker, not a deadline
        await asyncio.sleep(0.01)
    # "Never" as far as a test can see it: still running, with no fourth output, after
    # a pause (a busy machine only makes the pause look longer to the agent).
    await asyncio.sleep(0.2)
    assert not consuming.done() and len(seen) == 3, (consuming, seen)
    consuming.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consuming


def test_builtin_crash_exits_the_process_with_137_after_a_few_tokens() -> None:
    """[crash] kills the whole process with status 137 after three tokens."""
    script = ("import asyncio\n"
              "from streams.agents.builtin import BuiltinAgent\n"
              "async def main():\n"
              "    async for o in BuiltinAgent(tokens_per_s=0).run((), 'boom [crash]'):\n"
              "        print(o.text, flush=True)\n"
              "asyncio.run(main())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 137, done.stderr
    assert done.stdout.split() == ["You", "said:", "boom"]


def test_create_agent_picks_by_settings() -> None:
    """THREADLINE_AGENT picks the builtin or OpenAI agent with its settings; other names are refused."""
    builtin = create_agent(Settings.from_env({"THREADLINE_AGENT": "builtin",
                                              "THREADLINE_AGENT_TOKENS_PER_S": "7",
                                              "THREADLINE_AGENT_STEPS": "1"}))
    assert isinstance(builtin, BuiltinAgent)
    assert builtin.tokens_per_s == 7 and builtin.steps
    openai = create_agent(Settings.from_env({
        "THREADLINE_AGENT": "openai", "THREADLINE_AGENT_OPENAI_BASE_URL": "http://h:1/v1/",
        "THREADLINE_AGENT_OPENAI_MODEL": "m"}))
    assert isinstance(openai, OpenAIAgent)
    assert openai.url == "http://h:1/v1/chat/completions" and openai.model == "m"
    with pytest.raises(ValueError, match="unknown agent"):
        create_agent(Settings.from_env({"THREADLINE_AGENT": "nope"}))


# --- openai-compatible, against a fake server ------------------------------------------


@dataclass
class FakeOpenAI:
    """A chat-completions endpoint whose response each test scripts."""

    respond: Callable[[web.Request], Awaitable[web.StreamResponse]]
    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    url: str = ""


def _chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {"id": "c", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


async def _sse(request: web.Request, frames: Sequence[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for frame in frames:
        await response.write(frame)
        await asyncio.sleep(0.001)
    return response


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """A local server that answers chat completions with a scripted event stream."""
    async def default(request: web.Request) -> web.StreamResponse:
        return await _sse(request, [_chunk("Hel"), _chunk("lo"), _chunk(None, "stop"),
                                    b"data: [DONE]\n\n"])

    fake = FakeOpenAI(default)

    async def handle(request: web.Request) -> web.StreamResponse:
        fake.requests.append((dict(request.headers), await request.json()))
        return await fake.respond(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.url = f"http://127.0.0.1:{port}/v1"
    yield fake
    await runner.cleanup()


async def test_openai_streams_text_and_sends_history(fake_openai: FakeOpenAI) -> None:
    """The OpenAI agent sends key, model, system prompt and history, and yields the streamed text."""
    agent = OpenAIAgent(fake_openai.url, api_key="sk-test", model="tiny", system_prompt="be brief")
    history = (HistoryMessage("m1", "user", "earlier"), HistoryMessage("a1", "assistant", "reply"))
    try:
        outputs = await _collect(agent.run(history, "now"))
    finally:
        await agent.aclose()
    assert outputs == [TextChunk("Hel"), TextChunk("lo")]
    headers, body = fake_openai.requests[0]
    assert headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "tiny" and body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "reply"}, {"role": "user", "content": "now"}]


async def test_openai_parses_events_split_across_writes(fake_openai: FakeOpenAI) -> None:
    """Server-sent events cut at any byte, with comments, still parse into the text."""
    whole = (b": keep-alive\n\n" + _chunk("a b") + _chunk("c") + _chunk(None, "stop")
             + b"data: [DONE]\n\n")

    async def split(request: web.Request) -> web.StreamResponse:
        return await _sse(request, [whole[i:i + 7] for i in range(0, len(whole), 7)])

    fake_openai.respond = split
    agent = OpenAIAgent(fake_openai.url)
    try:
        assert _text(await _collect(agent.run((), "x"))) == "a bc"
    finally:
        await agent.aclose()


@pytest.mark.parametrize(("status", "retryable"), [(429, True), (500, True), (503, True),
                                                   (400, False), (401, False), (404, False)])
async def test_openai_maps_http_errors(
    fake_openai: FakeOpenAI, status: int, retryable: bool
) -> None:
    """429 and 5xx answers are retryable errors; other 4xx are not."""
    async def refuse(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "no"}}, status=status)

    fake_openai.respond = refuse
    agent = OpenAIAgent(fake_openai.url)
    try:
        with pytest.raises(AgentError) as failure:
            await _collect(agent.run((), "x"))
    finally:
        await agent.aclose()
    assert failure.value.retryable is retryable
    assert str(status) in str(failure.value)


async def test_openai_stream_cut_short_or_erroring_is_retryable(fake_openai: FakeOpenAI) -> None:
    """A stream that stops before its end, or carries an error, fails retryably."""
    async def cut(request: web.Request) -> web.StreamResponse:
        return await _sse(request, [_chunk("partial")])  # neither finish_reason nor [DONE]

    async def in_band_error(request: web.Request) -> web.StreamResponse:
        return await _sse(request, [_chunk("x"), b'data: {"error": {"message": "overloaded"}}\n\n'])

    agent = OpenAIAgent(fake_openai.url)
    try:
        for respond, message in ((cut, "ended before"), (in_band_error, "overloaded")):
            fake_openai.respond = respond
            with pytest.raises(AgentError, match=message) as failure:
                await _collect(agent.run((), "x"))
            assert failure.value.retryable
    finally:
        await agent.aclose()


async def test_openai_connection_refused_is_retryable() -> None:
    """An API that cannot be reached fails retryably."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agent = OpenAIAgent(f"http://127.0.0.1:{port}/v1", timeout_s=2)
    try:
        with pytest.raises(AgentError) as failure:
            await _collect(agent.run((), "x"))
    finally:
        await agent.aclose()
    assert failure.value.retryable
