"""Tools from MCP servers, journaled like any tool: the sessions (the official `mcp` SDK).

`MCPTools(servers, ...)` owns one session per server (`streams.agents.mcp_names`
parses the settings and names the tools). An agent asks it for the current tools,
`await mcp.tools()`, and calls each through `streams.agents.runtime.call_tool` like a
function tool: recorded before the agent goes on, replayed (not called) once
recorded. Each `tools/call` request carries the call's idempotency key (`run_id:step`)
in its `_meta` under `io.threadline/idempotency-key`, is bounded by `call_timeout_s`
(past it the SDK sends `notifications/cancelled` and the model gets an error), and an
execution that is cancelled or deposed while a call is in flight sends the server
MCP's cancellation for it (the SDK does, when the calling task is cancelled).

The sessions start with the first `tools()` (the worker's first execution, or
`start()`), each in a task of its own: a stdio server is started as a child process,
an HTTP one connected to with its headers (`${NAME}` resolved from the environment
then; values are never logged). A session that ends (the server died, a ping failed)
is started again, with backoff; a call in flight when it ended fails the attempt
retryably (the next attempt calls again with the same key: the one window).
`aclose()` stops them all (the worker calls the agent's `aclose` at exit).

`MCPEnv` holds the settings: `THREADLINE_AGENT_MCP_SERVERS` (see `mcp_names`),
`THREADLINE_AGENT_MCP_CALL_TIMEOUT_S`, `THREADLINE_AGENT_MCP_CONNECT_TIMEOUT_S`,
`THREADLINE_AGENT_MCP_MAX_TOOLS`, and the builtin agent's `THREADLINE_AGENT_MCP_TOOL`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field

from streams.agents import AgentError
from streams.agents.mcp_names import (
    IDEMPOTENCY_META_KEY,
    Listed,
    ServerSpec,
    describe,
    expand,
    namespace,
    parse_servers,
    schema_digest,
)
from streams.agents.runtime import current
from streams.agents.tools import Tool, ToolContext, ToolError, ToolResult
from streams.aio import within
from streams.config import Settings
from streams.env import Section

__all__ = ["MCPEnv", "MCPTools"]

log = logging.getLogger(__name__)

_PING_INTERVAL_S = 1.0
_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0
_ERROR_CHARS = 500


class MCPEnv(Section):
    """The MCP settings (`Settings.worker.extra`; docs/agents.md, "Tools from MCP servers")."""

    servers: str | None = Field(None, alias="THREADLINE_AGENT_MCP_SERVERS")
    call_timeout_s: float = Field(60.0, gt=0, alias="THREADLINE_AGENT_MCP_CALL_TIMEOUT_S")
    connect_timeout_s: float = Field(30.0, gt=0, alias="THREADLINE_AGENT_MCP_CONNECT_TIMEOUT_S")
    max_tools: int = Field(256, ge=1, le=10_000, alias="THREADLINE_AGENT_MCP_MAX_TOOLS")
    tool: str | None = Field(None, alias="THREADLINE_AGENT_MCP_TOOL")  # the builtin agent's


class _Server:
    """One server's session, kept up by its own task."""

    def __init__(self, spec: ServerSpec, owner: MCPTools) -> None:
        self.spec = spec
        self.owner = owner
        self.session: Any = None  # mcp.ClientSession while up
        self.up = asyncio.Event()
        self.broken = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.starts = 0  # sessions started so far (a restart counts)
        self.last_error = ""

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._keep_up(), name=f"mcp-{self.spec.name}")

    async def _keep_up(self) -> None:
        backoff = _BACKOFF_FIRST_S
        while True:
            starts = self.starts
            try:
                await self._serve_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the server would not start, or its session broke
                if self.starts > starts:  # it was up: a new failure, not one more in a row
                    backoff = _BACKOFF_FIRST_S
                self.last_error = f"{type(exc).__name__}: {str(exc)[:_ERROR_CHARS]}"
                log.warning("MCP server %s: %s; starting it again in %.1f s",
                            describe(self.spec), self.last_error, backoff)
            finally:
                self.session = None
                self.up.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def _serve_once(self) -> None:
        from mcp import ClientSession  # the SDK only where servers are configured

        async with contextlib.AsyncExitStack() as stack:
            streams = await stack.enter_async_context(self._transport(stack))
            session = await stack.enter_async_context(ClientSession(*streams))
            await within(session.initialize(), self.owner.connect_timeout_s)
            self.starts += 1
            log.info("MCP server %s: session %d up", describe(self.spec), self.starts)
            self.broken.clear()
            self.session = session
            self.up.set()
            while True:  # until it breaks: a call saw the connection close, or a ping failed
                with contextlib.suppress(TimeoutError):
                    await within(self.broken.wait(), _PING_INTERVAL_S)
                if self.broken.is_set():
                    raise ConnectionError("the session closed")
                await session.send_ping()  # raises once the server is gone

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        spec = self.spec
        environ = self.owner.environ
        if spec.url is not None:
            import httpx2  # the SDK's HTTP client
            from mcp.client.streamable_http import streamable_http_client

            headers = expand(spec.headers, environ, f"MCP server {spec.name!r} header")
            # The SDK's own defaults (30 s; a response stream may stay open 300 s); a call
            # is bounded by THREADLINE_AGENT_MCP_CALL_TIMEOUT_S on top of these.
            client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
            stack.push_async_callback(client.aclose)
            return streamable_http_client(spec.url, http_client=client)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        env = expand(spec.env, environ, f"MCP server {spec.name!r} env")
        command, *args = spec.command
        return stdio_client(StdioServerParameters(command=command, args=args, env=env or None,
                                                  cwd=spec.cwd))

    def broke(self, session: Any) -> None:
        """`session` is gone (a call or a listing saw it close): start it again, and
        until then no caller is handed it."""
        if session is self.session:
            self.up.clear()
            self.broken.set()

    async def ready(self) -> Any:
        """The session, once up (`connect_timeout_s` at most: then a retryable error)."""
        self.start()
        try:
            await within(self.up.wait(), self.owner.connect_timeout_s)
        except TimeoutError:
            raise AgentError(f"MCP server {self.spec.name!r} is not up after "
                             f"{self.owner.connect_timeout_s:g} s: {self.last_error or 'starting'}",
                             retryable=True) from None
        return self.session

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None


