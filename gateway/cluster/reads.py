"""Reads of threads held by another gateway, for requests that must stay where they
arrived (`gateway.model.placement`: a request that published a command, or a stream).

The asking side (`RemoteReads`) sends one hop per read to the owner of the thread's
partition, as the owner map names it (`gateway.cluster.owners`):

    GET /internal/v1/reads/{op}?thread_id=&...      op: thread, run, current_messages,
                                                     threads
    {"state": <ThreadState, base64 of its Avro record>, ...}

States and messages travel in the wire format of the topics they were read from
(`streams.wire`), so both sides decode them with their codec. The owner serves a
read only of a partition it holds (else 421: the asking side waits for the map to
name the new owner, as a forwarded stream does). What the asking gateway learned
from the decisions it read (a thread created, a run accepted or ended a moment ago)
goes with the read, so the owner waits for those records as the asker would have.

`GET /v1/threads` and LangGraph's `threads/search` span every partition: each
gateway that owns some answers its page of the tenant's threads, and the pages are
merged on the order the read store lists by (updated_at descending, then thread id),
which the cursor names. Cost: one hop per other gateway per page. A run by its id
alone (`/v1/runs/{run_id}/events`) is asked of every other gateway unless this one
read the run's acceptance (which names its thread). A partition that comes to this
gateway while its owner is asked (a killed owner's) raises `NowHeldHere`: the read
model reads it here instead.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from gateway.cluster.owners import Claim, OwnerBoard
from gateway.cluster.remote import Forwarder, owner_problem
from gateway.http.auth import INTERNAL_PREFIX, TENANT
from gateway.http.problems import Problem
from gateway.kafka import partition_for
from gateway.keys import READ_MODEL
from gateway.model.placement import Hints, NowHeldHere
from gateway.model.read_model import ReadModel, RunView
from gateway.model.read_store import MessagePage, ThreadPage, listed_at, run_status
from streams.core.domain import ThreadState
from streams.core.records import MessageRecord
from streams.wire import Codec, new_meta

__all__ = ["READS_PATH", "RemoteReads", "internal_reads", "merge_pages"]

READS_PATH = INTERNAL_PREFIX + "reads/{op}"
_MAX_LIMIT = 1000


def _state_out(codec: Codec, state: ThreadState | None) -> str | None:
    return None if state is None else base64.b64encode(codec.encode_state(state)).decode()


def _state_in(codec: Codec, raw: object) -> ThreadState | None:
    return None if not isinstance(raw, str) else codec.decode_state(base64.b64decode(raw))


def _message_out(codec: Codec, record: MessageRecord | None, thread_id: str,
                 tenant: str) -> str | None:
    if record is None:
        return None
    return base64.b64encode(codec.encode_message(record, new_meta(thread_id, tenant, 0))).decode()


def _message_in(codec: Codec, raw: object) -> MessageRecord | None:
    return None if not isinstance(raw, str) else codec.decode_message(base64.b64decode(raw))[1]


def _hints_query(hints: Hints) -> dict[str, str]:
    created, accepted, ended = hints
    query = {"created": "1"} if created else {}
    if accepted is not None:
        query["accepted"] = accepted
    if ended is not None:
        query["ended"] = ended
    return query


def _cursor_key(state: ThreadState) -> tuple[int, bytes]:
    """The read store's listing order (`ReadStore.threads`)."""
    return -listed_at(state), state.thread_id.encode("utf-8", "surrogatepass")


def merge_pages(pages: list[ThreadPage], limit: int) -> ThreadPage:
    """One page of `limit` from the pages of the gateways, each the first of its
    threads after the same cursor: the first in the listing order of them all (a
    thread in two pages, a standby copy's and its owner's, once), more if any page
    had more or some were left out."""
    states: dict[str, ThreadState] = {}
    titles: dict[str, str] = {}
    more = False
    for page in pages:
        more = more or page.more
        for state in page.states:
            if state.thread_id not in states:
                states[state.thread_id] = state
                if state.thread_id in page.titles:
                    titles[state.thread_id] = page.titles[state.thread_id]
    merged = sorted(states.values(), key=_cursor_key)[:limit]
    return ThreadPage(merged, more or len(states) > limit,
                      {s.thread_id: titles[s.thread_id] for s in merged if s.thread_id in titles})


