"""RFC 9457 problem details: every error the gateway answers is `application/problem+json`.

`Problem` is the one exception handlers raise; `problem_middleware` turns it, aiohttp's
own HTTP errors (404 route, 405, 413) and unexpected exceptions into problem responses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import Any

from aiohttp import web

__all__ = ["PROBLEM_JSON", "Problem", "problem_middleware", "problem_response"]

log = logging.getLogger("threadline.gateway")

PROBLEM_JSON = "application/problem+json"
_TYPE_BASE = "https://threadline.dev/problems/"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Problem(Exception):
    """An error answered as problem+json; `extra` adds members (e.g. `active_run_id`)."""

    def __init__(self, status: int, slug: str, detail: str, *, title: str | None = None,
                 headers: Mapping[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.slug = slug
        self.detail = detail
        self.title = title or HTTPStatus(status).phrase
        self.headers = dict(headers or {})
        self.extra = extra


def problem_response(problem: Problem, instance: str | None = None) -> web.Response:
    """An RFC 9457 application/problem+json response for a Problem."""
    body: dict[str, Any] = {
        "type": _TYPE_BASE + problem.slug,
        "title": problem.title,
        "status": problem.status,
        "detail": problem.detail,
    }
    if instance:
        body["instance"] = instance
    body.update(problem.extra)
    return web.Response(status=problem.status, text=json.dumps(body),
                        content_type=PROBLEM_JSON, headers=problem.headers)


_HTTP_SLUGS = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large",
               400: "bad-request", 401: "unauthorized"}


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Middleware that turns Problems, HTTP errors and crashes into problem+json responses."""
    try:
        return await handler(request)
    except Problem as problem:
        return problem_response(problem, request.path)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow",)}
        slug = _HTTP_SLUGS.get(exc.status, "http-error")
        detail = exc.reason if exc.text is None or exc.text.startswith(f"{exc.status}:") \
            else exc.text
        return problem_response(Problem(exc.status, slug, detail, headers=headers), request.path)
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem_response(
            Problem(500, "internal", "the gateway failed to answer; see its log"), request.path)
