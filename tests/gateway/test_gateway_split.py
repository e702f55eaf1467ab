"""Gateways that split the read model (issue #26, its second part): in a group each
gateway's read model reads and holds only the partitions it owns, and any gateway
answers any request: a request about a thread held elsewhere is sent on whole to its
owner, a stream's few reads are asked of it, and the lists that span partitions
(`GET /v1/threads`, LangGraph's `threads/search`) are gathered from every gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import pytest
from aiohttp import web

from gateway.kafka import partition_for
from gateway.keys import FEED, READ_MODEL
from streams.config import Settings
from streams.core.domain import ThreadState
from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, Stack
from tests.gateway.test_gateway_group import _grouped_gateway, _split, _until

pytestmark = pytest.mark.kafka


def _standbys(stack: Stack, copies: int) -> Settings:
    return stack.settings.with_(gateway=replace(stack.settings.gateway, standbys=copies))


@asynccontextmanager
async def _two(stack: Stack) -> AsyncIterator[tuple[tuple[str, web.Application],
                                                    tuple[str, web.Application]]]:
    """Gateways A and B of one group without standby copies, once they split the
    partitions and each read model holds its feed's share, loaded."""
    settings = _standbys(stack, 0)
    async with _grouped_gateway(settings) as a, _grouped_gateway(settings) as b:
        apps = [a[1], b[1]]

        await _until(lambda: _settled(apps, stack),
                     "A and B split, their read models holding their shares")
        yield a, b


def _settled(apps: list[web.Application], stack: Stack) -> bool:
    """The apps split the partitions, and each read model holds its feed's share (and
    its standby copies), loaded, and the feed serves it."""
    return _split(apps, stack.settings.partitions) and all(
        app[READ_MODEL].held == (app[FEED].owned or set()) | app[READ_MODEL].standby
        and not app[READ_MODEL].loading
        and all(app[FEED].owns(p) for p in app[FEED].owned or ()) for app in apps)


def _on(app: web.Application, stack: Stack) -> Callable[[str], bool]:
    return lambda thread_id: partition_for(thread_id, stack.settings.partitions) in \
        (app[FEED].owned or ())


