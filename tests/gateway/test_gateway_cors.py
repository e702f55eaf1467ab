"""CORS (gateway/http/cors.py): a gateway with an allowed origin answers its preflights
for the native API, the LangGraph API and the AI SDK chat, and marks its answers (a
problem, an SSE stream) readable by that origin; another origin's preflight is a 403
and its answers carry nothing a browser would let the page read; with no origin
configured (the default) every preflight is refused. A browser's own view of this is
tests/browser/test_cross_origin_app.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from multidict import CIMultiDictProxy

from gateway.app import Options, create_app
from streams.config import Settings
from tests.gateway.conftest import AUTH_A, Stack

pytestmark = pytest.mark.kafka

APP = "http://app.example:5173"
OTHER = "https://evil.example"


@pytest.fixture
async def cors_gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[TestServer]:
    """A second gateway on the stack's topics (its own data folder) that allows APP."""
    settings = Settings.from_env({**stack.env, "THREADLINE_CORS_ORIGINS": APP,
                                  "THREADLINE_DATA_DIR": str(tmp_path)})
    server = TestServer(create_app(settings, Options(keepalive_s=1.0)), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


async def _preflight(stack: Stack, server: TestServer, path: str, origin: str, method: str = "POST",
                     headers: str = "authorization, content-type, idempotency-key") \
        -> tuple[int, CIMultiDictProxy[str]]:
    async with stack.session.options(str(server.make_url(path)), headers={
            "Origin": origin, "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": headers}) as response:
        await response.read()
        return response.status, response.headers


async def test_an_allowed_origin_is_served_with_preflight(stack: Stack,
                                                          cors_gateway: TestServer) -> None:
    """Preflights of each API answer 204 for APP without a key; the answers that
    follow (a 201, a 401 problem, an SSE stream) name APP and expose Location."""
    for path, method in (("/v1/threads", "POST"), ("/v1/threads/t/stream", "GET"),
                         ("/langgraph/threads/search", "POST"), ("/v1/ai/chat", "POST"),
                         ("/v1/threads/t", "DELETE")):
        status, headers = await _preflight(stack, cors_gateway, path, APP, method)
        assert status == 204, (path, status)
        assert headers["Access-Control-Allow-Origin"] == APP
        assert method in headers["Access-Control-Allow-Methods"]
        assert "idempotency-key" in headers["Access-Control-Allow-Headers"]
    url = cors_gateway.make_url
    async with stack.session.post(str(url("/v1/threads")), json={"title": "from a browser app"},
                                  headers={**AUTH_A, "Origin": APP}) as response:
        body = await response.json()
        assert response.status == 201, body
        assert response.headers["Access-Control-Allow-Origin"] == APP
        assert "Origin" in response.headers["Vary"]
        assert "Location" in response.headers["Access-Control-Expose-Headers"]
    async with stack.session.get(str(url("/v1/threads")), headers={"Origin": APP}) as response:
        assert response.status == 401  # the problem is readable: the app can say why
        assert response.headers["Access-Control-Allow-Origin"] == APP
    async with stack.session.get(str(url(f"/v1/threads/{body['thread_id']}/stream")),
                                 headers={**AUTH_A, "Origin": APP}) as response:
        assert response.status == 200
        assert response.headers["Access-Control-Allow-Origin"] == APP  # sent as it was prepared
        assert await response.content.readline()  # it streams


async def test_another_origin_is_refused(stack: Stack, cors_gateway: TestServer) -> None:
    """OTHER's preflight is a 403 problem with no allow header; its requests are answered
    without one (a browser keeps the answer from the page); a method or header the
    gateway does not take is refused even for APP."""
    status, headers = await _preflight(stack, cors_gateway, "/v1/threads", OTHER)
    assert status == 403
    assert "Access-Control-Allow-Origin" not in headers
    async with stack.session.get(str(cors_gateway.make_url("/v1/threads")),
                                 headers={**AUTH_A, "Origin": OTHER}) as response:
        assert response.status == 200
        assert "Access-Control-Allow-Origin" not in response.headers
    status, _ = await _preflight(stack, cors_gateway, "/v1/threads", APP, headers="x-evil")
    assert status == 403
    status, _ = await _preflight(stack, cors_gateway, "/v1/threads", APP, method="TRACE")
    assert status == 403


async def test_no_origin_is_allowed_by_default(stack: Stack) -> None:
    """The stack's own gateway has no THREADLINE_CORS_ORIGINS: every preflight is 403."""
    async with stack.session.options(stack.url("/v1/threads"), headers={
            "Origin": APP, "Access-Control-Request-Method": "POST"}) as response:
        assert response.status == 403
        assert "Access-Control-Allow-Origin" not in response.headers
