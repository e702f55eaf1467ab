"""Clients through HAProxy in front of three gateways that share the stream (issue
#26), with the gateway that owns the thread killed with SIGKILL in the middle of a
run: the native REST flow, a real browser's EventSource (Chromium), langgraph-sdk's
join stream, the AI SDK's chat (in Node) and the reference-contract client each get
every run whole, with no gap and no repeat."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from langgraph_sdk import get_client

from gateway.adapters.ai_sdk.chat import chat_thread_id
from streams.testing.process import logs_of, wait_for
from streams.testing.sse import until_opened
from tests.browser_kit import LAUNCH_ARGS, PatientPage, chromium
from tests.cluster.conftest import KEY, TENANT, Cluster
from tests.frontends.stack import ProcessStack
from tests.frontends.test_ai_sdk import NodeScript
from tests.gateway.reference_client import ReferenceClient

pytestmark = pytest.mark.kafka

STALLED_S = 90  # a stream with keep-alives and no event this long has stalled


def _sse(cluster: Cluster, path: str) -> list[tuple[str | None, str, str]]:
    """A run's SSE events through HAProxy until its `done`, read as a client reads
    them: a response that ends (or breaks) before `done` is resumed from the last id
    received (`Last-Event-ID`). (id, event, data) of each event."""
    import http.client
    import urllib.request

    events: list[tuple[str | None, str, str]] = []
    for _ in range(20):
        last = next((i for i, _, _ in reversed(events) if i), None)
        headers = {"Authorization": f"Bearer {KEY}", **({"Last-Event-ID": last} if last else {})}
        request = urllib.request.Request(cluster.base + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                fields: dict[str, str] = {}
                since = time.monotonic()  # the last event: keep-alives alone are no progress
                for raw in response:
                    line = raw.decode().rstrip("\n")
                    if line:
                        if ": " in line and not line.startswith(":"):
                            name, value = line.split(": ", 1)
                            fields[name] = value
                        elif time.monotonic() - since > STALLED_S:
                            raise AssertionError(f"no event for {STALLED_S} s after "
                                                 f"{[e[1] for e in events]}")
                        continue
                    if "event" in fields:
                        events.append((fields.get("id"), fields["event"], fields.get("data", "")))
                        since = time.monotonic()
                    fields = {}
        except (http.client.IncompleteRead, ConnectionError) as exc:
            print(f"\nthe stream of {path} broke ({exc!r}); resuming")
            continue  # what it read before the break is lost with it: resume from the last id kept
        if events and events[-1][1] == "done":
            return events
    raise AssertionError(f"no `done` after 20 connections: {[e[1] for e in events]}")


def test_the_rest_flow_goes_on_while_the_owner_is_killed(cluster: Cluster) -> None:
    """Create, post, a 409 for a concurrent post, the run's events, the stored answer;
    the thread's owner killed with SIGKILL mid-run and started again, and a second
    run: each run's events whole and once, each answer stored once."""
    status, thread = cluster.call("POST", "/v1/threads", {"title": "behind haproxy"})
    assert status == 201, thread
    thread_id = thread["thread_id"]
    runs = []
    for n in range(2):
        status, accepted = cluster.call("POST", f"/v1/threads/{thread_id}/user_message",
                                        {"input_text": f"message {n}"})
        assert status == 202, accepted
        runs.append(accepted["run_id"])
        status, busy = cluster.call("POST", f"/v1/threads/{thread_id}/user_message",
                                    {"input_text": "while it runs"})
        assert status == 409 and busy["active_run_id"] == accepted["run_id"], busy
        if n == 0:
            owner = cluster.owner(thread_id)
            cluster.gateways[owner].kill9()
            cluster.gateways[owner].start()
        events = _sse(cluster, f"/v1/runs/{accepted['run_id']}/events")
        names = [name for _, name, _ in events]
        assert names[0] == "run_accepted" and names[-1] == "done", (names, cluster.logs())
        ids = [i for i, _, _ in events if i]
        assert len(ids) == len(set(ids))
    status, listing = cluster.call("GET", f"/v1/threads/{thread_id}/messages")
    assert status == 200, listing
    answers = [m for m in listing["messages"] if m["role"] == "assistant"]
    assert [a["run_id"] for a in answers] == runs


