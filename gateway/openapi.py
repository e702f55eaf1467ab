"""GET /openapi.json: the OpenAPI 3.1 description of every route, written by hand."""

from __future__ import annotations

from typing import Any

from aiohttp import web

__all__ = ["SPEC", "openapi"]


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _json(description: str, ref: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}}


_THREAD_ID = {"name": "thread_id", "in": "path", "required": True, "schema": {"type": "string"}}
_RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
_UNAUTHORIZED = _problem("Missing or unknown API key")
_NOT_FOUND = _problem("No such thread or run for this tenant")
_POSTS = _problem("Too many posts a second for this tenant (Retry-After)")
_STREAMS = _problem("Too many open streams or replays for this tenant (Retry-After)")
_SSE_PARAMS = [
    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"},
     "description": "Resume right after this event id."},
    {"name": "last_event_id", "in": "query", "schema": {"type": "string"},
     "description": "Same as Last-Event-ID, for clients that cannot set headers."},
    {"name": "last_entry_id", "in": "query", "schema": {"type": "string"},
     "description": "Reference-API name of last_event_id."},
    {"name": "last_message_id", "in": "query", "schema": {"type": "string"},
     "description": "Reference API: a message the client holds; alone, the stream starts "
                    "as a fresh one (the run in progress, else live)."},
    {"name": "access_token", "in": "query", "schema": {"type": "string"},
     "description": "The API key, for EventSource clients (also the threadline_token cookie)."},
]
_SSE = {"description": "text/event-stream. Events: message_start, text_start, text_delta, "
                       "text_end, step, citations, message_end, run_accepted, "
                       "attempt_dispatched, retry_scheduled, run_completed, run_failed, "
                       "run_cancelled, done (data [DONE]) and message_not_streaming.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}}}

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Threadline gateway", "version": "1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Problem": {"type": "object", "required": ["type", "title", "status"], "properties": {
                "type": {"type": "string"}, "title": {"type": "string"},
                "status": {"type": "integer"}, "detail": {"type": "string"},
                "instance": {"type": "string"}}},
            "Thread": {"type": "object", "properties": {
                "thread_id": {"type": "string"}, "title": {"type": "string"},
                "created_at_ms": {"type": "integer"}, "workflow_id": {"type": "string"},
                "message_count": {"type": "integer"},
                "active_run": {"type": ["object", "null"]}, "runs": {"type": "array"},
                "status": {"type": "string", "enum": ["created", "pending"]}}},
            "RunStarted": {"type": "object", "required": ["workflow_id", "run_id", "message_id"],
                           "properties": {
                               "workflow_id": {"type": "string"}, "run_id": {"type": "string"},
                               "message_id": {"type": "string"},
                               "status": {"type": "string", "enum": ["accepted", "pending"]},
                               "replayed": {"type": "boolean"}}},
            "Messages": {"type": "object", "properties": {
                "thread_id": {"type": "string"},
                "messages": {"type": "array", "items": {"type": "object", "properties": {
                    "message_id": {"type": "string"},
                    "role": {"type": "string", "enum": ["user", "assistant"]},
                    "text": {"type": "string"}, "run_id": {"type": "string"},
                    "created_at_ms": {"type": "integer"}, "steps": {"type": "array"},
                    "citations": {"type": "array"}}}}}},
            "Cancel": {"type": "object", "properties": {
                "run_id": {"type": "string"},
                "status": {"type": "string", "enum": ["cancelled", "pending"]}}},
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/healthz": {"get": {"security": [], "summary": "Broker, processor and worker liveness",
                             "responses": {"200": {"description": "healthy"},
                                           "503": {"description": "something is missing"}}}},
        "/openapi.json": {"get": {"security": [], "summary": "This document",
                                  "responses": {"200": {"description": "OpenAPI 3.1"}}}},
        "/demo": {"get": {"security": [], "summary": "A browser page watching a thread's stream "
                                                     "(/demo#key=KEY&thread=ID)",
                          "responses": {"200": {"description": "HTML"}}}},
        "/v1/threads": {"post": {
            "summary": "Create a thread",
            "requestBody": {"content": {"application/json": {"schema": {
                "type": "object", "properties": {"title": {"type": "string"}}}}}},
            "responses": {"201": _json("Created", "Thread"),
                          "202": _json("Queued, not decided yet", "Thread"),
                          "400": _problem("Malformed JSON"), "401": _UNAUTHORIZED,
                          "413": _problem("Body too large"), "422": _problem("Invalid body"),
                          "429": _POSTS}}},
        "/v1/threads/{thread_id}": {"get": {
            "summary": "A thread", "parameters": [_THREAD_ID],
            "responses": {"200": _json("The thread", "Thread"), "401": _UNAUTHORIZED,
                          "404": _NOT_FOUND}}},
        "/v1/threads/{thread_id}/messages": {"get": {
            "summary": "Stored messages, user and assistant, in order",
            "parameters": [_THREAD_ID],
            "responses": {"200": _json("The messages", "Messages"), "401": _UNAUTHORIZED,
                          "404": _NOT_FOUND}}},
        "/v1/threads/{thread_id}/user_message": {"post": {
            "summary": "Post a user message: starts a run",
            "parameters": [_THREAD_ID, {"name": "Idempotency-Key", "in": "header",
                                        "schema": {"type": "string", "maxLength": 255}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["input_text"],
                "properties": {"input_text": {"type": "string", "minLength": 1}}}}}},
            "responses": {"202": _json("Accepted (or pending, or the original run of a "
                                       "repeated Idempotency-Key)", "RunStarted"),
                          "400": _problem("Malformed JSON or Idempotency-Key"),
                          "401": _UNAUTHORIZED, "404": _NOT_FOUND,
                          "409": _problem("A run is active (active_run_id)"),
                          "413": _problem("Body too large"),
                          "422": _problem("Empty or too long input, bad body, or the "
                                          "Idempotency-Key was used with another body"),
                          "429": _problem("Too many posts a second, or runs in progress, "
                                          "for this tenant (Retry-After)")}}},
        "/v1/threads/{thread_id}/runs/{run_id}/cancel": {"post": {
            "summary": "Cancel a run", "parameters": [_THREAD_ID, _RUN_ID],
            "responses": {"202": _json("Cancelled or pending", "Cancel"), "401": _UNAUTHORIZED,
                          "404": _NOT_FOUND, "409": _problem("The run already ended"),
                          "429": _POSTS}}},
        "/v1/threads/{thread_id}/stream": {"get": {
            "summary": "Every run of the thread as server-sent events",
            "parameters": [_THREAD_ID, *_SSE_PARAMS],
            "responses": {"200": _SSE, "400": _problem("Unusable Last-Event-ID"),
                          "401": _UNAUTHORIZED, "404": _NOT_FOUND, "429": _STREAMS}}},
        "/v1/runs/{run_id}/events": {"get": {
            "summary": "One run from its start; closes after done",
            "parameters": [_RUN_ID, *_SSE_PARAMS],
            "responses": {"200": _SSE, "400": _problem("Unusable Last-Event-ID"),
                          "401": _UNAUTHORIZED, "404": _NOT_FOUND, "429": _STREAMS}}},
    },
}


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(SPEC)
