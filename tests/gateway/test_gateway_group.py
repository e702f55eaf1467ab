"""Gateways that share the stream's partitions (issue #26, its first part): two
gateways with an advertised URL form a group, each consumes its share of the stream,
the owner map reaches both through the `gateways` topic, and a stream asked of the
gateway that does not own its thread is served by the owner, through it: the same
events, id for id, as the owner sends. When the owner leaves, the stream goes on
from the last event, on the gateway that takes the partition over."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

from gateway.adapters.ai_sdk.chat import chat_thread_id
from gateway.app import Options, create_app
from gateway.cluster.owners import Claim, owners_topic
from gateway.kafka import partition_for
from gateway.keys import FEED, LIMITER, OWNERS, READ_MODEL
from streams.config import Settings
from streams.devtools.broker import free_port
from streams.kafka.clients import aiokafka_config
from streams.testing.process import RoleProcess
from streams.testing.sse import SseEvent, iter_sse, read_sse
from tests.gateway.conftest import AUTH_A, KEYS, Stack

pytestmark = pytest.mark.kafka

TENANT_A = KEYS[AUTH_A["Authorization"].removeprefix("Bearer ")]


@asynccontextmanager
async def _grouped_gateway(settings: Settings) -> AsyncIterator[tuple[str, web.Application]]:
    """A gateway of the stack's deployment that advertises its URL (joins the group)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    grouped = settings.with_(gateway=replace(settings.gateway, advertised_url=url))
    app = create_app(grouped, Options(keepalive_s=1))
    server = TestServer(app, host="127.0.0.1", port=port, handler_cancellation=True)
    await server.start_server()
    try:
        yield url, app
    finally:
        await server.close()


