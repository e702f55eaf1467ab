"""MCP servers as tool sources, the pure part: the servers' settings, the tools' names
and the digests of their schemas. No I/O here; `streams.agents.mcp` owns the sessions.

- `parse_servers(raw)`: `THREADLINE_AGENT_MCP_SERVERS`, a JSON object naming each
  server: `{"files": {"command": ["npx", "server-files", "/srv"], "env": {...}},
  "tickets": {"url": "https://.../mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}}`.
  A header or env value may reference the worker's environment as `${NAME}`; the
  reference is kept as written (`describe` shows header names, never values) and
  resolved by `expand` when the server is started.
- `tool_name(server, tool)`: the name the agent (and the model) sees, `server__tool`,
  characters outside `[A-Za-z0-9_-]` replaced by `_`; `namespace` builds the map from
  every server's listing and refuses two tools that would get one name.
- `schema_digest(schema)`: a short digest of a tool's input schema; the journal
  records it with each call, and a replay whose tool's digest differs (or whose tool
  is gone) fails as a journal mismatch does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["IDEMPOTENCY_META_KEY", "MAX_NAME", "SEPARATOR", "Listed", "ServerSpec", "describe",
           "expand", "namespace", "parse_servers", "schema_digest", "tool_name"]

# The `_meta` key of each tools/call request that carries the call's idempotency key.
IDEMPOTENCY_META_KEY = "io.threadline/idempotency-key"
SEPARATOR = "__"
MAX_NAME = 64  # OpenAI's function names: ^[a-zA-Z0-9_-]{1,64}$
MAX_SERVERS = 32
MAX_SETTING_CHARS = 65_536
_SERVER_NAME = re.compile(r"^[A-Za-z0-9-]{1,32}$")  # no "_": the separator stays unambiguous
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One MCP server: a stdio command line, or a streamable-HTTP URL with headers."""

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)  # values may hold ${NAME}
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)  # values may hold ${NAME}

    @property
    def transport(self) -> str:
        """`stdio` or `http`."""
        return "http" if self.url is not None else "stdio"

    def __repr__(self) -> str:
        return f"ServerSpec({describe(self)})"


def describe(spec: ServerSpec) -> str:
    """The server for a log line: its command or URL, the names of its headers and
    env variables, never their values."""
    where = spec.url if spec.url is not None else " ".join(spec.command)
    extra = ""
    if spec.headers:
        extra += f" headers={sorted(spec.headers)}"
    if spec.env:
        extra += f" env={sorted(spec.env)}"
    return f"{spec.name} ({spec.transport}: {where}{extra})"


def _strings(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise ValueError(f"{what} must be an object of strings")
    return dict(value)


def parse_servers(raw: str | None) -> tuple[ServerSpec, ...]:
    """The servers of `THREADLINE_AGENT_MCP_SERVERS` (empty or unset: none); a bad value
    raises `ValueError` saying what is wrong, without echoing header values."""
    if raw is None or not raw.strip():
        return ()
    if len(raw) > MAX_SETTING_CHARS:
        raise ValueError(f"THREADLINE_AGENT_MCP_SERVERS is longer than {MAX_SETTING_CHARS} characters")
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"THREADLINE_AGENT_MCP_SERVERS is not JSON: {exc.args[0]}") from None
    if not isinstance(body, dict):
        raise ValueError("THREADLINE_AGENT_MCP_SERVERS must be a JSON object: {\"name\": {...}}")
    if len(body) > MAX_SERVERS:
        raise ValueError(f"THREADLINE_AGENT_MCP_SERVERS names more than {MAX_SERVERS} servers")
    specs = []
    for name, conf in body.items():
        where = f"MCP server {name!r}"
        if not _SERVER_NAME.match(name):
            raise ValueError(f"{where}: a name is 1-32 letters, digits or '-' (no '_')")
        if not isinstance(conf, dict):
            raise ValueError(f"{where}: expected an object with \"command\" or \"url\"")
        unknown = set(conf) - {"command", "env", "cwd", "url", "headers"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        if ("command" in conf) == ("url" in conf):
            raise ValueError(f"{where}: give exactly one of \"command\" (stdio) and \"url\" (HTTP)")
        if "url" in conf:
            url = conf["url"]
            if not isinstance(url, str) or not re.match(r"^https?://", url):
                raise ValueError(f"{where}: \"url\" must be an http:// or https:// URL")
            if "env" in conf or "cwd" in conf:
                raise ValueError(f"{where}: \"env\" and \"cwd\" are for stdio servers")
            specs.append(ServerSpec(name, url=url,
                                    headers=_strings(conf.get("headers", {}), f"{where}: \"headers\"")))
            continue
        command = conf["command"]
        if isinstance(command, str):
            command = command.split()
        if not isinstance(command, list) or not command or not all(
                isinstance(c, str) and c for c in command):
            raise ValueError(f"{where}: \"command\" must be a non-empty list of strings")
        if "headers" in conf:
            raise ValueError(f"{where}: \"headers\" are for HTTP servers")
        cwd = conf.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise ValueError(f"{where}: \"cwd\" must be a string")
        specs.append(ServerSpec(name, command=tuple(command),
                                env=_strings(conf.get("env", {}), f"{where}: \"env\""), cwd=cwd))
    return tuple(specs)


def expand(values: Mapping[str, str], environ: Mapping[str, str], where: str) -> dict[str, str]:
    """`values` with each `${NAME}` replaced from `environ`; an unset one raises
    `ValueError` naming the variable (not the value)."""
    def one(key: str, value: str) -> str:
        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in environ:
                raise ValueError(f"{where}: {key!r} references ${{{name}}}, which is not set")
            return environ[name]
        return _REFERENCE.sub(sub, value)

    return {key: one(key, value) for key, value in values.items()}


def tool_name(server: str, tool: str) -> str:
    """The name an agent sees for `tool` of `server`: `server__tool`, made safe."""
    return f"{server}{SEPARATOR}{_UNSAFE.sub('_', tool)}"


def schema_digest(schema: Mapping[str, Any] | None) -> str:
    """A digest of an input schema, the same for the same JSON whatever its key order."""
    canonical = json.dumps(schema or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Listed:
    """A tool as a server listed it."""

    server: str
    tool: str  # the server's own name
    description: str
    schema: Mapping[str, Any]


def namespace(listings: Sequence[Listed]) -> dict[str, Listed]:
    """Each listed tool under its agent-facing name; `ValueError` for a name too long
    or two tools that would get the same name (the separator and the replaced
    characters can make two tools of one server collide)."""
    named: dict[str, Listed] = {}
    for listed in listings:
        name = tool_name(listed.server, listed.tool)
        if len(name) > MAX_NAME:
            raise ValueError(f"MCP tool {listed.tool!r} of server {listed.server!r}: {name!r} is "
                             f"longer than {MAX_NAME} characters")
        other = named.get(name)
        if other is not None:
            raise ValueError(f"MCP tools {other.tool!r} and {listed.tool!r} of server "
                             f"{listed.server!r} would both be named {name!r}")
        named[name] = listed
    return named
