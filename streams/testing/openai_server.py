"""A scripted OpenAI-compatible chat completions server, for tests and chaos.

The one stand-in for a model: it streams `chat.completion.chunk` events like the
real API, and what it answers depends only on the request, so every attempt of a
run gets the same turns:

- the user message (the last `user` message) may hold `[tools=N]`: while fewer
  than N `tool` messages follow it, the turn says `Calling <tool> (k/N).` and asks
  for one call of the first tool in the request's `tools`, its arguments split
  over two chunks (each required string argument is `<message> #k`);
- otherwise the turn is the answer: `Answer to <message>:` followed by every tool
  result it was given, in order, streamed word by word, then `stop`.

`GET /requests` lists, per request so far, the number of tool results it carried,
so a test can tell which turns the model was asked for. Run it as a process with
`python -m streams.testing.openai_server --port-file PATH` (it writes its port
there), or in process with `ScriptedOpenAI`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["ScriptedOpenAI", "answer_for", "main"]

_TOOLS = re.compile(r"\[tools=(\d+)\]")
_REQUESTS = web.AppKey("requests", list[int])
_DELAY = web.AppKey("delay", float)


def _conversation(messages: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """The last user message, and the tool results after it."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    user = str(messages[last_user].get("content") or "") if last_user >= 0 else ""
    results = [str(m.get("content") or "") for m in messages[last_user + 1:]
               if m.get("role") == "tool"]
    return user, results


def answer_for(user: str, results: list[str]) -> str:
    """The final answer the server gives for `user` after `results`."""
    return f"Answer to {user}: " + " | ".join(results) if results else f"Answer to {user}."


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 0,
            "model": "scripted", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


def _arguments(tool: dict[str, Any], value: str) -> str:
    schema = tool.get("function", {}).get("parameters") or {}
    properties = schema.get("properties") or {}
    names = schema.get("required") or list(properties)
    return json.dumps({n: value for n in names if properties.get(n, {}).get("type") == "string"})


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    messages = body.get("messages") or []
    user, results = _conversation(messages)
    request.app[_REQUESTS].append(len(results))
    wanted = int(m.group(1)) if (m := _TOOLS.search(user)) else 0
    tools = body.get("tools") or []
    frames: list[bytes] = [_chunk({"role": "assistant", "content": ""})]
    if wanted > len(results) and tools:
        k = len(results) + 1
        name = tools[0]["function"]["name"]
        arguments = _arguments(tools[0], f"{user} #{k}")
        frames += [_chunk({"content": "Calling "}), _chunk({"content": f"{name} ({k}/{wanted})."})]
        half = len(arguments) // 2
        frames.append(_chunk({"tool_calls": [{"index": 0, "id": f"call_{k}", "type": "function",
                                              "function": {"name": name,
                                                           "arguments": arguments[:half]}}]}))
        frames.append(_chunk({"tool_calls": [{"index": 0,
                                              "function": {"arguments": arguments[half:]}}]}))
        frames.append(_chunk({}, "tool_calls"))
    else:
        words = re.findall(r"\s*\S+", answer_for(user, results))
        frames += [_chunk({"content": w}) for w in words]
        frames.append(_chunk({}, "stop"))
    frames.append(b"data: [DONE]\n\n")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for frame in frames:
        await response.write(frame)
        await asyncio.sleep(request.app[_DELAY])
    await response.write_eof()
    return response


async def _requests(request: web.Request) -> web.Response:
    return web.json_response(request.app[_REQUESTS])


def create_app(chunk_delay_s: float = 0.0) -> web.Application:
    """The server's app: POST /v1/chat/completions, GET /requests."""
    app = web.Application()
    app[_REQUESTS] = list[int]()
    app[_DELAY] = chunk_delay_s
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_get("/requests", _requests)
    return app


class ScriptedOpenAI:
    """The server in this process: `async with ScriptedOpenAI() as server: server.base_url`."""

    def __init__(self, chunk_delay_s: float = 0.0) -> None:
        self.app = create_app(chunk_delay_s)
        self.runner = web.AppRunner(self.app)
        self.base_url = ""

    @property
    def requests(self) -> list[int]:
        """Per request so far: how many tool results it carried."""
        requests: list[int] = self.app[_REQUESTS]
        return list(requests)

    async def __aenter__(self) -> ScriptedOpenAI:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def main() -> None:
    """Serve until killed; the port goes to --port-file once listening."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    args = parser.parse_args()

    async def serve() -> None:
        runner = web.AppRunner(create_app(args.chunk_delay))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        if args.port_file:
            args.port_file.write_text(str(port))
        print(f"scripted openai server listening on port {port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