async def _json(stack: Stack, method: str, url: str, body: dict[str, Any] | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with stack.session.request(method, url, json=body,
                                     headers={**AUTH_A, **(headers or {})}) as response:
        return response.status, await response.json(content_type=None)


async def _thread_via(stack: Stack, url: str, holder: Callable[[str], bool], title: str) -> str:
    """A thread created through `url` whose partition `holder` selects."""
    for n in range(200):
        status, body = await _json(stack, "POST", url + "/v1/threads", {"title": f"{title} {n}"})
        assert status == 201, body
        if holder(body["thread_id"]):
            return str(body["thread_id"])
    raise AssertionError("no thread landed where wanted")


async def test_each_read_model_holds_its_share_and_any_gateway_answers(stack: Stack) -> None:
    """A thread created through A on B's partitions: A's store never holds it, yet
    through A it reads at once (sent on to B), takes a message (the post published
    on A), streams its run (the stream's reads asked of B) and lists its answer."""
    async with _two(stack) as ((url_a, app_a), (url_b, app_b)):
        thread_id = await _thread_via(stack, url_a, _on(app_b, stack), "held by B")
        status, thread = await _json(stack, "GET", f"{url_a}/v1/threads/{thread_id}")
        assert status == 200 and thread["thread_id"] == thread_id, thread
        status, posted = await _json(stack, "POST", f"{url_a}/v1/threads/{thread_id}/user_message",
                                     {"input_text": "hello through A"})
        assert status == 202, posted
        events = await read_sse(stack.session, f"{url_a}/v1/runs/{posted['run_id']}/events",
                                headers=AUTH_A)
        assert [e.event for e in events][-1] == "done", [e.event for e in events]
        status, page = await _json(stack, "GET", f"{url_a}/v1/threads/{thread_id}/messages")
        assert status == 200 and [m["role"] for m in page["messages"]] == ["user", "assistant"]
        assert app_a[READ_MODEL].store.state(thread_id) is None, "A holds a thread of B's"
        assert app_b[READ_MODEL].store.state(thread_id) is not None
        # And B answers the same.
        status, same = await _json(stack, "GET", f"{url_b}/v1/threads/{thread_id}/messages")
        assert status == 200 and same["messages"] == page["messages"]


async def test_the_thread_list_is_gathered_from_every_gateway(stack: Stack) -> None:
    """Threads on both gateways' partitions: the list through either gateway holds
    them all, newest first, and paging one by one walks it without a gap or a repeat."""
    async with _two(stack) as ((url_a, app_a), (url_b, app_b)):
        made = [await _thread_via(stack, url_a, _on(app, stack), f"listed {n}")
                for n, app in enumerate([app_a, app_b, app_a, app_b])]
        for url in (url_a, url_b):
            status, page = await _json(stack, "GET", f"{url}/v1/threads?limit=100")
            assert status == 200, page
            listed = [t["thread_id"] for t in page["threads"]]
            assert set(made) <= set(listed), (made, listed)
            assert listed.index(made[-1]) < listed.index(made[0]), "not newest first"
            walked: list[str] = []
            cursor = None
            while True:
                query = "limit=1" + ("" if cursor is None else f"&cursor={cursor}")
                status, one = await _json(stack, "GET", f"{url}/v1/threads?{query}")
                assert status == 200, one
                walked += [t["thread_id"] for t in one["threads"]]
                cursor = one.get("next_cursor")
                if not cursor:
                    break
            assert walked == listed, (walked, listed)


async def test_langgraph_reads_of_a_thread_held_elsewhere(stack: Stack) -> None:
    """LangGraph's routes through A for a thread B holds: made over /v1 and named by
    its own id (a second candidate id: the request is sent on twice at most), read,
    and found by `threads/search`."""
    async with _two(stack) as ((url_a, app_a), (_url_b, app_b)):
        thread_id = await _thread_via(stack, url_a, _on(app_b, stack), "langgraph")
        status, thread = await _json(stack, "GET", f"{url_a}/langgraph/threads/{thread_id}")
        assert status == 200 and thread["thread_id"] == thread_id, thread
        status, found = await _json(stack, "POST", f"{url_a}/langgraph/threads/search",
                                    {"limit": 100})
        assert status == 200 and thread_id in [t["thread_id"] for t in found], found
        assert app_a[READ_MODEL].store.state(thread_id) is None


async def test_a_moved_partition_is_read_again_where_it_goes(stack: Stack) -> None:
    """When B leaves, A takes B's partitions: its read model reads them (from the
    start: it never held them) and serves their threads itself."""
    settings = _standbys(stack, 0)
    async with _grouped_gateway(settings) as (url_a, app_a):
        async with _grouped_gateway(settings) as (_url_b, app_b):
            apps = [app_a, app_b]
            await _until(lambda: _settled(apps, stack), "A and B split")
            thread_id = await _thread_via(stack, url_a, _on(app_b, stack), "moves")
        await _until(lambda: _settled([app_a], stack), "A holds every partition")
        assert app_a[READ_MODEL].held == set(range(stack.settings.partitions))
        status, thread = await _json(stack, "GET", f"{url_a}/v1/threads/{thread_id}")
        assert status == 200, thread
        assert app_a[READ_MODEL].store.state(thread_id) is not None


async def test_a_standby_copy_serves_at_once_when_its_partition_comes_here(stack: Stack) -> None:
    """With one standby copy (the default), A keeps B's partitions warm beside its own
    and serves their threads without a hop; when B leaves, A takes them over with
    nothing to read anew (no partition loading) and the thread B held reads at once."""
    async with _grouped_gateway(stack.settings) as (url_a, app_a):
        async with _grouped_gateway(stack.settings) as (url_b, app_b):
            apps = [app_a, app_b]
            await _until(lambda: _settled(apps, stack) and all(
                app[READ_MODEL].standby == set(range(stack.settings.partitions)) -
                (app[FEED].owned or set()) for app in apps), "A and B keep each other's copies")
            thread_id = await _thread_via(stack, url_b, _on(app_b, stack), "kept warm")
            await _until(lambda: app_a[READ_MODEL].store.state(thread_id) is not None,
                         "A's standby copy has B's thread")
            status, thread = await _json(stack, "GET", f"{url_a}/v1/threads/{thread_id}")
            assert status == 200, thread
            # Watched from before B leaves: a takeover read anew could not pass unseen.
            taken: list[list[int]] = []
            model = app_a[READ_MODEL]
            original = model._apply_held

            async def spy() -> None:
                taken.append(sorted((model._wanted or set()) - (model.held or set())))
                await original()

            model._apply_held = spy  # type: ignore[method-assign]
        await _until(lambda: _settled([app_a], stack), "A holds every partition")
        assert all(not new for new in taken), taken
        status, thread = await _json(stack, "GET", f"{url_a}/v1/threads/{thread_id}")
        assert status == 200, thread


async def test_a_long_poll_sent_on_waits_for_its_run_whatever_it_takes(stack: Stack) -> None:
    """LangGraph's `runs/wait` through A for a thread B holds is sent on whole and
    answers when the run ends: a slow run (seconds, past the hops' read limit of a
    few keep-alives) still answers once, with the answer in its values."""
    async with _two(stack) as ((url_a, _app_a), (_url_b, app_b)):
        thread_id = await _thread_via(stack, url_a, _on(app_b, stack), "waited")
        status, values = await _json(stack, "POST", f"{url_a}/langgraph/threads/{thread_id}/runs/wait", {
            "assistant_id": "agent", "input": {"messages": [
                {"role": "user", "content": "[slow] " + " ".join(["word"] * 40)}]}})
        assert status == 200, values
        assert values["messages"][-1]["type"] == "ai" and "word" in values["messages"][-1]["content"]


def _ghost(stack: Stack, partition: int, name: str) -> str:
    """A thread id of `partition` that no record on Kafka names."""
    return next(t for t in (f"ghost-{name}-{n}" for n in range(10_000))
                if partition_for(t, stack.settings.partitions) == partition)


async def test_a_partition_let_go_of_longer_than_tombstones_are_kept_is_read_anew(
        stack: Stack) -> None:
    """A holds every partition, then B joins and takes a share. While A does not hold
    them, its store keeps their rows and checkpoints; each of two of B's partitions
    gets a row on A that no record names (a thread deleted meanwhile whose tombstone
    compaction removed, as it would look). One of the two is marked let go of longer
    ago than `delete.retention.ms`. When B leaves and A takes both back, the first is
    read on from its checkpoint (its stale row stays: nothing on Kafka removes it), the
    second is erased and read from the start (its stale row is gone, and its real
    threads read again)."""
    settings = _standbys(stack, 0)
    async with _grouped_gateway(settings) as (url_a, app_a):
        await _until(lambda: _settled([app_a], stack), "A holds every partition")
        every = set(range(stack.settings.partitions))
        kept: dict[int, str] = {}
        for n in range(400):  # a real thread on every partition, read by A
            if len(kept) == len(every):
                break
            thread_id = await stack.create_thread(title=f"before B {n}")
            kept.setdefault(partition_for(thread_id, stack.settings.partitions), thread_id)
        assert set(kept) == every
        model = app_a[READ_MODEL]
        await _until(lambda: all(model.store.state(t) is not None for t in kept.values()),
                     "A's store has a thread of every partition")
        async with _grouped_gateway(settings) as (_url_b, app_b):
            await _until(lambda: _settled([app_a, app_b], stack), "A and B split")
            on_b = sorted(app_b[FEED].owned or ())
            assert len(on_b) >= 2, on_b
            stays, erased = on_b[0], on_b[1]
            store = model.store
            assert store.released_at(stays) is not None and store.released_at(erased) is not None
            ghosts = {p: _ghost(stack, p, str(p)) for p in (stays, erased)}
            for ghost in ghosts.values():
                state = ThreadState(ghost, "tenant-a", "stale", 1_000)
                store.apply_state(ghost.encode(), store.codec.encode_state(state))
            store.commit({})
            store.release(erased, 0)  # let go of at the epoch: past any retention
            assert all(store.state(g) is not None for g in ghosts.values())
        await _until(lambda: _settled([app_a], stack), "A holds every partition again")
        assert model.store.state(ghosts[stays]) is not None, "read on from its checkpoint"
        assert model.store.state(ghosts[erased]) is None, "erased and read anew"
        for thread_id in (kept[stays], kept[erased]):
            status, thread = await _json(stack, "GET", f"{url_a}/v1/threads/{thread_id}")
            assert status == 200, thread
