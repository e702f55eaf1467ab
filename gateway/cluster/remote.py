"""A stream whose thread another gateway owns: served by the owner, through this one.

`RunStreams.open` (`gateway.live.run_stream`) opens a `RemoteEventStream` when the
thread's partition belongs to another gateway of the group: this gateway has
checked the client's key and answers in the client's protocol (native SSE, the AI
SDK's stream, LangGraph's parts: each adapter works on either kind of stream); the
owner runs the stream on its feed and sends it here as lines of JSON, one per item,
over one HTTP request signed as a hop (`gateway.cluster.hop`):

    GET /internal/v1/threads/{thread_id}/stream?run_id=&after=&last_message_id=
    {"events": [[partition, offset, sub, run_start, run_id, name, frame, data_at], ...]}
    {"gone": [thread_id, run_id, token]}
    {"start": [offset, sub, scan_from, run_id]}   where the stream began (first line)
    {"live": 1}            the catch-up (replay, window) is over
    {"keepalive": 1}
    {"end": "<reason>"}    the owner ended it: "done", "moved", "shutdown", "overflow"...

Forwarding, not redirecting: a redirect would hand the client an address behind
the load balancer, which it may not reach; EventSource follows redirects only to
the same origin (CORS otherwise), langgraph-sdk's httpx client follows none by
default, and a redirected POST (LangGraph's `runs/stream`, the AI SDK's chat)
could be sent twice. Here the client's request runs once where it arrived (a POST's
command is published there), and only the events come from the owner.

When the owner's stream ends before the stream is over (the partition moved at a
rebalance, the owner shut down or died), this gateway opens it again on the
partition's new owner right after the last event it delivered, or, if none was
delivered yet, where the stream began on the first owner (`start`: a fresh start on
the next owner could come later, and miss a run begun between): the client sees
neither a gap nor a repeat (positions only go up, and the resume token names the
place). It waits for the group to name an owner for as long as a dead gateway takes
to leave it (the session timeout) and a margin, then ends the stream: the client
resumes with its `Last-Event-ID`, as after any dropped connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp

from gateway.cluster.hop import HOP_HEADER, HopSigner
from gateway.cluster.owners import Claim, OwnerBoard
from gateway.http.auth import INTERNAL_PREFIX
from gateway.http.problems import Problem
from gateway.live.feed import NotOwned
from gateway.live.run_stream import KEEP_ALIVE, Gone, Item, KeepAlive, Start
from gateway.live.sse import SseEvent
from streams.observability.metrics import gateway_metrics

__all__ = ["INTERNAL_PREFIX", "Forwarder", "RemoteEventStream", "item_line", "owner_problem",
           "parse_start_param", "read_lines", "start_line", "start_param"]

log = logging.getLogger("threadline.gateway")

_LIVE, _END = object(), object()
_QUEUE_ITEMS = 256  # items read ahead of the client: then the owner's socket waits
_MAX_LINE = 8 * 1024 * 1024  # one batch of events, at most
_UNAVAILABLE_RETRY_S = 0.25  # this gateway's feed could not open the stream for now


@dataclass(frozen=True, slots=True)
class _Began:
    """Where the owner's stream began (its `start` line)."""

    start: Start


def start_line(start: Start) -> bytes:
    """The owner's first line: where the stream began."""
    offset, sub, scan_from, run_id = start
    return json.dumps({"start": [offset, sub, scan_from, run_id or ""]},
                      separators=(",", ":")).encode() + b"\n"


def start_param(start: Start) -> str:
    """Where a stream began, as the `start` query parameter of a re-open on the next
    owner (`parse_start_param` reads it there)."""
    offset, sub, scan_from, run_id = start
    return f"{offset}.{sub}.{scan_from}.{run_id or ''}"


def parse_start_param(raw: str | None) -> Start | None:
    """The `start` query parameter (`start_param`), or None without one; 400 if it is
    not a stream's start."""
    if not raw:
        return None
    try:
        offset, sub, scan_from, run_id = raw.split(".", 3)
        return int(offset), int(sub), int(scan_from), run_id or None
    except ValueError:
        raise Problem(400, "bad-request", "'start' is not a stream's start") from None


def item_line(item: Item | None, end: str | None = None) -> bytes:
    """One item as the owner sends it (None with `end`: the end; None alone: `live`)."""
    if isinstance(item, list):
        data: dict[str, Any] = {"events": [
            [e.partition, e.offset, e.sub, e.run_start, e.run_id, e.name, e.frame.decode(),
             e.data_at] for e in item]}
    elif isinstance(item, Gone):
        data = {"gone": [item.thread_id, item.run_id, item.token]}
    elif isinstance(item, KeepAlive):
        data = {"keepalive": 1}
    elif end is not None:
        data = {"end": end}
    else:
        data = {"live": 1}
    return json.dumps(data, separators=(",", ":")).encode() + b"\n"


