"""Regression test for a duplicate the chaos run found: a client that read a run on one
gateway and resumes (Last-Event-ID) on another whose stream feed is behind must not
get the events between the feed's position and its own again."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from aiokafka import TopicPartition

from chaos.audit import Seen
from chaos.sse import iter_sse
from gateway.app import Options, create_app
from gateway.keys import FEED, READ_MODEL
from tests.chaos.conftest import AUTH, Live

pytestmark = pytest.mark.kafka


def _post(live: Live, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(live.base + path, data=json.dumps(body).encode(),
                                     headers={**AUTH, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, Any] = json.loads(response.read())
        return result


def _a_run(live: Live, title: str, text: str) -> str:
    """A new thread with `text` posted on it: the run's id."""
    thread_id = _post(live, "/v1/threads", {"title": title})["thread_id"]
    return str(_post(live, f"/v1/threads/{thread_id}/user_message",
                     {"input_text": text})["run_id"])


async def _read(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                until: str) -> list[Seen]:
    seen: list[Seen] = []
    async with session.get(url, headers=headers) as response:
        assert response.status == 200, await response.text()
        async for event in iter_sse(response):
            seen.append(event)
            if event.event == until:
                break
    return seen


@asynccontextmanager
async def _lagging_gateway(live: Live) -> AsyncIterator[tuple[TestServer, list[TopicPartition]]]:
    """A second gateway whose feed stops reading (its partitions paused) once it has
    reached the end: from then on it falls behind, until `feed._consumer.resume(*tps)`."""
    lagging = TestServer(create_app(live.settings, Options(keepalive_s=1.0)), host="127.0.0.1")
    await lagging.start_server()
    try:
        feed = lagging.app[FEED]
        tps = [TopicPartition(live.settings.topics.stream, p)
               for p in range(live.settings.partitions)]
        # Its feed has reached the end once: a fetch answered for every partition
        # (rather than a second's sleep that hopes so).
        for _ in range(1200):
            if all(feed._consumer.highwater(tp) is not None for tp in tps):
                break
            await asyncio.sleep(0.05)
        assert all(feed._consumer.highwater(tp) is not None for tp in tps)
        feed._consumer.pause(*tps)
        yield lagging, tps
    finally:
        await lagging.close()


async def test_a_resume_on_a_gateway_whose_feed_is_behind_repeats_nothing(live: Live) -> None:
    """Resuming on a gateway whose feed lags behind the run repeats and skips nothing."""
    async with _lagging_gateway(live) as (lagging, tps):
        feed = lagging.app[FEED]
        run_id = _a_run(live, "lag", "[slow] resume me elsewhere")
        async with aiohttp.ClientSession() as session:
            first = await _read(session, f"{live.base}/v1/runs/{run_id}/events", AUTH,
                                until="text_delta")
            resumed_task = asyncio.create_task(_read(
                session, str(lagging.make_url(f"/v1/runs/{run_id}/events")),
                {**AUTH, "Last-Event-ID": first[-1].id}, until="done"))
            # The resumed stream has subscribed and waits on the paused feed.
            for _ in range(1200):
                if feed.subscribers or resumed_task.done():
                    break
                await asyncio.sleep(0.05)
            assert feed.subscribers, "the resumed stream never subscribed to the lagging feed"
            feed._consumer.resume(*tps)
            resumed = await resumed_task
            reference = await _read(session, f"{live.base}/v1/runs/{run_id}/events", AUTH,
                                    until="done")
    assert first + resumed == reference, [e.event for e in first + resumed]


async def test_a_resume_of_an_ended_run_the_feed_has_not_read_waits_for_the_feed(
        live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read model and the feed are consumers of their own: on a gateway whose feed
    is behind, a run can have ended for the read model before the feed read any of
    it. A resume of that run catches the feed up first, and streams the rest of the
    run; it used to take the run for over at once and end with nothing (seen once in
    tests/gateway/test_gateway_resume_tokens.py under load)."""
    async with _lagging_gateway(live) as (lagging, tps):
        feed, model = lagging.app[FEED], lagging.app[READ_MODEL]
        run_id = _a_run(live, "lag, ended", "resume me once I ended")
        async with aiohttp.ClientSession() as session:
            reference = await _read(session, f"{live.base}/v1/runs/{run_id}/events", AUTH,
                                    until="done")
            while True:  # ended, for the lagging gateway's read model
                run = await model.run("fuzz", run_id)
                if run is not None and run.terminal:
                    break
                await asyncio.sleep(0.05)
            assert feed.run(run_id) is None, "the paused feed read the run"
            catching_up = asyncio.Event()
            catch_up = feed.catch_up

            async def marked(partition: int, timeout_s: float = 5.0) -> bool:
                catching_up.set()
                return await catch_up(partition, 60.0)

            monkeypatch.setattr(feed, "catch_up", marked)
            resumed_task = asyncio.create_task(_read(
                session, str(lagging.make_url(f"/v1/runs/{run_id}/events")),
                {**AUTH, "Last-Event-ID": reference[1].id}, until="done"))
            await asyncio.wait([asyncio.create_task(catching_up.wait()), resumed_task],
                               return_when=asyncio.FIRST_COMPLETED)
            feed._consumer.resume(*tps)
            resumed = await resumed_task
    assert reference[:2] + resumed == reference, [e.event for e in resumed]
