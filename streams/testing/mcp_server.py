"""A real MCP server, written with the official SDK's `MCPServer` (mcp 1.x's `FastMCP`),
for the tests and the chaos program: it logs each tool execution with its key.

Tools:

- `lookup(query)`: a fact derived from the query (`fact_for`), after `--delay` seconds;
  appends `start <key> <who> <ms>` before the wait and `done <key> <who> <ms>` after
  it to `--log`, and `cancelled <key> <who> <ms>` if the call is cancelled meanwhile.
  It dedupes by key, as docs/agents.md asks of a server with side effects: a key
  whose `done` is in the log already (by any process) is answered again without
  doing it again, and logged `dedup <key> <who> <ms>`; a key still in progress (in
  any process: an HTTP call goes on after its killed caller's connection drops)
  is waited for first, under a lock file per key beside the log;
  `<key>` is the `io.threadline/idempotency-key` of the request's `_meta` (`-` if
  none); `<who>` is the caller: the `X-Threadline-Worker` header over HTTP, the
  parent process id over stdio (the worker that started the server);
- `slow(seconds)`: waits that long (logged like `lookup`), for timeouts;
- `big(size)`: a text of `size` characters, for the step cap.

`--rename` serves `lookup` as `find` (a redeploy that renamed it), `--schema-v2`
serves `lookup` with a second required argument (a changed schema).

Run it with `python -m streams.testing.mcp_server --log PATH` (stdio), or
`--transport http --port-file PATH` (streamable HTTP on 127.0.0.1, its port
written to the file, endpoint `/mcp`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from streams.agents.mcp_names import IDEMPOTENCY_META_KEY

__all__ = ["IDEMPOTENCY_META_KEY", "fact_for", "main", "server"]

_WORDS = ("amber", "orbit", "lantern", "meadow", "copper", "harbor", "violet", "summit")
MAX_BIG = 10_000_000


def fact_for(query: str) -> str:
    """The fact `lookup` answers for `query`: three words from its hash."""
    digest = hashlib.sha256(query.encode("utf-8", "surrogatepass")).digest()
    return " ".join(_WORDS[b % len(_WORDS)] for b in digest[:3])


def _log(path: str | None, what: str, key: str, who: str) -> None:
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key} {who} {time.time_ns() // 1_000_000}\n".encode())
    finally:
        os.close(fd)


def _done(path: str | None, key: str) -> bool:
    """Whether the log shows `key` done (a stand-in for a server's own table of keys)."""
    if not path or not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as lines:
        return any(line.startswith(f"done {key} ") for line in lines)


@contextlib.asynccontextmanager
async def _key_lock(path: str | None, key: str) -> AsyncIterator[None]:
    """Hold the key's lock: one execution of a key at a time across processes. An
    flock is let go when its holder dies, so a killed server leaves no stale lock."""
    if not path:
        yield
        return
    name = hashlib.sha256(key.encode()).hexdigest()[:16]
    fd = os.open(f"{path}.{name}.lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.02)
        yield
    finally:
        os.close(fd)  # lets the lock go


def _caller(ctx: Context[Any, Any]) -> tuple[str, str]:
    meta = ctx.request_context.meta or {}
    key = str(meta.get(IDEMPOTENCY_META_KEY) or "-")
    headers = getattr(ctx.request_context.request, "headers", None)  # HTTP: a starlette Request
    who = headers.get("x-threadline-worker") if headers is not None else None
    return key.replace(" ", "_"), (who or str(os.getppid())).replace(" ", "_")


def server(log: str | None, delay_s: float, *, rename: bool = False,
           schema_v2: bool = False) -> MCPServer[Any]:
    """The server with its tools, as the options describe."""
    mcp: MCPServer[Any] = MCPServer("threadline-test")

    async def timed(ctx: Context[Any, Any], seconds: float) -> None:
        key, who = _caller(ctx)
        _log(log, "start", key, who)
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            _log(log, "cancelled", key, who)
            raise
        _log(log, "done", key, who)

    async def once(ctx: Context[Any, Any], query: str) -> dict[str, str]:
        key, who = _caller(ctx)
        if key == "-":
            await timed(ctx, delay_s)
            return {"query": query, "fact": fact_for(query)}
        async with _key_lock(log, key):
            if _done(log, key):
                _log(log, "dedup", key, who)  # done before (the window): answered again
            else:
                await timed(ctx, delay_s)
        return {"query": query, "fact": fact_for(query)}

    if schema_v2:
        @mcp.tool(name="lookup", description="Look a fact up.")
        async def lookup_v2(query: str, language: str, ctx: Context[Any, Any]) -> dict[str, str]:
            return await once(ctx, query)
    else:
        @mcp.tool(name="find" if rename else "lookup", description="Look a fact up.")
        async def lookup(query: str, ctx: Context[Any, Any]) -> dict[str, str]:
            return await once(ctx, query)

    @mcp.tool(description="Wait that many seconds.")
    async def slow(seconds: float, ctx: Context[Any, Any]) -> str:
        await timed(ctx, min(max(seconds, 0.0), 3600.0))
        return f"waited {seconds} s"

    @mcp.tool(description="A text of that many characters.")
    async def big(size: int) -> str:
        return "x" * min(max(size, 0), MAX_BIG)

    return mcp


def main(argv: list[str] | None = None) -> None:
    """Serve over stdio (default) or streamable HTTP."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    parser.add_argument("--log", default=None, help="the tool execution log")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each lookup takes")
    parser.add_argument("--port", type=int, default=0, help="HTTP port (0: a free one)")
    parser.add_argument("--port-file", default=None, help="write the HTTP port here")
    parser.add_argument("--rename", action="store_true", help="serve lookup as find")
    parser.add_argument("--schema-v2", action="store_true", help="lookup takes a second argument")
    args = parser.parse_args(argv)
    mcp = server(args.log, args.delay, rename=args.rename, schema_v2=args.schema_v2)
    if args.transport == "stdio":
        asyncio.run(mcp.run_stdio_async())
        return
    port = args.port
    if port == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    if args.port_file:
        Path(args.port_file + ".tmp").write_text(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    asyncio.run(mcp.run_streamable_http_async(host="127.0.0.1", port=port))


if __name__ == "__main__":
    main()