async def read_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The lines of a byte stream, each at most `_MAX_LINE` (ValueError past it).
    Not aiohttp's `readline`: it raises LineTooLong past 512 KiB (not a ClientError:
    it ended the reader), and a window of a long thread is one line of thousands of
    events."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line
        if len(buffer) > _MAX_LINE:
            raise ValueError(f"a line of the owner's stream is over {_MAX_LINE} bytes")
    if buffer:
        yield buffer


def _parse(line: bytes) -> Item | str | object:
    data = json.loads(line)
    if "events" in data:
        return [SseEvent(p, o, s, rs, run, name, frame.encode(), at)
                for p, o, s, rs, run, name, frame, at in data["events"]]
    if "gone" in data:
        thread_id, run_id, token = data["gone"]
        return Gone(thread_id, run_id, token)
    if "keepalive" in data:
        return KEEP_ALIVE
    if "end" in data:
        return str(data["end"])
    if "start" in data:
        offset, sub, scan_from, run_id = data["start"]
        return _Began((int(offset), int(sub), int(scan_from), str(run_id) or None))
    return _LIVE


class Forwarder:
    """Opens streams on their owners: the owner map, the hop signer, one HTTP client."""

    def __init__(self, board: OwnerBoard, signer: HopSigner, owner_wait_s: float,
                 keepalive_s: float) -> None:
        self.board, self.signer = board, signer
        self.owner_wait_s, self.keepalive_s = owner_wait_s, keepalive_s
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The client of the hops (made on first use: it needs the loop)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0,
                                              sock_read=self.keepalive_s * 3))
        return self._session

    async def close(self) -> None:
        """Close the HTTP client."""
        if self._session is not None:
            await self._session.close()

    @contextlib.asynccontextmanager
    async def open(self, tenant: str, thread_id: str, partition: int, run_id: str | None,
                   after: str | None, last_message_id: str | None,
                   local: LocalStreams) -> AsyncIterator[RemoteEventStream]:
        """The stream, served by the partition's owner (this gateway's feed, should the
        partition come here meanwhile: `local`); Problem as the owner answers (400, 404,
        429), or 503 if no owner answers in time."""
        stream = RemoteEventStream(self, tenant, thread_id, partition, run_id, after,
                                   last_message_id, local)
        await stream.start()
        try:
            yield stream
        finally:
            await stream.aclose()

    async def request(self, claim: Claim, tenant: str, path_qs: str) -> aiohttp.ClientResponse:
        """GET `path_qs` on the owner `claim` names, as a hop for `tenant`."""
        hop = self.signer.sign(tenant, "GET", path_qs, time.time())
        return await self.session.get(claim.url + path_qs, headers={HOP_HEADER: hop})


class LocalStreams(Protocol):
    """This gateway's own side: whether it owns the partition now, and its feed's
    stream from a resume token."""

    def owns(self) -> bool:
        """Whether this gateway owns the stream's partition now."""
        ...

    def open(self, after: str | None,
             start: Start | None = None) -> contextlib.AbstractAsyncContextManager[Any]:
        """The stream on this gateway's feed (`RunStreams.open_local`), after `after`,
        or without one, from `start`."""
        ...


_LOCAL = object()  # the source of the stream is this gateway's own feed