class MCPTools:
    """The tools of MCP servers, for any agent: `await tools()` lists them (namespaced
    `server__tool`), each a `Tool` to call through `call_tool`."""

    def __init__(self, servers: Sequence[ServerSpec], *, call_timeout_s: float = 60.0,
                 connect_timeout_s: float = 30.0, max_tools: int = 256,
                 environ: Mapping[str, str] | None = None) -> None:
        names = [s.name for s in servers]
        if len(set(names)) != len(names):
            raise ValueError(f"two MCP servers have one name: {names}")
        self.call_timeout_s = call_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_tools = max_tools
        self.environ = dict(environ or {})
        self.servers = {s.name: _Server(s, self) for s in servers}

    @classmethod
    def from_settings(cls, settings: Settings) -> MCPTools | None:
        """The servers of THREADLINE_AGENT_MCP_*; None if none is configured."""
        env = MCPEnv.read(settings.worker.extra)
        servers = parse_servers(env.servers)
        if not servers:
            return None
        return cls(servers, call_timeout_s=env.call_timeout_s,
                   connect_timeout_s=env.connect_timeout_s, max_tools=env.max_tools,
                   environ=settings.worker.referenced)

    def start(self) -> None:
        """Start every server's session (in the background; `tools()` waits for them)."""
        for server in self.servers.values():
            server.start()

    async def _listing(self, server: _Server) -> list[Listed]:
        session = await server.ready()
        listed: list[Listed] = []
        cursor: str | None = None
        try:
            while True:
                from mcp.types import PaginatedRequestParams

                page = await within(
                    session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None),
                    self.connect_timeout_s)
                for tool in page.tools:
                    listed.append(Listed(server.spec.name, tool.name, tool.description or "",
                                         dict(tool.input_schema or {})))
                if len(listed) > self.max_tools:
                    raise AgentError(f"MCP server {server.spec.name!r} lists more than "
                                     f"{self.max_tools} tools (THREADLINE_AGENT_MCP_MAX_TOOLS)",
                                     retryable=False)
                cursor = page.next_cursor
                if not cursor:
                    return listed
        except AgentError:
            raise
        except Exception as exc:
            server.broke(session)
            raise AgentError(f"MCP server {server.spec.name!r}: listing its tools failed: "
                             f"{type(exc).__name__}: {str(exc)[:_ERROR_CHARS]}", retryable=True) from exc

    async def tools(self) -> tuple[Tool, ...]:
        """Every server's tools as they are now (an execution asks once, at its start).
        While it waits for a server (at most `connect_timeout_s`), the worker keeps
        beating as it does while a tool runs."""
        context = current()
        waiting, context.in_tool = context.in_tool, True
        try:
            listings = await asyncio.gather(*(self._listing(s) for s in self.servers.values()))
        finally:
            context.in_tool = waiting
        try:
            named = namespace([t for listing in listings for t in listing])
        except ValueError as exc:
            raise AgentError(str(exc), retryable=False) from None
        return tuple(self._tool(name, listed) for name, listed in named.items())

    def _tool(self, name: str, listed: Listed) -> Tool:
        server = self.servers[listed.server]
        timeout_s = self.call_timeout_s

        async def call(arguments: Mapping[str, Any], context: ToolContext) -> ToolResult:
            from mcp import MCPError
            from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

            session = await server.ready()
            try:
                result = await session.call_tool(
                    listed.tool, dict(arguments), read_timeout_seconds=timeout_s,
                    meta={IDEMPOTENCY_META_KEY: context.idempotency_key})
            except MCPError as exc:
                if exc.code == REQUEST_TIMEOUT:
                    raise ToolError(f"timed_out: MCP tool {name!r} did not answer in {timeout_s:g} s "
                                    "(THREADLINE_AGENT_MCP_CALL_TIMEOUT_S); the call was cancelled") \
                        from None
                if exc.code == CONNECTION_CLOSED:
                    server.broke(session)
                    raise AgentError(f"MCP server {listed.server!r} went away during a call of "
                                     f"{listed.tool!r} ({context.idempotency_key})",
                                     retryable=True) from None
                raise ToolError(f"MCP tool {name!r}: {exc.message[:_ERROR_CHARS]}") from None
            return _result(result)

        return Tool(name, listed.description, listed.schema or {"type": "object"}, call,
                    schema_digest=schema_digest(listed.schema))

    async def aclose(self) -> None:
        """Stop every session (and so every stdio server)."""
        await asyncio.gather(*(s.stop() for s in self.servers.values()))


def _result(result: Any) -> ToolResult:
    """An MCP `CallToolResult` as a `ToolResult`: its structured content if any, else
    its one text, else its content blocks; an error result goes to the model as one."""
    texts = [getattr(block, "text", None) for block in result.content]
    if result.is_error:
        raise ToolError(" ".join(t for t in texts if t)[:_ERROR_CHARS] or "the MCP tool failed")
    if result.structured_content is not None:
        return ToolResult(result.structured_content)
    if len(texts) == 1 and texts[0] is not None:
        return ToolResult(texts[0])
    return ToolResult([block.model_dump(mode="json", by_alias=True, exclude_none=True)
                       for block in result.content])