def test_a_browser_eventsource_sees_every_run_whole_across_owner_kills(cluster: Cluster) -> None:
    """Chromium's EventSource, through HAProxy, watches a thread; in each of three runs,
    once the browser has its first token, the thread's owner is killed with SIGKILL
    (and started again): every run arrives whole, no event twice."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    browser_path = chromium()
    status, thread = cluster.call("POST", "/v1/threads", {"title": "browser"})
    assert status == 201
    thread_id = thread["thread_id"]
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=browser_path, args=LAUNCH_ARGS)
        page = PatientPage(browser.new_page())
        page.goto(f"{cluster.base}/demo#key={KEY}&thread={thread_id}")
        page.wait_for_function("window.threadline && window.threadline.opens >= 1",
                               timeout=60_000)
        runs = []
        deltas = "window.threadline.events.filter(e => e.type === 'text_delta').length"
        for n in range(3):
            before = page.evaluate(deltas)
            status, accepted = cluster.call("POST", f"/v1/threads/{thread_id}/user_message",
                                            {"input_text": f"message {n}"})
            assert status == 202, accepted
            runs.append(accepted["run_id"])
            page.wait_for_function(f"{deltas} > {before}", timeout=60_000)
            owner = cluster.owner(thread_id)
            cluster.gateways[owner].kill9()
            cluster.gateways[owner].start()
            try:
                page.wait_for_function(
                    f"window.threadline.events.filter(e => e.type === 'done').length >= {n + 1}",
                    timeout=120_000)
            except Exception:
                seen = page.evaluate("[window.threadline.opens, window.threadline.errors, "
                                     "window.threadline.reopens, "
                                     "window.threadline.events.slice(-3)]")
                raise AssertionError(f"run {n}: browser (opens, errors, reopens, last) {seen}\n"
                                     f"{cluster.logs()}") from None
        events = page.evaluate("window.threadline.events")
        browser.close()
    status, listing = cluster.call("GET", f"/v1/threads/{thread_id}/messages")
    assert status == 200
    ids = [e["id"] for e in events]
    assert len(ids) == len(set(ids)), "an event reached the browser twice"
    by_run: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for event in events:
        data = json.loads(event["data"]) if event["data"] != "[DONE]" else {}
        by_run[data.get("run_id", (by_run and list(by_run)[-1]) or "")].append({**event, **data})
    answers = [m for m in listing["messages"] if m["role"] == "assistant"]
    assert [a["run_id"] for a in answers] == runs
    for run_id, answer in zip(runs, answers, strict=True):
        kinds = [e["type"] for e in by_run[run_id]]
        assert kinds[0] == "run_accepted" and kinds[-1] == "done", kinds
        assert kinds.count("done") == 1
        assert "".join(e["delta"] for e in by_run[run_id] if e["type"] == "text_delta") == \
            answer["text"]


STORY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "[slow] tell me a long story"}]}


@contextlib.asynccontextmanager
async def _langgraph(cluster: Cluster) -> AsyncIterator[Any]:
    """langgraph-sdk's client through HAProxy, closed (and collected) on the way out."""
    client = get_client(url=f"{cluster.base}/langgraph", api_key=KEY)
    try:
        yield client
    finally:
        # Closed here, not by a finalizer: one that ran during a later ast.parse (a
        # garbage collection in pytest's own) made CPython 3.11.7 raise "AST
        # constructor recursion depth mismatch" at the session's end.
        await client.aclose()
        gc.collect()


async def _parts_across_a_kill(cluster: Cluster, stream: AsyncIterator[Any],
                               victim: Callable[[], int]) -> list[Any]:
    """Every part of `stream`, the gateway `victim()` names killed with SIGKILL (and
    started again) once the second message part has come."""
    parts = []
    killed = False
    async for part in stream:
        parts.append(part)
        if not killed and sum(p.event == "messages" for p in parts) == 2:
            index = victim()  # blocking, briefly: the test waits anyway
            cluster.gateways[index].kill9()
            cluster.gateways[index].start()
            killed = True
    assert killed and sum(p.event == "messages" for p in parts) > 2
    return parts


def _haproxy_lines(cluster: Cluster, request: str) -> list[str]:
    """HAProxy's log lines of requests that begin with `request` ("GET /path")."""
    return [line for line in cluster.haproxy.log.read_text(errors="replace").splitlines()
            if f'"{request}' in line]


def _served_by(cluster: Cluster, request: str) -> int:
    """The index of the gateway HAProxy sent the first such request to (its log names
    the server, `gateways/g<index>`, as the request starts)."""
    line = wait_for(lambda: next(iter(_haproxy_lines(cluster, request)), None),
                    progress=logs_of(cluster.haproxy.log))
    assert line is not None  # wait_for returns a true value
    server = re.search(r" gateways/g(\d+) ", line)
    assert server is not None, line
    return int(server.group(1))


async def _the_stored_answer_is(client: Any, thread_id: str, parts: list[Any]) -> None:
    state: Any = await client.threads.get_state(thread_id)
    stored = state["values"]["messages"][-1]
    assert stored["type"] == "ai", state
    assert "".join(p.data[0]["content"] for p in parts if p.event == "messages") == \
        stored["content"]


async def test_langgraph_join_stream_across_an_owner_kill(cluster: Cluster) -> None:
    """langgraph-sdk's join_stream through HAProxy; the owner killed with SIGKILL after
    the second message part: the SDK's own reconnect (Last-Event-ID) through HAProxy
    gives the parts of an uninterrupted stream, equal to the stored answer."""
    async with _langgraph(cluster) as client:
        thread_id = (await client.threads.create())["thread_id"]
        run = await client.runs.create(thread_id, "agent", input=STORY)
        parts = await _parts_across_a_kill(cluster, client.runs.join_stream(
            thread_id, run["run_id"], stream_mode=["messages-tuple"]),
            lambda: cluster.owner(thread_id))
        await _the_stored_answer_is(client, thread_id, parts)


