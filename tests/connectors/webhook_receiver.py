"""A webhook receiver for tests: records every request, fails the first N per key,
or answers every request with a redirect (`redirect_to`, `redirect_status`).
Requests to any other path are recorded too, with their Authorization header
(`elsewhere`): a trap for credentials a client re-sends after a redirect."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True)
class Received:
    """One webhook request received: its key, timestamp, signature, body and the status answered."""
    idempotency_key: str
    timestamp: str
    signature: str
    body: bytes
    status: int


@dataclass(frozen=True)
class Stray:
    """A request to any other path: a client that followed a redirect."""
    method: str
    path: str
    authorization: str | None


class WebhookReceiver:
    """A local webhook endpoint that records requests and fails or redirects as told."""
    def __init__(self, fail_first: int = 0, fail_status: int = 500, *, redirect_to: str = "",
                 redirect_status: int = 302) -> None:
        self.fail_first, self.fail_status = fail_first, fail_status
        self.redirect_to, self.redirect_status = redirect_to, redirect_status
        self.requests: list[Received] = []
        self.elsewhere: list[Stray] = []
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> WebhookReceiver:
        """Start serving on a free port in a background thread."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        app.router.add_route("*", "/{tail:.*}", self._stray)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        """The URL of the webhook endpoint."""
        return f"http://127.0.0.1:{self.port}/hook"

    def stop(self) -> None:
        """Stop the server and its loop."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def for_key(self, key: str) -> list[Received]:
        """Every request received with this idempotency key."""
        with self.lock:
            return [r for r in self.requests if r.idempotency_key == key]

    async def _stray(self, request: web.Request) -> web.Response:
        await request.read()
        with self.lock:
            self.elsewhere.append(Stray(request.method, request.path_qs,
                                        request.headers.get("Authorization")))
        return web.json_response({"ok": True, "ts": "1.000001"})

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        key = request.headers.get("Idempotency-Key", "")
        if self.redirect_to:
            with self.lock:
                self.requests.append(Received(key, "", "", body, self.redirect_status))
            return web.Response(status=self.redirect_status, headers={"Location": self.redirect_to})
        with self.lock:
            self.seen[key] += 1
            status = self.fail_status if self.seen[key] <= self.fail_first else 200
            self.requests.append(Received(key, request.headers.get("X-Threadline-Timestamp", ""),
                                          request.headers.get("X-Threadline-Signature", ""),
                                          body, status))
        return web.json_response({"ok": status == 200}, status=status)