class RemoteReads:
    """`gateway.model.placement.ElsewhereReads` over hops to the owners."""

    def __init__(self, forwarder: Forwarder, codec: Codec, partitions: int,
                 here: Callable[[int], bool]) -> None:
        self.forwarder, self.codec, self.partitions = forwarder, codec, partitions
        self.here = here  # whether this gateway holds a partition (its read model's)

    @property
    def board(self) -> OwnerBoard:
        """The owner map's board."""
        return self.forwarder.board

    async def _get(self, claim: Claim, tenant: str, op: str,
                   query: dict[str, str]) -> tuple[int, bytes]:
        path_qs = f"{INTERNAL_PREFIX}reads/{op}?{urlencode(query)}"
        hop = self.forwarder.signer.sign(tenant, "GET", path_qs, time.time())
        async with self.forwarder.session.get(claim.url + path_qs,
                                              headers={"Threadline-Hop": hop}) as response:
            return response.status, await response.read()

    async def _ask(self, partition: int, tenant: str, op: str,
                   query: dict[str, str]) -> dict[str, Any]:
        """The owner of `partition`'s answer; waits (up to the forwarder's owner wait)
        for the map to name an owner that holds it. NowHeldHere if it comes here."""
        board = self.board
        deadline = time.monotonic() + self.forwarder.owner_wait_s
        while True:
            if self.here(partition):
                raise NowHeldHere(partition)
            claim = board.owner(partition)
            if claim is not None:
                answer = await self._try(claim, tenant, op, query)
                if answer is not None:
                    return answer
            if time.monotonic() > deadline:
                raise Problem(503, "unavailable", "no gateway serves this thread now; retry",
                              headers={"Retry-After": "1"})
            await board.changed(0.2)

    async def _try(self, claim: Claim, tenant: str, op: str,
                   query: dict[str, str]) -> dict[str, Any] | None:
        """`claim`'s gateway's answer, or None if it is gone or no longer holds what
        it claimed (unreachable, 502, 421); Problem as it answers otherwise."""
        try:
            status, body = await self._get(claim, tenant, op, query)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        if status == 200:
            answer: dict[str, Any] = json.loads(body)
            return answer
        if status in (421, 502):
            return None
        raise owner_problem(status, body)

    async def _gather(self, tenant: str, op: str, query: dict[str, str],
                      found: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """The answers of the owners of every partition not held here, each asked
        once for all the partitions it claims, until every such partition is covered
        by an answer or one answer is `found`. An owner that does not answer (killed,
        or it gave the partition up) is replaced by whoever the map names next for
        each of its partitions, not by its smallest one only; waits up to the owner
        wait for the map, as `_ask` does (503 past it), and raises NowHeldHere if a
        partition not held here when it began comes here (read it here)."""
        board = self.board
        deadline = time.monotonic() + self.forwarder.owner_wait_s
        held_at_start = {p for p in range(self.partitions) if self.here(p)}
        covered: set[int] = set(held_at_start)
        answers: list[dict[str, Any]] = []
        while True:
            owners: dict[str, Claim] = {}
            for partition in range(self.partitions):
                if partition in covered:
                    continue
                if self.here(partition):
                    raise NowHeldHere(partition)
                claim = board.owner(partition)
                if claim is not None:
                    owners.setdefault(claim.instance, claim)
            asked = list(owners.values())
            for claim, answer in zip(asked, await asyncio.gather(
                    *(self._try(c, tenant, op, query) for c in asked)), strict=True):
                if answer is None:
                    continue
                answers.append(answer)
                if found(answer):
                    return answers
                covered |= claim.partitions
            if len(covered) >= self.partitions:
                return answers
            if time.monotonic() > deadline:
                raise Problem(503, "unavailable", "a partition has no gateway now; retry",
                              headers={"Retry-After": "1"})
            await board.changed(0.2)

    async def thread(self, tenant: str, thread_id: str, hints: Hints) -> ThreadState | None:
        """The thread as its owner reads it after catching up."""
        answer = await self._ask(self._partition(thread_id), tenant, "thread",
                                 {"thread_id": thread_id, **_hints_query(hints)})
        return _state_in(self.codec, answer.get("state"))

    def _run_in(self, answer: dict[str, Any]) -> RunView | None:
        state = _state_in(self.codec, answer.get("state"))
        if state is None:
            return None
        run_id, seq = str(answer["run_id"]), int(answer["seq"])
        record = _message_in(self.codec, answer.get("message"))
        return RunView(state, run_id, seq, record, run_status(state, run_id, record))

    async def run(self, tenant: str, run_id: str, thread_id: str | None,
                  hints: Hints) -> RunView | None:
        """The run from its thread's owner, or if the thread is unknown, from whichever
        other gateway holds it."""
        query = {"run_id": run_id, **_hints_query(hints)}
        if thread_id is not None:
            answer = await self._ask(self._partition(thread_id), tenant, "run",
                                     {**query, "thread_id": thread_id})
            return self._run_in(answer)
        answers = await self._gather(tenant, "run", query,
                                     lambda answer: answer.get("state") is not None)
        for answer in answers:
            found = self._run_in(answer)
            if found is not None:
                return found
        return None

    async def current_messages(self, tenant: str, thread_id: str, after: int | None,
                               before: int | None, limit: int) -> MessagePage:
        """A page of the thread's current branch."""
        query = {"thread_id": thread_id, "limit": str(limit)}
        if after is not None:
            query["after"] = str(after)
        if before is not None:
            query["before"] = str(before)
        answer = await self._ask(self._partition(thread_id), tenant, "current_messages", query)
        records = [r for r in (_message_in(self.codec, raw) for raw in answer["records"])
                   if r is not None]
        return MessagePage(records, bool(answer["more"]), int(answer["rows_read"]))

    async def threads(self, tenant: str, after: tuple[int, str] | None, limit: int,
                      here: ThreadPage) -> ThreadPage:
        """The tenant's threads over every gateway: each owner's page, merged."""
        query = {"limit": str(limit)}
        if after is not None:
            query["after_at"], query["after_id"] = str(after[0]), after[1]
        answers = await self._gather(tenant, "threads", query, lambda answer: False)
        pages = []
        for answer in answers:
            states = [_state_in(self.codec, raw) for raw in answer["states"]]
            pages.append(ThreadPage(
                [s for s in states if s is not None], bool(answer["more"]),
                {s.thread_id: str(t) for s, t in zip(states, answer["titles"], strict=True)
                 if s is not None}))
        return merge_pages([here, *pages], limit)

    def _partition(self, thread_id: str) -> int:
        return partition_for(thread_id, self.partitions)


async def internal_reads(request: web.Request) -> web.Response:
    """GET /internal/v1/reads/{op} (a hop; see the module)."""
    tenant, op, query = request[TENANT], request.match_info["op"], request.query
    model: ReadModel = request.config_dict[READ_MODEL]
    codec = model.codec
    thread_id = query.get("thread_id")
    if thread_id is not None and not model.here(model.partition_of(thread_id)):
        raise Problem(421, "misdirected", "this gateway does not hold the thread's partition")
    hints: Hints = (query.get("created") == "1", query.get("accepted"), query.get("ended"))
    if thread_id is not None and any(hints):
        model.heed(thread_id, hints)
    if op == "thread" and thread_id is not None:
        state = await model.thread(tenant, thread_id, fresh=True)
        return web.json_response({"state": _state_out(codec, state)})
    if op == "run":
        run = await model.run(tenant, query["run_id"], scatter=False)
        if run is None:
            return web.json_response({"state": None})
        return web.json_response({
            "state": _state_out(codec, run.state), "run_id": run.run_id, "seq": run.seq,
            "message": _message_out(codec, run.message, run.state.thread_id, tenant)})
    if thread_id is not None and await model.thread(tenant, thread_id) is None:
        raise Problem(404, "not-found", "no such thread")
    if op == "current_messages" and thread_id is not None:
        state = await model.thread(tenant, thread_id)
        assert state is not None
        after, before = query.get("after"), query.get("before")
        page = model.current_messages(
            state, after=None if after is None else int(after),
            before=None if before is None else int(before),
            limit=min(_MAX_LIMIT, _int(query, "limit", 100)))
        return web.json_response({
            "records": [_message_out(codec, r, thread_id, tenant) for r in page.records],
            "more": page.more, "rows_read": page.rows_read})
    if op == "threads":
        after_at, after_id = query.get("after_at"), query.get("after_id")
        cursor = None if after_at is None or after_id is None else (int(after_at), after_id)
        await model.catch_up()
        threads = model.threads_here(tenant, after=cursor,
                                     limit=min(_MAX_LIMIT, _int(query, "limit", 50)))
        return web.json_response({"states": [_state_out(codec, s) for s in threads.states],
                                  "titles": [model.display_title(s) for s in threads.states],
                                  "more": threads.more})
    raise Problem(404, "not-found", f"no read {op!r}")


def _int(query: Any, name: str, default: int) -> int:
    raw = query.get(name)
    try:
        return default if raw is None else int(raw)
    except ValueError:
        raise Problem(400, "bad-request", f"'{name}' must be an integer") from None