class RemoteEventStream:
    """A stream served by the owner of its thread (see the module); used as
    `gateway.live.run_stream.EventStream` is."""

    def __init__(self, forwarder: Forwarder, tenant: str, thread_id: str, partition: int,
                 run_id: str | None, after: str | None, last_message_id: str | None,
                 local: LocalStreams) -> None:
        self._forwarder, self._tenant, self._partition = forwarder, tenant, partition
        self._after, self._last_message_id, self._local = after, last_message_id, local
        self.thread_id, self.run_id = thread_id, run_id
        self.keepalive_s = forwarder.keepalive_s
        self.last: tuple[int, int] = (-1, -1)
        self.done = False  # a run stream's `done` was delivered
        self.ended = False  # nothing more comes
        self._queue: asyncio.Queue[object] = asyncio.Queue(_QUEUE_ITEMS)
        self._reader: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._live_seen = False
        self._start: Start | None = None  # where the first owner's stream began

    # --- the sources: the owner, or this gateway's feed -----------------------------

    def _path(self) -> str:
        start = None if self._after is not None or self._start is None else \
            start_param(self._start)
        query = {k: v for k, v in (("run_id", self.run_id), ("after", self._after),
                                   ("last_message_id", self._last_message_id),
                                   ("start", start)) if v}
        path = f"{INTERNAL_PREFIX}threads/{self.thread_id}/stream"
        return f"{path}?{urlencode(query)}" if query else path

    async def start(self) -> None:
        """Open the stream's first source; a refusal is the owner's Problem, or 503 if
        no owner answered within the wait."""
        source = await self._connect(first=True)
        self._reader = asyncio.create_task(self._read(source))

    async def _connect(self, first: bool = False) -> object:
        """The partition's owner's response, or `_LOCAL` if it is this gateway now,
        waiting for the group to name one that answers; None if none did in time."""
        board = self._forwarder.board
        deadline = time.monotonic() + self._forwarder.owner_wait_s
        tried: set[bytes] = set()
        while True:
            if self._local.owns():
                return _LOCAL
            claim = board.owner(self._partition)
            if claim is not None and claim.key not in tried:
                try:
                    response = await self._forwarder.request(claim, self._tenant, self._path())
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    log.info("stream of %s: owner %s unreachable: %s", self.thread_id,
                             claim.url, exc)
                    tried.add(claim.key)
                else:
                    if response.status == 200:
                        gateway_metrics().forwarded_streams.inc()
                        return response
                    body = await response.read()
                    response.release()
                    if response.status not in (421, 502, 503):
                        log.log(logging.INFO if first else logging.WARNING,
                                "stream of %s: owner %s answered %d: %s", self.thread_id,
                                claim.url, response.status, body[:300])
                        if first:
                            raise owner_problem(response.status, body)
                        return None
                    # Not the owner (any more), or not ready yet (its start not found):
                    # ask it again shortly, or whoever the map names next.
                    if time.monotonic() <= deadline:
                        await board.changed(0.2)
                        continue
            if time.monotonic() > deadline:
                log.warning("stream of %s: no owner of partition %d answered in %.0f s",
                            self.thread_id, self._partition, self._forwarder.owner_wait_s)
                if first:
                    raise Problem(503, "unavailable", "no gateway serves this thread's stream "
                                  "now; retry", headers={"Retry-After": "1"})
                return None
            await board.changed(min(1.0, max(0.05, deadline - time.monotonic())))
            if claim is not None and board.owner(self._partition) != claim:
                tried.discard(claim.key)

    async def _read(self, source: object) -> None:
        """Each source's items into the queue, in turn: when one ends before the stream
        is over, the next opens right after the last event received."""
        unavailable_since: float | None = None
        try:
            while source is not None:
                if source is _LOCAL:
                    reason = await self._from_feed()
                else:
                    assert isinstance(source, aiohttp.ClientResponse)
                    reason = await self._from_owner(source)
                if reason == "done" or self.done or self.ended:
                    break
                if reason == "unavailable":
                    # As an owner's 503 is asked again: for as long as an owner is
                    # waited for, then the stream ends (the client resumes).
                    now = time.monotonic()
                    unavailable_since = unavailable_since or now
                    if now - unavailable_since > self._forwarder.owner_wait_s:
                        log.warning("stream of %s: this gateway could not serve it for "
                                    "%.0f s; ending it", self.thread_id,
                                    now - unavailable_since)
                        break
                    await asyncio.sleep(_UNAVAILABLE_RETRY_S)
                else:
                    unavailable_since = None
                self._last_message_id = None  # from here on, the last event received names it
                source = await self._connect()  # moved, shut down, dropped, too slow
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await self._queue.put(_END)

    async def _put(self, item: object) -> None:
        if isinstance(item, _Began):
            if self._start is None:  # the first owner's: later ones began from it
                self._start = item.start
            return
        if item is _LIVE:
            if self._live_seen:
                return  # a later source's catch-up is part of the live events here
            self._live_seen = True
        elif isinstance(item, list) and item:
            self._after = item[-1].event_id  # where the next source starts
        await self._queue.put(item)

    async def _from_owner(self, response: aiohttp.ClientResponse) -> str | None:
        reason: str | None = None
        try:
            async for line in read_lines(response.content.iter_chunked(1 << 16)):
                item = _parse(line)
                if isinstance(item, str):
                    reason = item
                    break
                await self._put(item)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
            log.info("stream of %s from its owner broke: %s", self.thread_id, exc)
        finally:
            response.release()
        return reason

    async def _from_feed(self) -> str | None:
        try:
            async with self._local.open(
                    self._after, None if self._after is not None else self._start) as stream:
                async for caught_up in stream.catch_up():
                    await self._put(caught_up)
                await self._put(_LIVE)
                async for item in stream.live():
                    await self._put(item)
                return str(stream.end_reason())
        except Problem as exc:
            # Unavailable for now (its read model behind a moment after the partition
            # came here, on a loaded machine): asked again, as an owner's 503 is. A
            # refusal (the thread or the position gone) ends the stream.
            log.log(logging.WARNING if exc.status >= 500 else logging.INFO,
                    "stream of %s on this gateway refused (%d): %s", self.thread_id,
                    exc.status, exc.detail)
            return "unavailable" if exc.status >= 500 else "done"
        except NotOwned:
            return "moved"  # moved on again before it opened here: ask the map

    # --- what EventStream offers --------------------------------------------------

    def take(self, events: list[SseEvent]) -> list[SseEvent]:
        """Of `events`, those new to the client, in order; they count as delivered."""
        new = []
        for event in events:
            if event.position <= self.last or self.done:
                continue
            new.append(event)
            self.last = event.position
            self.done = self.run_id is not None and event.terminal
        return new  # counted as written by the owner (threadline_gateway_sse_events_total)

    async def _next(self) -> object:
        if self.ended:
            return _END
        item = await self._queue.get()
        if item is _END:
            self.ended = True
        return item

    def catch_up(self) -> AsyncGenerator[list[SseEvent] | Gone, None]:
        """The owner's catch-up: `Gone`, the replayed events, its window."""
        return self._catch_up()

    async def _catch_up(self) -> AsyncGenerator[list[SseEvent] | Gone, None]:
        if self._live_seen and self._queue.empty():
            return
        while True:
            item = await self._next()
            if item is _END or item is _LIVE:
                return
            if isinstance(item, Gone):
                if self.run_id is not None:
                    self.ended = True
                yield item
                continue
            if isinstance(item, list):
                new = self.take(item)
                if new:
                    yield new

    def live(self) -> AsyncGenerator[list[SseEvent] | KeepAlive, None]:
        """The live events, or `KEEP_ALIVE`, until the stream is over."""
        return self._live()

    async def _live(self) -> AsyncGenerator[list[SseEvent] | KeepAlive, None]:
        while not self.done:
            item = await self._next()
            if item is _END:
                return
            if isinstance(item, KeepAlive):
                yield item
            elif isinstance(item, list):
                new = self.take(item)
                if new:
                    yield new
            elif isinstance(item, Gone) and self.run_id is not None:
                self.ended = True  # a re-open found its position gone
                return

    def __aiter__(self) -> AsyncGenerator[Item, None]:
        return self._items()

    async def _items(self) -> AsyncGenerator[Item, None]:
        async for item in self.catch_up():
            yield item
        async for batch in self.live():
            yield batch

    def attach(self, sink: Callable[[list[SseEvent]], bool]) -> None:
        """Pushed delivery after `catch_up`: each batch from the owner to `sink`."""
        async def pump() -> None:
            async for item in self.live():
                if isinstance(item, list) and not sink(item):
                    break
                if self.ended:  # the sink ended it (`finish`)
                    break

        self._pump = asyncio.create_task(pump())

    def finish(self) -> None:
        """End the stream here (its client has what it needs): after the batch being
        written, nothing more is."""
        self.ended = True

    async def idle(self) -> bool:
        """While attached: wait up to `keepalive_s`; False once the stream is over."""
        pump = self._pump
        if pump is None or pump.done() or self.ended:
            return False
        # asyncio.wait, not an await of the task: the pump's end, however it came,
        # must not be raised here (a cancelled pump would cancel the response's task).
        await asyncio.wait({pump}, timeout=self.keepalive_s)
        return not pump.done() and not self.ended

    async def aclose(self) -> None:
        """Stop reading from the owner."""
        for task in (self._pump, self._reader):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


def owner_problem(status: int, body: bytes) -> Problem:
    """The owner's refusal, as this gateway's."""
    try:
        data = json.loads(body)
        slug = str(data.get("type", "")).rsplit("/", 1)[-1] or "error"
        extra = {k: v for k, v in data.items() if k not in ("type", "title", "status", "detail",
                                                           "instance")}
        return Problem(status, slug, str(data.get("detail", "")), **extra)
    except (ValueError, AttributeError):
        return Problem(502, "bad-gateway", f"the thread's gateway answered {status}")

