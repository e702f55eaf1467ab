"""A webhook receiver for tests: records every request, fails the first N per key."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True)
class Received:
    idempotency_key: str
    timestamp: str
    signature: str
    body: bytes
    status: int


class WebhookReceiver:
    def __init__(self, fail_first: int = 0, fail_status: int = 500) -> None:
        self.fail_first, self.fail_status = fail_first, fail_status
        self.requests: list[Received] = []
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> WebhookReceiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def for_key(self, key: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.idempotency_key == key]

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        key = request.headers.get("Idempotency-Key", "")
        with self.lock:
            self.seen[key] += 1
            status = self.fail_status if self.seen[key] <= self.fail_first else 200
            self.requests.append(Received(key, request.headers.get("X-Threadline-Timestamp", ""),
                                          request.headers.get("X-Threadline-Signature", ""),
                                          body, status))
        return web.json_response({"ok": status == 200}, status=status)