async def _until(condition: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    """Wait for `condition`, polling; the limit only keeps a broken run from hanging."""
    for _ in range(int(limit_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


async def _progressing(waited: Awaitable[object], progress: Callable[[], object], what: str,
                       idle_s: float = 90.0) -> None:
    """Await `waited` for as long as `progress()` keeps changing: it fails after `idle_s`
    without a change (a stall), however long the whole takes on a busy machine."""
    task = asyncio.ensure_future(waited)
    last, since = progress(), time.monotonic()
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=1.0)
            now = progress()
            if now != last:
                last, since = now, time.monotonic()
            elif not task.done() and time.monotonic() - since > idle_s:
                raise AssertionError(f"no progress for {idle_s:.0f} s: {what}")
        task.result()
    finally:
        if not task.done():
            task.cancel()


def _split(apps: list[web.Application], partitions: int) -> bool:
    """Every partition owned by exactly one of `apps`, and each app's map agreeing."""
    owned = [app[FEED].owned or set() for app in apps]
    if sorted(p for share in owned for p in share) != list(range(partitions)):
        return False
    for app in apps:
        board = app[OWNERS]
        for other, share in zip(apps, owned, strict=True):
            for p in share:
                claim = board.map.owner(p)
                if claim is None or claim.instance != other[OWNERS].instance:
                    return False
    return True


async def _thread_on(stack: Stack, app: web.Application, title: str) -> str:
    """A new thread whose partition `app` owns."""
    for n in range(200):
        thread_id = await stack.create_thread(title=f"{title} {n}")
        if partition_for(thread_id, stack.settings.partitions) in (app[FEED].owned or ()):
            return thread_id
    raise AssertionError("no thread landed on the gateway's partitions")


@asynccontextmanager
async def _a_beside_a_killable_b(stack: Stack, standbys: int | None = None,
                                 ) -> AsyncIterator[tuple[str, web.Application, RoleProcess]]:
    """Gateway A in this process and gateway B as a process (to kill with SIGKILL),
    both in the group, once A's map names B for every partition A does not own:
    A's URL and app, and B's process (stopped on the way out). `standbys`: the
    standby copies both keep, if not the default."""
    port = free_port()
    env = {**stack.env, "THREADLINE_HTTP_PORT": str(port),
           "THREADLINE_GATEWAY_URL": f"http://127.0.0.1:{port}"}
    settings = stack.settings
    if standbys is not None:
        env["THREADLINE_GATEWAY_STANDBYS"] = str(standbys)
        settings = settings.with_(gateway=replace(settings.gateway, standbys=standbys))
    gateway_b = RoleProcess("gateway", env, stack.folder / f"gateway-{port}.log").start()
    try:
        async with _grouped_gateway(settings) as (url_a, app_a):
            every = set(range(stack.settings.partitions))

            def b_owns_a_share() -> bool:
                rest = every - (app_a[FEED].owned or every)
                return bool(rest) and all(
                    (c := app_a[OWNERS].owner(p)) is not None and c.url.endswith(f":{port}")
                    for p in rest)

            await _until(lambda: b_owns_a_share() or not gateway_b.alive(),
                         "gateway B owns a share, as A's map says")
            assert gateway_b.alive(), gateway_b.tail()
            yield url_a, app_a, gateway_b
    finally:
        gateway_b.stop()


async def _thread_not_on(stack: Stack, app: web.Application, title: str) -> str:
    """A new thread whose partition `app` does not own."""
    for n in range(200):
        thread_id = await stack.create_thread(title=f"{title} {n}")
        if not app[FEED].owns(partition_for(thread_id, stack.settings.partitions)):
            return thread_id
    raise AssertionError("every thread landed on the gateway's own partitions")


async def _two_runs(response: aiohttp.ClientResponse, seen: list[SseEvent],
                    first_done: asyncio.Event) -> None:
    """A thread stream's events into `seen` until its second `done`; `first_done` set
    at the first."""
    async for event in iter_sse(response):
        seen.append(event)
        if event.event == "done":
            if first_done.is_set():
                return
            first_done.set()


def _names(events: list[SseEvent]) -> list[str]:
    return [e.event for e in events]


def _two_runs_once(seen: list[SseEvent]) -> None:
    """Two whole runs on the one connection, no event twice."""
    ids = [e.id for e in seen if e.id]
    assert len(ids) == len(set(ids)), "an event was repeated"
    names = _names(seen)
    assert names.count("run_accepted") == 2 and names.count("done") == 2, names


async def test_a_stream_through_a_gateway_that_does_not_own_it_is_the_owners(
        stack: Stack) -> None:
    """The two gateways split the partitions; a run's events read through the gateway
    that does not own its thread are those read through the owner, id for id, and a
    resume through the non-owner from an id in the middle gives the owner's tail."""
    async with _grouped_gateway(stack.settings) as (url_a, app_a), \
            _grouped_gateway(stack.settings) as (url_b, app_b):
        await _until(lambda: _split([app_a, app_b], stack.settings.partitions),
                     "the two gateways split the partitions and agree on the map")
        assert app_a[FEED].owned and app_b[FEED].owned
        thread_id = await _thread_on(stack, app_b, "owned by b")
        status, posted = await stack.post(thread_id, "hello through a")
        assert status == 202, posted
        path = f"/v1/runs/{posted['run_id']}/events"
        via_owner = await read_sse(stack.session, url_b + path, headers=AUTH_A)
        via_other = await read_sse(stack.session, url_a + path, headers=AUTH_A)
        # A never read the thread's partition: what it sent came from B.
        assert partition_for(thread_id, stack.settings.partitions) not in app_a[FEED].last_offsets
        assert _names(via_owner)[0] == "run_accepted" and _names(via_owner)[-1] == "done"
        assert [(e.id, e.event, e.data) for e in via_other] == \
            [(e.id, e.event, e.data) for e in via_owner]
        ids = [e.id for e in via_owner if e.id]
        cut = ids[len(ids) // 2]
        tail = await read_sse(stack.session, url_a + path, headers={**AUTH_A, "Last-Event-ID": cut})
        assert [e.id for e in tail if e.id] == ids[ids.index(cut) + 1:]
        # A thread the other gateway owns is served by it directly: nothing forwarded.
        local_thread = await _thread_on(stack, app_a, "owned by a")
        status, posted = await stack.post(local_thread, "hello on a")
        assert status == 202, posted
        events = await read_sse(stack.session, f"{url_a}/v1/runs/{posted['run_id']}/events",
                                headers=AUTH_A)
        assert _names(events)[-1] == "done"
        # The hop between gateways takes no client key, and no unsigned or forged hop.
        internal = f"{url_b}/internal/v1/threads/{thread_id}/stream"
        for headers in ({}, AUTH_A, {"Threadline-Hop": "dGVuYW50LWE.9999999999.00"}):
            async with stack.session.get(internal, headers=headers) as refused:
                assert refused.status == 401, (headers, await refused.text())


async def test_a_forwarded_stream_goes_on_when_its_owner_leaves(stack: Stack) -> None:
    """A thread stream read through A of a thread B owns: B leaves the group, A takes
    the partition over, and the same connection goes on with the next run's events,
    each id once and in order."""
    async with _grouped_gateway(stack.settings) as (url_a, app_a):
        async with _grouped_gateway(stack.settings) as (_url_b, app_b):
            await _until(lambda: _split([app_a, app_b], stack.settings.partitions),
                         "the two gateways split the partitions")
            thread_id = await _thread_on(stack, app_b, "moves")
            partition = partition_for(thread_id, stack.settings.partitions)
            seen: list[SseEvent] = []
            first_done = asyncio.Event()
            response = await stack.session.get(f"{url_a}/v1/threads/{thread_id}/stream",
                                               headers=AUTH_A)
            assert response.status == 200, await response.text()
            watcher = asyncio.create_task(_two_runs(response, seen, first_done))
            status, posted = await stack.post(thread_id, "first, while b owns it")
            assert status == 202, posted
            await _progressing(first_done.wait(), lambda: len(seen), "the first run's done")
            # B leaves here: its partitions come to A, the only member left.
        try:
            await _until(lambda: app_a[FEED].owns(partition), "A owns the thread's partition")
            status, posted = await stack.post(thread_id, "second, after b left")
            assert status == 202, posted
            # the same connection, on to the second `done`
            await _progressing(watcher, lambda: len(seen), "the second run's done")
        finally:
            response.close()
    _two_runs_once(seen)


async def test_a_forwarded_stream_goes_on_when_its_owner_is_killed(stack: Stack) -> None:
    """B, a gateway process, owns the thread; a client reads the thread's stream through
    A. B is killed with SIGKILL: once its session expires, A takes the partition over
    and the client's one connection goes on with the next run's events from A's own
    feed, each id once."""
    seen: list[SseEvent] = []
    async with _a_beside_a_killable_b(stack) as (url_a, app_a, gateway_b):
        thread_id = await _thread_not_on(stack, app_a, "killed owner")
        partition = partition_for(thread_id, stack.settings.partitions)
        first_done = asyncio.Event()
        response = await stack.session.get(f"{url_a}/v1/threads/{thread_id}/stream",
                                           headers=AUTH_A)
        try:  # closed before A stops: its server waits for open streams
            assert response.status == 200, await response.text()
            watcher = asyncio.create_task(_two_runs(response, seen, first_done))
            status, posted = await stack.post(thread_id, "first, while b owns it")
            assert status == 202, posted
            await _progressing(first_done.wait(), lambda: len(seen), "the first run's done")
            gateway_b.kill9()
            status, posted = await stack.post(thread_id, "second, b is dead")
            assert status == 202, posted
            await _until(lambda: app_a[FEED].owns(partition), "A owns the dead B's partition")
            await _progressing(watcher, lambda: len(seen), "the second run's done")
        finally:
            response.close()
    _two_runs_once(seen)


async def test_a_forwarded_run_stream_survives_its_owner_killed_mid_run(stack: Stack) -> None:
    """A run's events read through A while B, the owner, is killed with SIGKILL in the
    middle of the run: the one response goes on to `done`, each event once, and ends
    with the events an uninterrupted reader got."""
    async with _a_beside_a_killable_b(stack) as (url_a, app_a, gateway_b):
        thread_id = await _thread_not_on(stack, app_a, "killed mid-run")
        status, posted = await stack.post(thread_id, "[slow] " + " ".join(["word"] * 30))
        assert status == 202, posted
        path = f"/v1/runs/{posted['run_id']}/events"
        seen: list[SseEvent] = []
        async with stack.session.get(url_a + path, headers=AUTH_A) as response:
            assert response.status == 200, await response.text()
            async for event in iter_sse(response):
                seen.append(event)
                if event.event == "text_delta" and gateway_b.alive():
                    gateway_b.kill9()
                if event.event == "done":
                    break
        whole = await read_sse(stack.session, stack.url(path), headers=AUTH_A)
    assert not gateway_b.alive()
    assert [(e.id, e.event, e.data) for e in seen] == [(e.id, e.event, e.data) for e in whole]


async def test_a_run_asked_by_id_as_its_owner_dies_is_read_where_its_partition_goes(
        stack: Stack) -> None:
    """A run's events asked of A by the run's id alone, right after B, the owner of its
    thread, was killed with SIGKILL. A never read the run's acceptance (the post went
    through another gateway), so it asks the other gateways; B's partition then comes to
    A. A reads it there and streams the run: it used to wait for another gateway to own
    that partition until its owner wait ran out, and answer 503 (CI: the HAProxy REST
    test's `/v1/runs/{id}/events` after 12 s). No standby copies: A must not hold B's
    share before it is given it (a copy is read where it is, and never asks)."""
    async with _a_beside_a_killable_b(stack, standbys=0) as (url_a, app_a, gateway_b):
        thread_id = await _thread_not_on(stack, app_a, "asked by run id")
        partition = partition_for(thread_id, stack.settings.partitions)
        status, posted = await stack.post(thread_id, "answered before the kill")
        assert status == 202, posted
        path = f"/v1/runs/{posted['run_id']}/events"
        whole = await read_sse(stack.session, stack.url(path), headers=AUTH_A)
        assert whole[-1].event == "done", _names(whole)
        assert not app_a[READ_MODEL].here(partition)
        gateway_b.kill9()
        async with stack.session.get(url_a + path, headers=AUTH_A) as response:
            assert response.status == 200, await response.text()
            assert app_a[READ_MODEL].here(partition)  # it came to A while A asked
            seen = [event async for event in iter_sse(response)]
    assert [(e.id, e.event, e.data) for e in seen] == [(e.id, e.event, e.data) for e in whole]


async def test_an_ai_sdk_chat_through_a_non_owner_ends_whole_across_the_owners_kill(
        stack: Stack) -> None:
    """The AI SDK's chat POST on A, its thread owned by B, B killed with SIGKILL at the
    first text: A's response goes on from the new owner and ends as the UI message
    stream ends (a `finish` chunk, then `[DONE]`), its text the stored answer's. A
    keeps a standby copy of B's share (the default) and reads the chat's thread there,
    so the POST stays on A; waited for: a POST that finds no copy yet is sent on whole
    to B, and its answer breaks off with B (the client resumes)."""
    async with _a_beside_a_killable_b(stack) as (url_a, app_a, gateway_b):
        every, model = set(range(stack.settings.partitions)), app_a[READ_MODEL]
        await _until(lambda: (every - (app_a[FEED].owned or every)) <= (model.held or set())
                     and not model.loading, "A keeps a loaded copy of B's share")
        chat_id = next(c for c in (f"group-chat-{n}-{url_a[-5:]}" for n in range(500))
                       if not app_a[FEED].owns(partition_for(
                           chat_thread_id("tenant-a", c), stack.settings.partitions)))
        body = {"id": chat_id, "messages": [{"id": "u1", "role": "user", "parts": [
            {"type": "text", "text": "[slow] " + " ".join(["word"] * 30)}]}]}
        chunks: list[dict[str, Any]] = []
        async with stack.session.post(url_a + "/v1/ai/chat", json=body,
                                      headers=AUTH_A) as response:
            assert response.status == 200, await response.text()
            while raw := await response.content.readline():
                data = raw.decode().strip().removeprefix("data: ")
                if not data.startswith("{") and data != "[DONE]":
                    continue
                chunks.append({"type": "[DONE]"} if data == "[DONE]" else json.loads(data))
                if chunks[-1]["type"] == "text-delta" and gateway_b.alive():
                    gateway_b.kill9()
        status, stored = await stack.get(f"/v1/ai/chat/{chat_id}/messages")
    assert not gateway_b.alive()
    kinds = [c["type"] for c in chunks]
    assert kinds[-2:] == ["finish", "[DONE]"], kinds
    assert status == 200, stored
    answer = [m for m in stored["messages"] if m["role"] == "assistant"][-1]
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == \
        "".join(p["text"] for p in answer["parts"] if p["type"] == "text")


async def test_claims_left_by_gateways_that_all_died_stop_counting(stack: Stack) -> None:
    """Every gateway of a group killed at once leaves its claims in the `gateways`
    topic, of generations the next group (which Kafka starts again at 1) does not
    reach for a long while. Written there as such a leftover (generation 10,000, every
    partition, an address nobody serves), it counts until it is not written again
    within the TTL; then the two new gateways split the partitions by their own
    claims, and a run read through the one that does not own its thread comes from
    the owner."""
    async with _grouped_gateway(stack.settings) as (url_a, app_a):
        leftover = Claim("dead-group", f"http://127.0.0.1:{free_port()}", 10_000,
                         frozenset(range(stack.settings.partitions)))
        producer = AIOKafkaProducer(**aiokafka_config(stack.settings))
        await producer.start()
        try:
            await producer.send_and_wait(owners_topic(stack.settings).name, leftover.to_json(),
                                         key=leftover.key)
        finally:
            await producer.stop()
        await _until(lambda: app_a[OWNERS].map.owner(0) == leftover, "A read the leftover")
        async with _grouped_gateway(stack.settings) as (_url_b, app_b):
            await _until(lambda: _split([app_a, app_b], stack.settings.partitions),
                         "the two gateways split the partitions by their own claims")
            thread_id = await _thread_on(stack, app_b, "after a whole group died")
            status, posted = await stack.post(thread_id, "hello through a")
            assert status == 202, posted
            events = await read_sse(stack.session, f"{url_a}/v1/runs/{posted['run_id']}/events",
                                    headers=AUTH_A)
            assert _names(events)[0] == "run_accepted" and _names(events)[-1] == "done"


async def test_a_forwarded_stream_takes_one_stream_slot_of_its_tenant(stack: Stack) -> None:
    """With one open stream a tenant: a stream read through A of a thread B owns holds
    A's slot only (B serves the hop without one), and A refuses a second (429). Once B
    has read A's claim, which carries A's stream counts, B refuses the tenant too: the
    cap holds across the group. When B leaves, the forwarded stream comes to A's own
    feed under the slot it holds, and goes on to the next run's `done`."""
    limits = replace(stack.settings.gateway.limits, streams_per_tenant=1)
    settings = stack.settings.with_(gateway=replace(stack.settings.gateway, limits=limits))
    seen: list[SseEvent] = []
    async with _grouped_gateway(settings) as (url_a, app_a):
        async with _grouped_gateway(settings) as (url_b, app_b):
            await _until(lambda: _split([app_a, app_b], stack.settings.partitions),
                         "the two gateways split the partitions")
            thread_id = await _thread_on(stack, app_b, "one slot")
            partition = partition_for(thread_id, stack.settings.partitions)
            first_done = asyncio.Event()
            response = await stack.session.get(f"{url_a}/v1/threads/{thread_id}/stream",
                                               headers=AUTH_A)
            assert response.status == 200, await response.text()
            watcher = asyncio.create_task(_two_runs(response, seen, first_done))
            assert app_a[LIMITER].streams[TENANT_A] == 1
            other = await _thread_on(stack, app_b, "b's own")
            async with stack.session.get(f"{url_a}/v1/threads/{other}/stream",
                                         headers=AUTH_A) as second_on_a:
                assert second_on_a.status == 429, await second_on_a.text()
            await _until(lambda: app_b[OWNERS].streams_elsewhere(TENANT_A) == 1,
                         "B read A's claim with A's stream")
            async with stack.session.get(f"{url_b}/v1/threads/{other}/stream",
                                         headers=AUTH_A) as on_b:
                refused = await on_b.json()
                assert on_b.status == 429, refused
                assert "across the gateways (1 at others)" in refused["detail"], refused
            status, posted = await stack.post(thread_id, "first, while b owns it")
            assert status == 202, posted
            await _progressing(first_done.wait(), lambda: len(seen), "the first run's done")
            # The run came through B's hop, which holds no slot of the tenant.
            assert app_b[LIMITER].streams[TENANT_A] == 0
            assert app_a[LIMITER].streams[TENANT_A] == 1
        try:  # B left: its partitions came to A
            await _until(lambda: app_a[FEED].owns(partition), "A owns the thread's partition")
            status, posted = await stack.post(thread_id, "second, after b left")
            assert status == 202, posted
            await _progressing(watcher, lambda: len(seen), "the second run's done")
        finally:
            response.close()
    _two_runs_once(seen)


async def test_a_gateway_joining_or_leaving_moves_only_the_partitions_it_must(
        stack: Stack) -> None:
    """Sticky assignment: a third gateway joining two takes its share from theirs, and
    each of the two keeps the rest of what it had (round robin dealt about two thirds of
    the partitions anew, and each moved one ends its streams); when it leaves, its
    share goes back and the two keep theirs. The shares stay balanced throughout."""
    partitions = stack.settings.partitions

    def shares(*apps: web.Application) -> list[set[int]]:
        return [set(app[FEED].owned or ()) for app in apps]

    def balanced(owned: list[set[int]]) -> bool:
        return max(map(len, owned)) - min(map(len, owned)) <= 1

    async with _grouped_gateway(stack.settings) as (_url_a, app_a):
        # Alone first: a member a previous test killed has left the group by then.
        await _until(lambda: _split([app_a], partitions), "A alone owns every partition")
        async with _grouped_gateway(stack.settings) as (_url_b, app_b):
            await _until(lambda: _split([app_a, app_b], partitions), "A and B split")
            a_two, b_two = shares(app_a, app_b)
            assert balanced([a_two, b_two]), (a_two, b_two)
            async with _grouped_gateway(stack.settings) as (_url_c, app_c):
                await _until(lambda: _split([app_a, app_b, app_c], partitions),
                             "A, B and C split")
                a_three, b_three, c_three = shares(app_a, app_b, app_c)
                assert balanced([a_three, b_three, c_three]), (a_three, b_three, c_three)
                assert a_three <= a_two and b_three <= b_two, \
                    f"A {sorted(a_two)} -> {sorted(a_three)}, B {sorted(b_two)} -> {sorted(b_three)}"
            await _until(lambda: _split([app_a, app_b], partitions), "A and B split after C left")
            a_back, b_back = shares(app_a, app_b)
            assert balanced([a_back, b_back]), (a_back, b_back)
            assert a_three <= a_back and b_three <= b_back, \
                f"A {sorted(a_three)} -> {sorted(a_back)}, B {sorted(b_three)} -> {sorted(b_back)}"


async def test_a_gateway_of_an_earlier_version_still_joins_the_group(stack: Stack) -> None:
    """A gateway of an earlier version proposes aiokafka's round robin only: this one's
    sticky assignor goes by the same protocol name, so the two form one group and
    split the partitions, rather than the joiner being refused."""
    partitions = stack.settings.partitions
    async with _grouped_gateway(stack.settings) as (_url_a, app_a):
        await _until(lambda: _split([app_a], partitions), "A alone owns every partition")
        earlier = AIOKafkaConsumer(**{**aiokafka_config(stack.settings),
                                      "group_id": stack.settings.group_id("gateway")},
                                   partition_assignment_strategy=(RoundRobinPartitionAssignor,))
        await earlier.start()
        try:
            earlier.subscribe([stack.settings.topics.stream])
            held: set[int] = set()

            async def poll() -> None:
                while True:
                    await earlier.getmany(timeout_ms=200)
                    held.clear()
                    held.update(tp.partition for tp in earlier.assignment())

            poller = asyncio.create_task(poll())
            try:
                await _until(lambda: bool(held) and (app_a[FEED].owned or set()) ==
                             set(range(partitions)) - held, "the two split the partitions")
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
        finally:
            await earlier.stop()
