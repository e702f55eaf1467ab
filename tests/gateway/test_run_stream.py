"""The in-process run-stream API (`gateway.live.run_stream`) that every protocol serves
from: pulled with `async for`, a run's events are the native SSE's, ids included; a
thread stream resumed from an event goes on after it; a bad position is a Problem
before anything is read."""

from __future__ import annotations

import asyncio

import pytest

from gateway.http.problems import Problem
from gateway.keys import READ_MODEL
from gateway.live.run_stream import STREAMS, Gone, KeepAlive
from gateway.live.sse import SseEvent
from gateway.model.read_model import RunView
from streams.testing.sse import SseEvent as Ev
from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, Stack

pytestmark = pytest.mark.kafka


def _as_sse(events: list[SseEvent]) -> list[Ev]:
    return [Ev(e.event_id, e.name, e.data.decode()) for e in events]


async def test_a_pulled_run_stream_is_the_native_one(stack: Stack) -> None:
    """`async for` over a run's stream yields the events /v1/runs/{id}/events sends."""
    thread_id = await stack.create_thread()
    status, posted = await stack.post(thread_id, "pull me")
    assert status == 202, posted
    app = stack.server.app

    async def accepted() -> RunView:  # the read model learns of the run after the decision
        while (found := await app[READ_MODEL].run("tenant-a", posted["run_id"])) is None:
            await asyncio.sleep(0.05)
        return found

    run = await accepted()
    pulled: list[SseEvent] = []
    async with app[STREAMS].open("tenant-a", run.state, run) as stream:
        async for item in stream:
            assert not isinstance(item, Gone)
            if not isinstance(item, KeepAlive):
                pulled += item
    assert pulled[-1].name == "done" and pulled[0].name == "run_accepted"
    native = await read_sse(stack.session, stack.url(f"/v1/runs/{run.run_id}/events"),
                            headers=AUTH_A, until=lambda _: False)
    assert _as_sse(pulled) == native

    # A thread stream from one of those events goes on right after it.
    async with app[STREAMS].open("tenant-a", run.state, after=pulled[2].event_id) as stream:
        resumed: list[SseEvent] = []
        async for item in stream.catch_up():
            assert isinstance(item, list)
            resumed += item
    assert _as_sse(resumed) == native[3:]


async def test_a_bad_position_is_a_problem_before_anything_is_read(stack: Stack) -> None:
    """A resume token that is not one is refused when the stream opens (a 400)."""
    thread_id = await stack.create_thread()
    state = await stack.server.app[READ_MODEL].thread("tenant-a", thread_id)
    assert state is not None
    with pytest.raises(Problem) as refused:
        async with stack.server.app[STREAMS].open("tenant-a", state, after="not-a-token"):
            pass
    assert refused.value.status == 400
