"""REST semantics against the real processor and worker: the 409 race, idempotency,
tenants, input limits, problem+json, cancel, OpenAPI and health."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.openapi import SPEC
from gateway.app import Options, create_app, max_body_bytes
from gateway.keys import FEED
from streams.config import Settings
from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, AUTH_B, KEYS, Stack, gateway_env

pytestmark = pytest.mark.kafka


def _assert_problem(status: int, body: Any, expected_status: int) -> None:
    assert status == expected_status, body
    assert {"type", "title", "status", "detail"} <= set(body), body
    assert body["status"] == expected_status


async def _raw(stack: Stack, method: str, path: str, *, data: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    async with stack.session.request(method, stack.url(path), data=data,
                                     headers=headers) as response:
        text = await response.text()
        body = json.loads(text) if text else None
        return response.status, response.content_type, body


async def test_twenty_concurrent_posts_accept_exactly_one(stack: Stack) -> None:
    """Of 20 posts at once one gets 202 and 19 get 409 naming the active run, visible at once."""
    thread_id = await stack.create_thread()
    results = await asyncio.gather(*(stack.post(thread_id, f"[slow] race {i}")
                                     for i in range(20)))
    statuses = sorted(status for status, _ in results)
    assert statuses == [202] + [409] * 19, results
    accepted = next(body for status, body in results if status == 202)
    conflicts = [body for status, body in results if status == 409]
    assert {c["active_run_id"] for c in conflicts} == {accepted["run_id"]}
    assert all(c["type"].endswith("/run-active") for c in conflicts)
    # Read-your-writes: the accepted run is visible at once.
    status, thread = await stack.get(f"/v1/threads/{thread_id}")
    assert status == 200 and thread["active_run"]["run_id"] == accepted["run_id"]
    assert thread["run_count"] == 1 and "runs" not in thread
    status, messages = await stack.get(f"/v1/threads/{thread_id}/messages")
    assert [m["message_id"] for m in messages["messages"]][:1] == [accepted["message_id"]]


async def test_idempotency_key_returns_the_original_run_and_refuses_another_body(
        stack: Stack) -> None:
    """A repeated key returns the original run; another body with it gets 422; keys are per thread."""
    thread_id = await stack.create_thread()
    status, first = await stack.post(thread_id, "[slow] once only", key="k-1")
    assert status == 202 and first["status"] == "accepted", first
    status, again = await stack.post(thread_id, "[slow] once only", key="k-1")
    assert status == 202, again
    assert (again["run_id"], again["message_id"]) == (first["run_id"], first["message_id"])
    assert again.get("replayed") is True
    status, other = await stack.post(thread_id, "something else", key="k-1")
    _assert_problem(status, other, 422)
    assert other["existing_run_id"] == first["run_id"]
    # The same key on another thread is another message.
    other_thread = await stack.create_thread()
    status, elsewhere = await stack.post(other_thread, "[slow] once only", key="k-1")
    assert status == 202 and elsewhere["run_id"] != first["run_id"]
    # After the run ends the key still answers with the original run, not a new one.
    await read_sse(stack.session, stack.url(f"/v1/runs/{first['run_id']}/events"),
                   headers=AUTH_A)
    status, late = await stack.post(thread_id, "[slow] once only", key="k-1")
    assert status == 202 and late["run_id"] == first["run_id"], late
    status, messages = await stack.get(f"/v1/threads/{thread_id}/messages")
    assert [m["role"] for m in messages["messages"]] == ["user", "assistant"]


async def test_other_tenants_get_404_and_missing_or_bad_keys_get_401(stack: Stack) -> None:
    """Another tenant's threads and runs are 404, and a missing or wrong key is 401."""
    thread_id = await stack.create_thread()
    status, posted = await stack.post(thread_id, "mine")
    assert status == 202
    run_id = posted["run_id"]
    own = await read_sse(stack.session, stack.url(f"/v1/runs/{run_id}/events"), headers=AUTH_A)
    assert own[-1].event == "done"
    for path in (f"/v1/threads/{thread_id}", f"/v1/threads/{thread_id}/messages",
                 f"/v1/threads/{thread_id}/stream", f"/v1/runs/{run_id}/events"):
        status, content_type, body = await _raw(stack, "GET", path, headers=AUTH_B)
        _assert_problem(status, body, 404)
        assert content_type == "application/problem+json"
        status, _, body = await _raw(stack, "GET", path)
        _assert_problem(status, body, 401)
        status, _, body = await _raw(stack, "GET", path, headers={"Authorization": "Bearer no"})
        _assert_problem(status, body, 401)
    status, _ = await stack.post(thread_id, "not yours", auth=AUTH_B)
    assert status == 404
    status, _, body = await _raw(stack, "POST", f"/v1/threads/{thread_id}/runs/{run_id}/cancel",
                                 headers=AUTH_B)
    _assert_problem(status, body, 404)
    status, _, body = await _raw(stack, "GET", f"/v1/threads/{thread_id}",
                                 headers={"Authorization": "Basic a2V5LWE="})
    _assert_problem(status, body, 401)
    # EventSource clients: the key as a query parameter or a cookie, on SSE routes only.
    by_query = await read_sse(stack.session,
                              stack.url(f"/v1/runs/{run_id}/events?access_token=key-a"))
    assert by_query == own
    async with aiohttp.ClientSession(cookies={"threadline_token": "key-a"}) as session:
        by_cookie = await read_sse(session, stack.url(f"/v1/runs/{run_id}/events"))
    assert by_cookie == own
    status, _, body = await _raw(stack, "GET", f"/v1/threads/{thread_id}?access_token=key-a")
    _assert_problem(status, body, 401)


