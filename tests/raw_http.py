"""A raw HTTP/1.1 request over a socket: for bytes no HTTP client library will send
(invalid UTF-8 or controls in header values)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class RawAnswer:
    """A raw HTTP answer: status, headers and body bytes."""
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


async def raw_request(url: str, method: str, path: str, headers: list[tuple[bytes, bytes]],
                      body: bytes = b"") -> RawAnswer:
    """Send exactly these header bytes; read the answer's status, headers and body
    (up to 64 KiB: enough for a problem, and an SSE stream's first frames)."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    try:
        lines = [f"{method} {path} HTTP/1.1".encode(), f"Host: {where.netloc}".encode(),
                 b"Connection: close", f"Content-Length: {len(body)}".encode()]
        lines += [name + b": " + value for name, value in headers]
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        found = {}
        for line in filter(None, header_lines):
            name, _, value = line.partition(":")
            found[name.strip().lower()] = value.strip()
        if "content-length" in found:
            data = await reader.readexactly(int(found["content-length"]))
        else:
            data = await _some(reader)
        return RawAnswer(int(status_line.split()[1]), found, data)
    finally:
        writer.close()


async def _some(reader: asyncio.StreamReader) -> bytes:
    """A chunked or unframed body: whatever arrives first (streams stay open)."""
    return await reader.read(65_536)
