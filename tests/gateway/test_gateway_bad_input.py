"""Hostile input that once got a 500 (issue 12): each gets a 4xx problem+json now."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gateway.conftest import AUTH_A, Stack
from tests.raw_http import raw_request

pytestmark = pytest.mark.kafka


def _assert_problem(status: int, content_type: str, body: Any, expected: int, slug: str) -> None:
    assert status == expected, body
    assert content_type.startswith("application/problem+json"), content_type
    assert body["status"] == expected and body["type"].endswith(slug), body


async def _post_bytes(stack: Stack, path: str, data: bytes) -> tuple[int, str, Any]:
    async with stack.session.post(stack.url(path), data=data, headers={
            **AUTH_A, "Content-Type": "application/json"}) as response:
        return response.status, response.content_type, await response.json(content_type=None)


@pytest.mark.parametrize("value", [b"Bearer \xff\xfe", b"Bearer key-a\xc3", b"\xe9t\xe9 key-a",
                                   b"Bearer k\xc3\xa9y"])
async def test_an_authorization_header_that_is_not_utf8_or_ascii_gets_401(
        stack: Stack, value: bytes) -> None:
    """An Authorization header with non-ASCII bytes gets a 401 problem, not a crash."""
    answer = await raw_request(stack.url("/"), "GET", "/v1/threads/x", [(b"Authorization", value)])
    assert answer.status == 401, answer
    assert answer.headers["content-type"].startswith("application/problem+json")
    assert answer.json["type"].endswith("/unauthorized")


async def test_a_lone_surrogate_in_a_title_or_input_gets_422_naming_the_field(
        stack: Stack) -> None:
    """A lone surrogate escape in a title or message gets a 422 naming the field; a pair is fine."""
    thread_id = await stack.create_thread()
    for path, field in [("/v1/threads", "title"),
                        (f"/v1/threads/{thread_id}/user_message", "input_text")]:
        for text in ['"\\ud800"', '"abc\\udfff"', '"\\udc00\\ud800"', '"x\\ud83d"']:
            data = f'{{"{field}": {text}}}'.encode()
            status, content_type, body = await _post_bytes(stack, path, data)
            _assert_problem(status, content_type, body, 422, "/invalid-body")
            assert body["field"] == field and field in body["detail"], body
    # A surrogate pair is one legal character.
    status, posted = await stack.post(thread_id, "\U0001f600 fine")
    assert status == 202, posted


@pytest.mark.parametrize("depth", [1_000, 10_000, 50_000])
async def test_deeply_nested_json_gets_400(stack: Stack, depth: int) -> None:
    """Deeply nested JSON bodies get a 400 or 422 problem, not a crash."""
    thread_id = await stack.create_thread()
    for path in ["/v1/threads", f"/v1/threads/{thread_id}/user_message"]:
        for data in [b"[" * depth + b"]" * depth,
                     b'{"input_text": "hi", "x": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"]:
            status, content_type, body = await _post_bytes(stack, path, data)
            assert status in (400, 422), body
            assert content_type == "application/problem+json", body


@pytest.mark.parametrize("char", ["\u00e9", "\U0001f600", "\u4e2d"])
async def test_the_longest_legal_message_in_the_widest_escaping_is_accepted(
        stack: Stack, char: str) -> None:
    """A message at the character limit is accepted however wide its JSON escaping; one more is refused."""
    limit = stack.settings.policy.max_input_chars
    thread_id = await stack.create_thread()
    text = char * limit
    body = json.dumps({"input_text": text}).encode()  # \u00e9 escapes: 6 or 12 bytes a char
    assert len(body) >= 6 * limit
    status, content_type, answer = await _post_bytes(
        stack, f"/v1/threads/{thread_id}/user_message", body)
    assert status == 202, answer
    # One character more is refused by count, after parsing, not by size.
    status, content_type, answer = await _post_bytes(
        stack, f"/v1/threads/{thread_id}/user_message",
        json.dumps({"input_text": text + char}).encode())
    _assert_problem(status, content_type, answer, 422, "/invalid-input")