async def test_langgraph_run_stream_post_across_a_kill_of_its_gateway(cluster: Cluster) -> None:
    """langgraph-sdk's `runs.stream` (a POST that creates the run and streams it)
    through HAProxy; the gateway HAProxy gave the POST to is killed with SIGKILL after
    the second message part, so the POST's answer breaks off. The SDK reconnects to
    the answer's `Location` (the join stream) with `Last-Event-ID`, through HAProxy to
    another gateway, and the parts are those of an uninterrupted stream, equal to the
    stored answer, the run created once. (A POST that reached another gateway than
    the thread's owner goes on through an owner's death: its events are forwarded
    and move with the partition, as the REST test's streams do.)"""
    async with _langgraph(cluster) as client:
        thread_id = (await client.threads.create())["thread_id"]
        post = f"POST /langgraph/threads/{thread_id}/runs/stream"
        parts = await _parts_across_a_kill(cluster, client.runs.stream(
            thread_id, "agent", input=STORY, stream_mode=["messages-tuple"]),
            lambda: _served_by(cluster, post))
        # The SDK did reconnect: its GET of the join stream went through HAProxy.
        joins = _haproxy_lines(cluster, f"GET /langgraph/threads/{thread_id}/runs/")
        assert any("/stream" in line for line in joins), cluster.logs()
        runs = await client.runs.list(thread_id)
        assert len(runs) == 1 and runs[0]["status"] == "success", runs
        await _the_stored_answer_is(client, thread_id, parts)


def test_the_ai_sdk_chat_ends_with_the_stored_text_across_an_owner_kill(cluster: Cluster) -> None:
    """The AI SDK's Chat in Node, through HAProxy; once it streams, the chat's owner is
    killed with SIGKILL and started again. Its fetch either broke (it went through that
    gateway: `resumeStream()` replays the run) or went on (another gateway forwarded
    it): either way the answer ends equal to the stored message, and what was shown
    before the kill is where it began."""
    via = ProcessStack(cluster.base, cluster.env, cluster.gateways[0], cluster.gateways[1],
                       cluster.gateways[2])  # the Node script reads `base` alone
    script = NodeScript(via, "resumeBehindBalancer")
    _, streaming = script.until("MARK")
    assert streaming["chars"] > 0
    owner = cluster.owner(chat_thread_id(TENANT, streaming["chatId"]))
    cluster.gateways[owner].kill9()
    script.go("killed")
    cluster.gateways[owner].start()
    script.go("restarted")
    result = script.result()
    assert result["status"] == "ready", result["errors"]
    answers = [m for m in result["stored"] if m["role"] == "assistant"]
    assert len(answers) == 1, cluster.logs()
    stored_text = "".join(p["text"] for p in answers[0]["parts"] if p["type"] == "text")
    assert result["text"] == stored_text and result["id"] == answers[0]["id"]
    assert result["text"].startswith(result["seenBefore"])
    print(f"\nAI SDK behind HAProxy: fetch after the kill: {result['statusAfterKill']}")


async def test_the_reference_client_resumes_through_haproxy_after_the_owner_is_killed(
        cluster: Cluster) -> None:
    """The reference-contract client (tests/gateway/reference_client.py, written from
    docs/clients.md alone) through HAProxy: it reads a run's first token, the thread's
    owner is killed with SIGKILL (and started again), and its reconnect with
    `last_message_id` and `last_entry_id`, to whichever gateway HAProxy picks, gets
    exactly what an uninterrupted reader (on a gateway that is not the owner: its
    stream is forwarded, and moves with the partition) got after that token."""
    async with aiohttp.ClientSession() as session:
        client = ReferenceClient(session, cluster.base, KEY)
        thread_id = (await client.create_thread("reference behind haproxy"))["id"]
        owner = await asyncio.to_thread(cluster.owner, thread_id)
        other = next(i for i in range(len(cluster.ports)) if i != owner)
        watcher = ReferenceClient(session, f"http://127.0.0.1:{cluster.ports[other]}", KEY)
        opened = asyncio.Event()
        whole_task = asyncio.create_task(watcher.stream(thread_id, opened=opened))
        await until_opened(opened, whole_task)
        # [hang]: a few tokens, then the run stays active until it is cancelled.
        posted = await client.post(thread_id, "[hang] survive the owner's kill")
        first = await client.stream(thread_id, stop=lambda events: any(
            e.name == "text_delta" for e in events))
        cluster.gateways[owner].kill9()
        cluster.gateways[owner].start()
        await asyncio.to_thread(cluster.settle)  # the group has settled again
        resumed_open = asyncio.Event()
        resumed_task = asyncio.create_task(
            client.stream(thread_id, last=first[-1], opened=resumed_open))
        await until_opened(resumed_open, resumed_task)
        status, _ = await asyncio.to_thread(
            cluster.call, "POST", f"/v1/threads/{thread_id}/runs/{posted['run_id']}/cancel")
        assert status == 202
        whole, resumed = await whole_task, await resumed_task
    assert resumed and first + resumed == whole, cluster.logs()
    assert [e.name for e in whole[-2:]] == ["run_cancelled", "done"] and \
        whole[-1].data == "[DONE]", whole[-3:]