async def test_bad_input_gets_the_right_problem(stack: Stack) -> None:
    """Each kind of bad request gets its own problem type and status."""
    thread_id = await stack.create_thread()
    post = f"/v1/threads/{thread_id}/user_message"
    json_a = {**AUTH_A, "Content-Type": "application/json"}
    cases = [
        (post, b"{not json", 400, "/malformed-json"),
        (post, b"[1, 2]", 422, "/invalid-body"),
        (post, b'{"input_text": 7}', 422, "/invalid-body"),
        (post, b"", 422, "/invalid-body"),
        (post, b'{"input_text": ""}', 422, "/invalid-input"),
        (post, b'{"input_text": "  \\n "}', 422, "/invalid-input"),
        (post, json.dumps({"input_text": "x" * 32_001}).encode(), 422, "/invalid-input"),
        (post, json.dumps({"input_text": "x" * max_body_bytes(32_000)}).encode(), 413,
         "/body-too-large"),
        ("/v1/threads", b'{"title": 5}', 422, "/invalid-body"),
        ("/v1/threads/does-not-exist/user_message", b'{"input_text": "hi"}', 404, "/not-found"),
    ]
    for path, data, expected, slug in cases:
        status, content_type, body = await _raw(stack, "POST", path, data=data, headers=json_a)
        _assert_problem(status, body, expected)
        assert content_type == "application/problem+json" and body["type"].endswith(slug), \
            (path, data[:40], body)
    status, _, body = await _raw(stack, "POST", post, data=b'{"input_text": "hi"}',
                                 headers={**json_a, "Idempotency-Key": "x" * 300})
    _assert_problem(status, body, 400)
    stream = f"/v1/threads/{thread_id}/stream"
    good_elsewhere = stack.server.app[FEED].tokens.sign(thread_id, 99, 0, 0, 0, "r")
    for headers, query in [({"Last-Event-ID": "garbage!"}, ""), ({}, "?last_event_id=AAAA"),
                           ({"Last-Event-ID": good_elsewhere}, ""), ({}, "?last_message_id=nope")]:
        status, content_type, body = await _raw(stack, "GET", stream + query,
                                                headers={**AUTH_A, **headers})
        _assert_problem(status, body, 400)
        assert content_type == "application/problem+json"
    status, _, body = await _raw(stack, "GET", "/v1/nothing-here", headers=AUTH_A)
    _assert_problem(status, body, 404)
    status, _, body = await _raw(stack, "PUT", f"/v1/threads/{thread_id}", headers=AUTH_A)
    _assert_problem(status, body, 405)


