"""The load: threads posting messages, and SSE watchers following them.

Each thread has one client that creates it, opens its thread stream (a watcher)
and then, until posting stops, posts a message, waits for its run to end (told by
the watcher's terminal event, or by polling the thread over REST) and posts the
next. Every post carries an `Idempotency-Key`, so a post whose answer was lost
with a killed gateway is simply sent again. Sometimes a client posts the next
message while the run is still going: that earns a 409 (counted, expected) and
the message is posted again once the run ended. Some early posts double-text
instead (docs/multitask.md): `enqueue` (accepted at once, queued behind the run:
the next message waits for it) or `interrupt` (accepted at once, the run is
cancelled; only when nothing is queued, so the interrupted run is the previous
post's). Half the accepted runs also get a run watcher (`GET /v1/runs/{id}/events`).

Some turns fork instead (issue #30, docs/branches.md), once the previous run ended:
a regenerate of an earlier answer (`POST .../messages/{id}/regenerate` with an
`Idempotency-Key`; for some the key is sent once more after it is accepted, which
must name the same run) or an edit of an earlier user message (`POST
.../messages/{id}/edit`, new text under a new message id). Their draws come from a
random stream of their own, seeded like the rest.

Watchers reconnect with `Last-Event-ID` whenever their connection ends, whether a
gateway died or the watcher cut it on purpose after a random number of events.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
import uuid
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

import aiohttp

from chaos.audit import Post, Seen, WatchLog
from chaos.sse import AUTH, IDLE, Api, GaveUp, iter_sse
from streams.core.lifecycle import TERMINAL, Lifecycle, StreamEnd

__all__ = ["Load", "LoadConfig"]


@dataclass(frozen=True, slots=True)
class LoadConfig:
    """How the load behaves: threads, seed, and the shares of slow, impatient and cut clients."""
    threads: int
    seed: int
    slow_share: float = 0.15  # messages marked [slow]
    tools_share: float = 0.25  # messages marked [tools=2]: two journaled tool calls each
    impatient_share: float = 0.2  # posts sent while the previous run is still going
    enqueue_share: float = 0.15  # of those: with multitask_strategy enqueue
    interrupt_share: float = 0.1  # of those: with multitask_strategy interrupt
    regenerate_share: float = 0.06  # turns that regenerate an earlier answer (issue #30)
    edit_share: float = 0.04  # turns that edit an earlier user message
    resend_key_share: float = 0.3  # of the regenerates: the key sent once more
    run_watcher_share: float = 0.5
    mean_events_before_cut: float = 25.0  # deliberate cuts
    run_deadline_s: float = 150.0  # a run not ended this long after its post is stuck
    read_timeout_s: float = 30.0  # SSE silence (keep-alives count) before reconnecting


@dataclass
class Load:
    """The clients of a chaos run: posters and SSE watchers, and what they saw."""
    config: LoadConfig
    bases: list[str]
    posts: list[Post] = field(default_factory=list)
    watchers: list[WatchLog] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    ended: defaultdict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    end_seen: dict[str, float] = field(default_factory=dict)  # run -> when a client first saw it end
    # run -> when a client first saw each of its events, in order (chaos/recovery.py)
    seen_at: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    # the same, of its lifecycle events only: the processor's decisions
    decided_at: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    _seen_ids: set[tuple[str, str]] = field(default_factory=set)
    server_errors: list[str] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def run(self, posting_until: float, drain_until: float) -> None:
        """Post until `posting_until` (monotonic), then wait for everything to end,
        but not past `drain_until`."""
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            clients = [asyncio.create_task(self._thread(session, i, posting_until, drain_until))
                       for i in range(self.config.threads)]
            await asyncio.gather(*clients)
            if self.tasks:  # run watchers still reading
                _, late = await asyncio.wait(self.tasks, timeout=max(0, drain_until - time.monotonic()))
                for task in late:
                    task.cancel()
                await asyncio.gather(*self.tasks, return_exceptions=True)
        for post in self.posts:
            post.ended_at = self.end_seen.get(post.run_id)

    def saw(self, run_id: str, event_id: str, event: str) -> None:
        """Note when a client first saw this event of the run (and if it is a decision)."""
        if (run_id, event_id) not in self._seen_ids:
            self._seen_ids.add((run_id, event_id))
            self.seen_at[run_id].append(time.monotonic())
            if event in DECISIONS:
                self.decided_at[run_id].append(time.monotonic())

    def saw_end(self, run_id: str) -> None:
        """Note that a client saw this run end (the first time counts)."""
        self.end_seen.setdefault(run_id, time.monotonic())
        self.ended[run_id].set()

    # --- one thread's client ------------------------------------------------------------

    async def _thread(self, session: aiohttp.ClientSession, index: int, posting_until: float,
                      drain_until: float) -> None:
        rng = random.Random(self.config.seed * 1_000 + index)
        # The forks' draws come from their own stream, so the seed replays them and
        # the plain posts' draws stay as they were before forks were in the mix.
        branches = random.Random(f"branches/{self.config.seed}/{index}")
        api = Api(session, self.bases, rng)
        try:
            thread_id = await self._create(api, index, drain_until)
        except GaveUp as exc:
            self.stuck.append(f"thread {index}: {exc}")
            return
        log = WatchLog(f"thread-watcher-{index}", thread_id)
        self.watchers.append(log)
        opened, stop = asyncio.Event(), asyncio.Event()
        posted: list[Post] = []
        watcher = asyncio.create_task(self._watch(session, log, rng, opened, stop, posted,
                                                  drain_until))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(opened.wait(), 30)
        previous: Post | None = None
        number = 0
        try:
            while time.monotonic() < posting_until:
                draw = branches.random()
                targets = self._targets(posted) if draw < self.config.regenerate_share + \
                    self.config.edit_share else []
                if previous is not None and targets:
                    # A fork while no run is active: under `reject` (docs/branches.md)
                    # anything else would be a 409.
                    await self._until_ended(api, previous, drain_until)
                    target = branches.choice(targets)
                    if draw < self.config.regenerate_share:
                        post = await self._regenerate(
                            api, target, f"r-{number}",
                            branches.random() < self.config.resend_key_share, drain_until)
                    else:
                        post = await self._edit(api, target, index, number, drain_until)
                else:
                    post = await self._message(api, rng, thread_id, index, number, previous,
                                               drain_until)
                self.posts.append(post)
                posted.append(post)
                if rng.random() < self.config.run_watcher_share:
                    run_log = WatchLog(f"run-watcher-{index}-{number}", thread_id, post.run_id)
                    self.watchers.append(run_log)
                    self.tasks.append(asyncio.create_task(self._watch(
                        session, run_log, random.Random(rng.random()), asyncio.Event(),
                        asyncio.Event(), [post], drain_until)))
                previous, number = post, number + 1
                await asyncio.sleep(rng.uniform(0.0, 0.4))
            if previous is not None:
                await self._until_ended(api, previous, drain_until)
        except GaveUp as exc:
            self.stuck.append(f"thread {index}: {exc}")
        finally:
            stop.set()
            await watcher
            self.server_errors += api.server_errors

    async def _create(self, api: Api, index: int, deadline: float) -> str:
        status, body = await api.call("POST", "/v1/threads", body={"title": f"chaos {index}"},
                                      deadline=deadline)
        if status not in (201, 202):
            raise GaveUp(f"creating a thread answered {status}: {body}")
        thread_id = str(body["thread_id"])
        while True:  # a pending thread is usable once the processor has decided it
            status, _ = await api.call("GET", f"/v1/threads/{thread_id}", deadline=deadline)
            if status == 200:
                return thread_id
            if time.monotonic() > deadline:
                raise GaveUp(f"thread {thread_id} never appeared")
            await asyncio.sleep(0.3)

    async def _message(self, api: Api, rng: random.Random, thread_id: str, index: int,
                       number: int, previous: Post | None, drain_until: float) -> Post:
        """Post message `number` of the thread, early (a 409, or double-texted) or once
        the previous run ended, until it is accepted."""
        post = Post(thread_id, "", "")
        text = f"message {number} of thread {index}" + (
            " [slow]" if rng.random() < self.config.slow_share else "") + (
            " [tools=2]" if uses_tools(index, number, self.config.tools_share) else "") + (
            " [lookup]" if uses_tools(-1 - index, number, 0.5) else "")
        key = f"m-{number}"
        early = previous is not None and not self.ended[previous.run_id].is_set()
        draw = rng.random()
        if early and draw < self.config.enqueue_share:
            post.strategy = "enqueue"
        elif early and previous is not None and previous.strategy != "enqueue" and \
                draw < self.config.enqueue_share + self.config.interrupt_share:
            post.strategy, post.interrupts = "interrupt", previous.run_id
        if post.strategy != "reject":
            # Double-texting is never a conflict: resent (same key) until decided.
            while not post.accepted:
                await self._post(api, post, text, key, drain_until, pending_ok=True)
                if not post.accepted:
                    await asyncio.sleep(0.5)
        elif early and rng.random() < self.config.impatient_share:
            # Early: a 409, or accepted if the run just ended; `pending` may still
            # turn out a conflict, so then the message is sent again below.
            await self._post(api, post, text, key, drain_until, pending_ok=False)
        if not post.accepted:
            if previous is not None:
                await self._until_ended(api, previous, drain_until)
            while not post.accepted:  # a 409 now is not expected, but is retried
                await self._post(api, post, text, key, drain_until, pending_ok=True)
                if not post.accepted:
                    await asyncio.sleep(0.5)
        return post

    def _targets(self, posted: list[Post]) -> list[Post]:
        """The user messages a regenerate or edit may name: posted or edited ones whose
        own run was seen to end, not cancelled by a later post's interrupt."""
        interrupted = {p.interrupts for p in posted if p.interrupts is not None}
        return [p for p in posted if p.kind != "regenerate" and p.run_id in self.end_seen
                and p.run_id not in interrupted]

    async def _regenerate(self, api: Api, target: Post, key: str, resend: bool,
                          deadline: float) -> Post:
        """Regenerate the answer to `target` under `key`; with `resend`, send the key
        once more after it is accepted (it must name the same run, and run it once)."""
        post = Post(target.thread_id, target.message_id, "", kind="regenerate")
        path = f"/v1/threads/{target.thread_id}/messages/{target.message_id}/regenerate"
        body = {"multitask_strategy": "reject"}
        await self._fork(api, post, path, body, key, deadline)
        if resend:
            post.key_resent = True
            status, answer = await api.call("POST", path, body=body,
                                            headers={"Idempotency-Key": key}, deadline=deadline)
            post.statuses.append(status)
            if status == 202 and isinstance(answer, dict):
                post.run_ids.append(str(answer.get("run_id")))
        return post

    async def _edit(self, api: Api, target: Post, index: int, number: int,
                    deadline: float) -> Post:
        """Edit `target`: new text under a new message id, on a branch from its parent."""
        new_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"chaos/{target.thread_id}/edit/{number}"))
        post = Post(target.thread_id, new_id, "", kind="edit", edits=target.message_id)
        await self._fork(
            api, post, f"/v1/threads/{target.thread_id}/messages/{target.message_id}/edit",
            {"input_text": f"message {number} of thread {index}, edited", "message_id": new_id,
             "multitask_strategy": "reject"}, f"e-{number}", deadline)
        return post

    async def _fork(self, api: Api, post: Post, path: str, body: dict[str, str], key: str,
                    deadline: float) -> None:
        """Send a regenerate or edit with its key until it is decided and accepted. A 404
        (a gateway whose read model has not got the message yet) or a 409 is sent again."""
        while True:
            status, answer = await api.call("POST", path, body=body,
                                            headers={"Idempotency-Key": key}, deadline=deadline)
            post.statuses.append(status)
            if status == 202 and isinstance(answer, dict):
                post.run_id = str(answer["run_id"])
                post.run_ids.append(post.run_id)
                if answer.get("status") != "pending":
                    post.accepted, post.accepted_at = True, time.monotonic()
                    return
            elif status not in (404, 409):
                raise GaveUp(f"{post.kind} of {post.message_id} answered {status}: {answer}")
            if time.monotonic() > deadline:
                raise GaveUp(f"{post.kind} of {post.message_id} never accepted: {post.statuses}")
            await asyncio.sleep(0.5)

    async def _post(self, api: Api, post: Post, text: str, key: str, deadline: float, *,
                    pending_ok: bool) -> None:
        status, body = await api.call(
            "POST", f"/v1/threads/{post.thread_id}/user_message",
            body={"input_text": text, "multitask_strategy": post.strategy},
            headers={"Idempotency-Key": key}, deadline=deadline)
        post.statuses.append(status)
        if status == 202:
            post.message_id, post.run_id = str(body["message_id"]), str(body["run_id"])
            if pending_ok or body.get("status") != "pending":
                post.accepted, post.accepted_at = True, time.monotonic()
        elif status != 409:
            raise GaveUp(f"posting to {post.thread_id} answered {status}: {body}")

    async def _until_ended(self, api: Api, post: Post, drain_until: float) -> None:
        """Wait for the run to end: the watcher says so, or the thread's REST view does."""
        deadline = min(drain_until, (post.accepted_at or time.monotonic())
                       + self.config.run_deadline_s)
        event = self.ended[post.run_id]
        while not event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 1.0)
            if event.is_set():
                break
            status, body = await api.call("GET", f"/v1/threads/{post.thread_id}",
                                          deadline=deadline)
            runs = body.get("runs", []) if status == 200 and isinstance(body, dict) else []
            if any(r.get("run_id") == post.run_id and r.get("status") in
                   ("completed", "failed", "cancelled") for r in runs):
                self.saw_end(post.run_id)
            elif time.monotonic() > deadline:
                raise GaveUp(f"run {post.run_id} did not end within {self.config.run_deadline_s}s")

    # --- watchers ------------------------------------------------------------------------

    async def _watch(self, session: aiohttp.ClientSession, log: WatchLog, rng: random.Random,
                     opened: asyncio.Event, stop: asyncio.Event, posted: list[Post],
                     drain_until: float) -> None:
        """Follow the stream until every run posted is seen to its end (or told
        not streaming) and `stop` is set; reconnect with Last-Event-ID on any cut."""
        done: set[str] = set()
        last_id = ""
        lost_at: float | None = None

        def finished() -> bool:
            wanted = {p.run_id for p in posted}
            given_up = {r for r in log.unwatched if not log.runs.get(r)}
            return (log.run_id is not None or stop.is_set()) and \
                wanted <= done | log.not_streaming | given_up

        path = (f"/v1/runs/{log.run_id}/events" if log.run_id
                else f"/v1/threads/{log.thread_id}/stream")
        if log.run_id:
            stop.set()
        while not finished():
            if time.monotonic() > drain_until:
                waiting = sorted({p.run_id for p in posted} - done)
                self.stuck.append(f"{log.name}: still waiting for {waiting}")
                return
            if not last_id and posted and log.run_id is None:
                # No position yet: a fresh stream starts at the active run, so a run
                # that began and ended while we were away cannot be followed.
                log.unwatched |= {p.run_id for p in posted if not log.runs.get(p.run_id)}
            headers = {**AUTH, "Last-Event-ID": last_id} if last_id else dict(AUTH)
            budget = max(1, int(rng.expovariate(1 / self.config.mean_events_before_cut)))
            try:
                timeout = aiohttp.ClientTimeout(total=None, sock_connect=5,
                                                sock_read=self.config.read_timeout_s)
                base = rng.choice(self.bases)
                async with session.get(base + path, headers=headers, timeout=timeout) as response:
                    if response.status != 200:
                        await response.read()
                        if response.status >= 500 and response.status not in (502, 503, 504):
                            self.server_errors.append(f"GET {path}: {response.status}")
                        await asyncio.sleep(0.3)
                        continue
                    log.connects += 1
                    log.trail.append(f"{time.monotonic():.2f} {base} after {decode_id(last_id)}")
                    if lost_at is not None:
                        log.max_reconnect_s = max(log.max_reconnect_s, time.monotonic() - lost_at)
                    opened.set()
                    async for seen in iter_sse(response, idle_s=1.0):
                        if seen is IDLE:
                            if finished() or time.monotonic() > drain_until:
                                break
                            continue
                        if seen.event == StreamEnd.MESSAGE_NOT_STREAMING:
                            run = seen.fields.get("run_id")
                            if isinstance(run, str):
                                log.not_streaming.add(run)
                            continue
                        run = run_of(seen)
                        log.runs[run].append(seen)
                        self.saw(run, seen.id or f"{seen.event}:{len(log.runs[run])}", seen.event)
                        last_id = seen.id or last_id
                        if seen.event in TERMINAL:
                            self.saw_end(run)
                        if seen.event == StreamEnd.DONE:
                            done.add(run)
                        if finished():
                            return
                        budget -= 1
                        if budget <= 0:
                            log.cuts += 1
                            log.trail.append(f"{time.monotonic():.2f} cut")
                            break
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.trail.append(f"{time.monotonic():.2f} lost: {type(exc).__name__}")
            lost_at = time.monotonic()
            if finished():
                return
            await asyncio.sleep(rng.uniform(0.0, 0.2))


DECISIONS = frozenset(Lifecycle)  # the lifecycle events: what the processor decided


def uses_tools(thread: int, number: int, share: float) -> bool:
    """Whether message `number` of thread `thread` calls tools: a hash, so the clients'
    random draws (and with them earlier seeds' runs) stay as they were."""
    return zlib.crc32(f"{thread}:{number}".encode()) % 1000 < share * 1000


def decode_id(event_id: str) -> str:
    """An event id's text: `v2.{partition}.{offset}.{sub}.{run_start}.{mac}.{run_id}`."""
    try:
        return base64.urlsafe_b64decode(event_id + "=" * (-len(event_id) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return f"?{event_id}"


def run_of(seen: Seen) -> str:
    """The run an event belongs to: in its data, or (`done`) in its id."""
    run = seen.fields.get("run_id")
    if isinstance(run, str):
        return run
    return decode_id(seen.id).rsplit(".", 1)[-1]
