"""A test double of Slack: the documented Web API subset the connector calls, and
the Events API side that delivers signed callbacks and redelivers unacked ones.

Web API (under `/api/`, bearer token, JSON bodies for writes, query for reads):
`chat.postMessage` (with `metadata`), `chat.update`, `reactions.add`
(`already_reacted`), `conversations.history` and `conversations.replies`
(metadata only with `include_all_metadata=true`, `oldest`, cursor paging).
Every Nth call of a rate-limited method is answered 429 with `Retry-After`.
Calls of a held token wait at a gate until it is released (to freeze a caller
mid-call). With `redirect_to`, every call is answered with a redirect there
instead. Every posted message is recorded, with its edits and reactions, and
every call's client address (`peers`: one per TCP connection).

The server runs on its own thread and event loop, so blocking tests can use it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

SIGNING_SECRET = "test-signing-secret"
TEAM = "T0TEST"


@dataclass
class ChatMessage:
    """One message in the chat double, with its edits, reactions and outbox metadata."""
    channel: str
    ts: str
    text: str
    thread_ts: str | None
    user: str | None  # a person's message
    bot_token: str | None  # a message the bot posted, and with which token
    metadata: dict[str, Any] | None
    reactions: set[str] = field(default_factory=set)
    edits: list[str] = field(default_factory=list)

    @property
    def outbox_id(self) -> str | None:
        """The Threadline outbox id in the message's metadata, or None."""
        if not self.metadata or self.metadata.get("event_type") != "threadline_outbox":
            return None
        value = self.metadata.get("event_payload", {}).get("outbox_id")
        return value if isinstance(value, str) else None

    def as_api(self, with_metadata: bool) -> dict[str, Any]:
        """The message as Slack's Web API returns it (metadata only if asked for)."""
        out: dict[str, Any] = {"type": "message", "ts": self.ts, "text": self.text}
        if self.thread_ts:
            out["thread_ts"] = self.thread_ts
        if self.user:
            out["user"] = self.user
        if self.bot_token:
            out["bot_id"] = "B0BOT"
        if with_metadata and self.metadata:
            out["metadata"] = self.metadata
        if self.reactions:
            out["reactions"] = [{"name": n, "count": 1} for n in sorted(self.reactions)]
        return out


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 signature, written out here rather than imported from the code under test."""
    mac = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256)
    return "v0=" + mac.hexdigest()


class ChatDouble:
    """A local fake of the Slack Web and Events APIs, run on its own event loop thread."""
    def __init__(self, *, rate_limit_every: int = 0, retry_after_s: int = 1,
                 rate_limited: tuple[str, ...] = ("chat.postMessage", "conversations.replies",
                                                  "conversations.history"),
                 redirect_to: str = "", redirect_status: int = 302) -> None:
        self.rate_limit_every, self.retry_after_s = rate_limit_every, retry_after_s
        self.redirect_to, self.redirect_status = redirect_to, redirect_status
        self.peers: list[tuple[str, int]] = []
        self.rate_limited = rate_limited
        self.lock = threading.Lock()
        self.messages: list[ChatMessage] = []
        self.calls: list[tuple[str, str, int]] = []  # method, token, HTTP status
        self.counts: Counter[str] = Counter()
        self.held: dict[str, asyncio.Event] = {}
        self.waiting: Counter[str] = Counter()  # token -> calls waiting at the gate
        self._last_ts = 0.0
        self._runner: web.AppRunner | None = None
        self.port = 0

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> ChatDouble:
        """Start serving on a free port in a background thread."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        """Release held calls and stop the server and its loop."""
        for token in list(self.held):
            self.release(token)
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    @property
    def api_url(self) -> str:
        """The base URL of the fake Web API."""
        return f"http://127.0.0.1:{self.port}/api"

    # --- the gate -------------------------------------------------------------------------

    def hold(self, token: str) -> None:
        """Calls with `token` wait until `release(token)`."""
        self.held[token] = asyncio.Event()

    def release(self, token: str) -> None:
        """Let the held calls of this token go on."""
        event = self.held.pop(token, None)
        if event is not None:
            self._loop.call_soon_threadsafe(event.set)

    # --- what happened ----------------------------------------------------------------------

    def bot_posts(self, channel: str | None = None) -> list[ChatMessage]:
        """Every message the bot posted, in one channel or all."""
        with self.lock:
            return [m for m in self.messages if m.bot_token and (channel is None or m.channel == channel)]

    def message(self, channel: str, ts: str) -> ChatMessage | None:
        """The message at this channel and ts, or None."""
        with self.lock:
            return next((m for m in self.messages if m.channel == channel and m.ts == ts), None)

    def status_count(self, status: int) -> int:
        """How many API calls were answered with this HTTP status."""
        with self.lock:
            return sum(1 for _, _, s in self.calls if s == status)

    # --- the people's side: messages and Events API callbacks -----------------------------

    def _next_ts(self) -> str:
        with self.lock:
            self._last_ts = max(time.time(), self._last_ts + 0.000001)
            return f"{self._last_ts:.6f}"

    def user_message(self, channel: str, text: str, *, thread_ts: str | None = None,
                     channel_type: str = "channel", user: str = "U0PERSON") -> dict[str, Any]:
        """A person writes `text`: it enters the channel's history; the event callback
        Slack would send for it is returned."""
        ts = self._next_ts()
        with self.lock:
            self.messages.append(ChatMessage(channel, ts, text, thread_ts, user, None, None))
        event: dict[str, Any] = {"type": "message", "channel": channel, "user": user,
                                 "text": text, "ts": ts, "channel_type": channel_type,
                                 "event_ts": ts}
        if thread_ts is not None:
            event["thread_ts"] = thread_ts
        return {"token": "legacy", "team_id": TEAM, "api_app_id": "A0APP", "type": "event_callback",
                "event_id": f"Ev{uuid.uuid4().hex[:10].upper()}", "event_time": int(time.time()),
                "event": event}

    @staticmethod
    def send(url: str, payload: dict[str, Any], *, secret: str = SIGNING_SECRET,
             timestamp: int | None = None, signed: bool = True, retry_num: int | None = None,
             timeout_s: float = 10.0) -> tuple[int, float]:
        """One signed delivery, as Slack makes it; returns (status, seconds taken)."""
        body = json.dumps(payload).encode()
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        headers = {"Content-Type": "application/json", "X-Slack-Request-Timestamp": stamp}
        if signed:
            headers["X-Slack-Signature"] = slack_signature(secret, stamp, body)
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = "http_error"
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        started = time.monotonic()
        try:
            with opener.open(request, timeout=timeout_s) as response:
                status = int(response.status)
        except urllib.error.HTTPError as exc:
            status = exc.code
            exc.close()
        except (urllib.error.URLError, OSError):
            status = 0
        return status, time.monotonic() - started

    def deliver(self, url: str, payload: dict[str, Any], *, attempts: int = 4,
                pause_s: float = 0.5) -> list[int]:
        """Deliver until acknowledged with 200, redelivering like Slack (faster)."""
        statuses: list[int] = []
        for attempt in range(attempts):
            status, _ = self.send(url, payload, retry_num=attempt or None)
            statuses.append(status)
            if status == 200:
                break
            time.sleep(pause_s)
        return statuses

    # --- the Web API --------------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        peer = request.transport.get_extra_info("peername") if request.transport else None
        with self.lock:
            self.peers.append((str(peer[0]), int(peer[1])) if peer else ("", 0))
        if self.redirect_to:
            with self.lock:
                self.calls.append((method, "", self.redirect_status))
            return web.Response(status=self.redirect_status,
                                headers={"Location": f"{self.redirect_to}/{method}"})
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip() if scheme == "Bearer" else ""
        if request.method == "POST" and request.content_type == "application/json":
            args: dict[str, Any] = await request.json()
        else:
            args = {**request.query, **(await request.post())}
        gate = self.held.get(token)
        if gate is not None:
            self.waiting[token] += 1
            try:
                await gate.wait()
            finally:
                self.waiting[token] -= 1
        status, reply, headers = self._handle(method, token, args)
        with self.lock:
            self.calls.append((method, token, status))
        return web.json_response(reply, status=status, headers=headers)

    def _handle(self, method: str, token: str, args: dict[str, Any]
                ) -> tuple[int, dict[str, Any], dict[str, str]]:
        if not token:
            return 200, {"ok": False, "error": "not_authed"}, {}
        self.counts[method] += 1
        if (self.rate_limit_every and method in self.rate_limited
                and self.counts[method] % self.rate_limit_every == 0):
            return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(self.retry_after_s)}
        handler = {
            "chat.postMessage": self._post, "chat.update": self._update,
            "reactions.add": self._react, "conversations.history": self._history,
            "conversations.replies": self._replies,
        }.get(method)
        if handler is None:
            return 200, {"ok": False, "error": "unknown_method"}, {}
        return 200, handler(token, args), {}

    def _post(self, token: str, args: dict[str, Any]) -> dict[str, Any]:
        channel, text = str(args.get("channel", "")), str(args.get("text", ""))
        if not channel.startswith(("C", "D")) or channel.startswith("CGONE"):
            return {"ok": False, "error": "channel_not_found"}
        metadata = args.get("metadata")
        if isinstance(metadata, str):
            metadata = json.loads(metadata)
        message = ChatMessage(channel, self._next_ts(), text, args.get("thread_ts"), None, token,
                              metadata if isinstance(metadata, dict) else None)
        with self.lock:
            self.messages.append(message)
        return {"ok": True, "channel": channel, "ts": message.ts, "message": message.as_api(True)}

    def _update(self, token: str, args: dict[str, Any]) -> dict[str, Any]:
        message = self.message(str(args.get("channel")), str(args.get("ts")))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        if message.bot_token is None:
            return {"ok": False, "error": "cant_update_message"}
        with self.lock:
            message.text = str(args.get("text", ""))
            message.edits.append(message.text)
        return {"ok": True, "channel": message.channel, "ts": message.ts, "text": message.text}

    def _react(self, token: str, args: dict[str, Any]) -> dict[str, Any]:
        message = self.message(str(args.get("channel")), str(args.get("timestamp")))
        if message is None:
            return {"ok": False, "error": "message_not_found"}
        name = str(args.get("name"))
        with self.lock:
            if name in message.reactions:
                return {"ok": False, "error": "already_reacted"}
            message.reactions.add(name)
        return {"ok": True}

    def _page(self, found: list[ChatMessage], args: dict[str, Any]) -> dict[str, Any]:
        with_metadata = str(args.get("include_all_metadata", "")).lower() in ("true", "1")
        oldest = float(args.get("oldest") or 0)
        found = [m for m in found if float(m.ts) >= oldest]
        start, limit = int(args.get("cursor") or 0), int(args.get("limit") or 100)
        page = found[start:start + limit]
        more = start + limit < len(found)
        return {"ok": True, "messages": [m.as_api(with_metadata) for m in page], "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}}

    def _history(self, token: str, args: dict[str, Any]) -> dict[str, Any]:
        channel = str(args.get("channel"))
        with self.lock:
            found = [m for m in self.messages if m.channel == channel
                     and (m.thread_ts is None or m.thread_ts == m.ts)]
        return self._page(sorted(found, key=lambda m: float(m.ts), reverse=True), args)

    def _replies(self, token: str, args: dict[str, Any]) -> dict[str, Any]:
        channel, parent = str(args.get("channel")), str(args.get("ts"))
        with self.lock:
            found = [m for m in self.messages if m.channel == channel
                     and (m.ts == parent or m.thread_ts == parent)]
        if not found:
            return {"ok": False, "error": "thread_not_found"}
        return self._page(sorted(found, key=lambda m: float(m.ts)), args)
