"""The HTTP plumbing every API of the gateway shares, native and adapters alike.

JSON bodies in (`read_json_body`) and answers out (`json_answer`), integers from a
query (`query_limit`) or a body (`int_field`), text every layer can carry
(`is_text`), the end of a thread's history (`END_SEQ`), and the readiness gate:
`starting_middleware` answers 503 (with Retry-After) while the gateway loads its read
model, on `/v1` and on every sub-app (`wait_started`, `READY_WAIT`). Errors are `Problem`s
(`gateway.http.problems`), so they are problem+json wherever they are raised.
"""

from __future__ import annotations

import json
from typing import Any, Final

from aiohttp import web

from gateway.http.auth import is_public
from gateway.http.problems import Handler, Problem
from gateway.keys import FEED

__all__ = ["END_SEQ", "READY_WAIT", "STREAM_WAIT_S", "int_field", "is_text", "json_answer",
           "query_limit", "read_json_body", "starting_middleware", "wait_started"]

END_SEQ: Final = (1 << 63) - 1  # a cursor after every message: the newest messages
STREAM_WAIT_S: Final = 60.0  # how long a stream opened during the load waits for it
# On a sub-app: how long its requests wait for the load before their 503 (default 0).
READY_WAIT = web.AppKey("ready_wait_s", float)


def json_answer(status: int, body: dict[str, Any] | list[Any],
                headers: dict[str, str] | None = None) -> web.Response:
    """A JSON response."""
    return web.json_response(body, status=status, headers=headers)


async def read_json_body(request: web.Request, *, required: bool) -> dict[str, Any]:
    """The request's JSON object body; {} if empty and not `required`. 400 if it is not
    JSON, 422 if it is not an object (413 past the app's `client_max_size`)."""
    raw = await request.read()  # HTTPRequestEntityTooLarge past client_max_size
    if not raw.strip():
        if required:
            raise Problem(422, "invalid-body", "a JSON object body is required")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Problem(400, "malformed-json", f"the body is not JSON: {exc}") from exc
    except RecursionError as exc:  # json's C scanner recurses once per nesting level
        raise Problem(400, "malformed-json", "the body is nested too deeply") from exc
    if not isinstance(body, dict):
        raise Problem(422, "invalid-body", "the body must be a JSON object")
    return body


def query_limit(request: web.Request, default: int, maximum: int) -> int:
    """The `limit` query parameter, from 1 to `maximum`, `default` if absent; else 400."""
    raw = request.query.get("limit")
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= maximum:
        raise Problem(400, "bad-limit", f"'limit' must be an integer from 1 to {maximum}")
    return limit


def int_field(value: object, name: str, default: int, maximum: int) -> int:
    """An integer field from 0 to `maximum`, `default` if absent (None); else 422."""
    if value is None:
        return default
    try:
        number = int(str(value))
    except (TypeError, ValueError):
        number = -1
    if not 0 <= number <= maximum:
        raise Problem(422, "invalid-body", f"'{name}' must be an integer from 0 to {maximum}")
    return number


def is_text(value: object) -> bool:
    """A string every layer can carry (JSON and URLs let unpaired surrogates through)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


async def wait_started(request: web.Request, wait_s: float) -> None:
    """503 (Retry-After) unless the stream feed runs, after waiting `wait_s` for it."""
    feed = request.config_dict[FEED]
    if feed.started or (wait_s > 0 and await feed.wait_started(wait_s)):
        return
    raise Problem(503, "starting", "the gateway is loading its read model; retry shortly",
                  headers={"Retry-After": "2"})


@web.middleware
async def starting_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """While the read model loads, the APIs answer 503 (with Retry-After): every path
    under `/v1/` and every path of a sub-app (an adapter), public paths aside. A
    sub-app's requests wait up to its `READY_WAIT` first.

    SSE streams under `/v1/` wait for the load: a browser's EventSource reconnects
    after a network error but gives up for good on an error status, so a 503 would
    end a stream that a gateway restart only meant to interrupt."""
    path = request.path
    if not request.config_dict[FEED].started and not is_public(path) and \
            (path.startswith("/v1/") or len(request.match_info.apps) > 1):
        streaming = request.method == "GET" and path.startswith("/v1/") and \
            path.endswith(("/stream", "/events"))
        await wait_started(request, STREAM_WAIT_S if streaming else
                           request.config_dict.get(READY_WAIT, 0.0))
    return await handler(request)