async def test_cancel_ends_the_run_and_a_second_cancel_is_refused(stack: Stack) -> None:
    """Cancel ends the run with run_cancelled then done; cancelling again gets 409."""
    thread_id = await stack.create_thread()
    status, posted = await stack.post(thread_id, "[slow] please stop me")
    assert status == 202
    run_id = posted["run_id"]
    cancel = f"/v1/threads/{thread_id}/runs/{run_id}/cancel"
    status, _, body = await _raw(stack, "POST", cancel, data=b'{"reason": "enough"}',
                                 headers=AUTH_A)
    assert status == 202 and body == {"run_id": run_id, "status": "cancelled"}, body
    events = await read_sse(stack.session, stack.url(f"/v1/runs/{run_id}/events"),
                            headers=AUTH_A)
    assert [e.event for e in events[-2:]] == ["run_cancelled", "done"]
    assert events[-2].json["detail"] == "enough"
    status, _, body = await _raw(stack, "POST", cancel, headers=AUTH_A)
    _assert_problem(status, body, 409)
    status, thread = await stack.get(f"/v1/threads/{thread_id}")
    assert thread["active_run"] is None and thread["last_run"]["status"] == "cancelled"
    assert thread["last_run"]["run_id"] == run_id


async def test_openapi_describes_every_route(stack: Stack) -> None:
    """/openapi.json describes exactly the routes the app serves."""
    status, spec = await stack.get("/openapi.json", auth={})
    assert status == 200 and spec == SPEC and spec["openapi"].startswith("3.1")
    app = stack.server.app
    assert app is not None
    routes = {(r.method.lower(), r.resource.canonical)  # type: ignore[union-attr]
              for r in app.router.routes() if r.method != "HEAD"}
    described = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert routes == described


async def test_healthz_is_503_without_processor_and_worker(stack: Stack, tmp_path: Any) -> None:
    """/healthz is 200 with the whole stack, 503 naming the missing groups without it."""
    status, health = await stack.get("/healthz", auth={})
    assert status == 200 and health["status"] == "ok"
    assert all(g["members"] >= 1 for g in health["groups"].values())
    lonely = Settings.from_env(gateway_env(stack.settings.bootstrap, tmp_path))
    assert lonely.gateway.api_keys == KEYS
    server = TestServer(create_app(lonely, Options(health_timeout_s=2)), host="127.0.0.1")
    await server.start_server()
    try:
        async with stack.session.get(str(server.make_url("/healthz"))) as response:
            body = await response.json()
            assert response.status == 503, body
        assert body["broker"]["ok"] is True
        assert sorted(body["missing_members"]) == [f"{lonely.topic_prefix}processor",
                                                   f"{lonely.topic_prefix}worker"]
    finally:
        await server.close()


async def test_the_root_says_where_each_api_lives(stack: Stack) -> None:
    """GET / lists the APIs without a key; a request an SDK pointed at the bare root
    would send gets a 404 naming /langgraph (with a key or without: no 401 that sends
    the user to their key); /favicon.ico is an empty 204; other paths still need a key."""
    status, _, body = await _raw(stack, "GET", "/", headers={})
    assert status == 200 and body["apis"]["langgraph"]["prefix"] == "/langgraph"
    for headers in ({}, AUTH_A):
        status, _, body = await _raw(stack, "POST", "/threads", data=b"{}", headers=headers)
        _assert_problem(status, body, 404)
        assert body["type"].endswith("/wrong-prefix") and "/langgraph" in body["detail"]
    status, _, body = await _raw(stack, "POST", "/api/chat", data=b"{}", headers=AUTH_A)
    _assert_problem(status, body, 404)
    assert "/v1/ai/chat" in body["detail"]
    async with stack.session.get(stack.url("/favicon.ico")) as response:
        assert response.status == 204
    status, _, body = await _raw(stack, "GET", "/nothing-here", headers={})
    _assert_problem(status, body, 401)
