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
_MESSAGE_ID = {"name": "message_id", "in": "path", "required": True, "schema": {"type": "string"}}
_KEY = {"name": "Idempotency-Key", "in": "header", "schema": {"type": "string", "maxLength": 255},
        "description": "The same key answers with the same run (a regenerate without one "
                       "is not safe to resend)."}
_BRANCH = {"name": "branch", "in": "query", "schema": {"type": "integer"},
           "description": "Read this branch (a seq from GET .../branches) instead of the "
                          "current one."}
_STRATEGY = {"type": "string", "default": "reject",
             "enum": ["reject", "enqueue", "interrupt", "rollback"],
             "description": "What to do if a run is active (docs/branches.md)"}
_CHAT_ID = {"name": "chat_id", "in": "path", "required": True, "schema": {"type": "string"},
            "description": "The client's chat id (useChat's id), namespaced per tenant"}
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
                    "as a fresh one (the run in progress, else live). With last_entry_id "
                    "(both from the last event's data: id and seq): right after that event "
                    "while the message streams, message_not_streaming once it ended."},
    {"name": "access_token", "in": "query", "schema": {"type": "string"},
     "description": "The API key, for EventSource clients (also the threadline_token cookie)."},
]
_LIMIT_MESSAGES = {"name": "limit", "in": "query",
                   "schema": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                   "description": "Messages per page: 100 if absent, at most 1000."}
_CURSORS = [
    {"name": "after", "in": "query", "schema": {"type": "string"},
     "description": "A next_cursor: the messages after it, oldest first."},
    {"name": "before", "in": "query", "schema": {"type": "string"},
     "description": "A cursor, or `end`: the messages just before it, oldest first within "
                    "the page (alone, it pages backwards toward the start; `end` reads the "
                    "newest messages)."},
]
_SSE = {"description": "text/event-stream. Events: message_start, text_start, text_delta, "
                       "text_end, step, citations, message_end, run_accepted, "
                       "attempt_dispatched, retry_scheduled, run_completed, run_failed, "
                       "run_cancelled, done (data [DONE]) and message_not_streaming.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}}}

# The LangGraph Platform runs API (gateway/adapters/langgraph.py); its objects are LangGraph's own.
_LG = "/langgraph"
_LG_SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]
_LG_OBJECT = {"description": "A LangGraph object (see langgraph-sdk's schema)",
              "content": {"application/json": {"schema": {"type": ["object", "array", "null"]}}}}
_LG_BODY = {"required": False, "content": {"application/json": {"schema": {"type": "object"}}}}
_LG_RUN_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "properties": {
        "assistant_id": {"type": "string", "description": "`agent` or the assistant's id"},
        "input": {"type": ["object", "null"],
                  "description": '{"messages": [{"role": "user", "content": "..."}]}; '
                                 'none with a checkpoint at a user message: regenerate'},
        "checkpoint_id": {"type": "string", "description": "run from this checkpoint: "
                          "regenerate, edit or post (docs/clients.md)"},
        "checkpoint": {"type": "object", "description": "{checkpoint_id}, as checkpoint_id"},
        "stream_mode": {"type": ["string", "array"],
                        "description": "values, messages, messages-tuple, updates, custom"},
        "multitask_strategy": {"type": "string",
                               "enum": ["reject", "enqueue", "interrupt", "rollback"],
                               "description": "with a run active: docs/multitask.md"},
        "if_not_exists": {"type": "string", "enum": ["create", "reject"]}}}}}}
_LG_SSE = {"description": "text/event-stream: metadata, then the parts of the stream modes, "
                          "then end; each id: resumes with Last-Event-ID",
           "content": {"text/event-stream": {"schema": {"type": "string"}}}}
_LG_ERRORS = {"401": _UNAUTHORIZED, "404": _NOT_FOUND,
              "409": _problem("A run is active, the thread exists, or the run ended"),
              "422": _problem("Unsupported or invalid field (e.g. multitask_strategy)")}


def _lg(summary: str, ok: dict[str, Any], params: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "security": _LG_SECURITY,
                                 "parameters": params or [],
                                 "responses": {"200": ok, **_LG_ERRORS}}
    if body is not None:
        operation["requestBody"] = body
    return operation


_LG_PATHS: dict[str, Any] = {
    f"{_LG}/threads": {"post": _lg("Create a thread (thread_id: the client's, per tenant)",
                                   _LG_OBJECT, body=_LG_BODY)},
    f"{_LG}/threads/search": {"post": _lg("The tenant's threads, newest first", _LG_OBJECT,
                                          body=_LG_BODY)},
    f"{_LG}/threads/{{thread_id}}": {"get": _lg("A thread", _LG_OBJECT, [_THREAD_ID])},
    f"{_LG}/threads/{{thread_id}}/state": {"get": _lg(
        "The thread's state: the newest 50 messages; metadata.messages_before pages on",
        _LG_OBJECT, [_THREAD_ID, {"name": "before", "in": "query", "schema": {
            "type": "string"}, "description": "messages_before of a state"}])},
    f"{_LG}/threads/{{thread_id}}/state/{{checkpoint_id}}": {"get": _lg(
        "The state at a checkpoint (a message's seq + 1), on any branch", _LG_OBJECT,
        [_THREAD_ID, {"name": "checkpoint_id", "in": "path", "required": True,
                      "schema": {"type": "string"}}])},
    f"{_LG}/threads/{{thread_id}}/state/checkpoint": {"post": _lg(
        "The state at the body's checkpoint.checkpoint_id", _LG_OBJECT, [_THREAD_ID],
        _LG_BODY)},
    f"{_LG}/threads/{{thread_id}}/history": {"post": _lg(
        "The current branch's checkpoints, newest first (limit, before, checkpoint)",
        _LG_OBJECT, [_THREAD_ID], _LG_BODY)},
    f"{_LG}/threads/{{thread_id}}/copy": {"post": _lg(
        "A new thread holding this one's history, every branch at the same checkpoints",
        _LG_OBJECT, [_THREAD_ID], _LG_BODY)},
    f"{_LG}/assistants/search": {"post": _lg("The one assistant", _LG_OBJECT, body=_LG_BODY)},
    f"{_LG}/assistants/{{assistant_id}}": {"get": _lg("The assistant (`agent`)", _LG_OBJECT, [
        {"name": "assistant_id", "in": "path", "required": True, "schema": {"type": "string"}}])},
    f"{_LG}/threads/{{thread_id}}/runs": {
        "post": _lg("A background run", _LG_OBJECT, [_THREAD_ID], _LG_RUN_BODY),
        "get": _lg("The thread's runs, newest first", _LG_OBJECT, [_THREAD_ID])},
    f"{_LG}/threads/{{thread_id}}/runs/stream": {"post": _lg(
        "A run, streamed", _LG_SSE, [_THREAD_ID], _LG_RUN_BODY)},
    f"{_LG}/threads/{{thread_id}}/runs/wait": {"post": _lg(
        "A run; answers the thread's values once it ended", _LG_OBJECT, [_THREAD_ID],
        _LG_RUN_BODY)},
    f"{_LG}/threads/{{thread_id}}/runs/{{run_id}}": {"get": _lg(
        "A run", _LG_OBJECT, [_THREAD_ID, _RUN_ID])},
    f"{_LG}/threads/{{thread_id}}/runs/{{run_id}}/join": {"get": _lg(
        "The thread's values once the run ended", _LG_OBJECT, [_THREAD_ID, _RUN_ID])},
    f"{_LG}/threads/{{thread_id}}/runs/{{run_id}}/stream": {"get": _lg(
        "Join a run's stream from its start, or after Last-Event-ID", _LG_SSE,
        [_THREAD_ID, _RUN_ID, {"name": "Last-Event-ID", "in": "header",
                               "schema": {"type": "string"},
                               "description": "-1, or none: from the run's start"},
         {"name": "stream_mode", "in": "query", "schema": {"type": "string"},
          "description": "a mode, repeated for several, or a JSON list of modes"}])},
    f"{_LG}/threads/{{thread_id}}/runs/{{run_id}}/cancel": {"post": {
        **_lg("Cancel a run (action=interrupt only)", _LG_OBJECT, [_THREAD_ID, _RUN_ID]),
        "responses": {"202": {"description": "Cancelled"}, **_LG_ERRORS}}},
}

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Threadline gateway", "version": "1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
        "schemas": {
            "Problem": {"type": "object", "required": ["type", "title", "status"], "properties": {
                "type": {"type": "string"}, "title": {"type": "string"},
                "status": {"type": "integer"}, "detail": {"type": "string"},
                "instance": {"type": "string"}}},
            "Thread": {"type": "object", "description": (
                "A thread's bounded state. There is no list of its runs (it grew without "
                "bound): `last_run` is the most recent run that ended, and each user "
                "message carries its run's status (GET .../messages)."), "properties": {
                "id": {"type": "string", "description": "Same as thread_id."},
                "thread_id": {"type": "string"}, "title": {"type": "string"},
                "display_title": {"type": "string", "description": (
                    "A readable title, derived when read: the title unless it is blank "
                    "or a bare id (a LangGraph thread's title keeps the client's id), "
                    "else the first message's start, else \"Untitled thread\"; at most "
                    "80 characters.")},
                "created_at_ms": {"type": "integer"},
                "updated_at_ms": {"type": "integer",
                                  "description": "When the last event changed the thread."},
                "workflow_id": {"type": "string"},
                "message_count": {"type": "integer"}, "run_count": {"type": "integer"},
                "branch": {"type": "integer", "description": (
                    "The current branch: the seq of its newest message (-1: none yet). "
                    "docs/branches.md")},
                "branch_count": {"type": "integer", "description": "Branches, the current "
                                 "one included (1 until a regenerate or edit)."},
                "active_run": {"type": ["object", "null"], "properties": {
                    "run_id": {"type": "string"}, "message_id": {"type": "string"},
                    "attempt": {"type": "integer"}, "status": {"type": "string"},
                    "accepted_at_ms": {"type": ["integer", "null"]}}},
                "last_run": {"type": ["object", "null"], "properties": {
                    "run_id": {"type": "string"}, "message_id": {"type": "string"},
                    "status": {"type": "string"}, "attempts": {"type": "integer"}}},
                "status": {"type": "string", "enum": ["created", "pending"]}}},
            "Threads": {"type": "object", "properties": {
                "threads": {"type": "array", "items": {"$ref": "#/components/schemas/Thread"}},
                "next_cursor": {"type": ["string", "null"],
                                "description": "Pass as `cursor` for the next page; null "
                                               "at the end."}}},
            "RunStarted": {"type": "object", "required": ["workflow_id", "run_id", "message_id"],
                           "properties": {
                               "workflow_id": {"type": "string"}, "run_id": {"type": "string"},
                               "message_id": {"type": "string"},
                               "status": {"type": "string", "enum": ["accepted", "pending"]},
                               "replayed": {"type": "boolean"}}},
            "Messages": {"type": "object", "properties": {
                "thread_id": {"type": "string"},
                "branch": {"type": "integer", "description": "The branch read: the seq of "
                           "its newest message."},
                "messages": {"type": "array", "items": {"type": "object", "properties": {
                    "seq": {"type": "integer", "description": "0-based position in the thread."},
                    "message_id": {"type": "string"},
                    "role": {"type": "string", "enum": ["user", "assistant"]},
                    "text": {"type": "string"}, "run_id": {"type": "string"},
                    "created_at_ms": {"type": "integer"}, "steps": {"type": "array"},
                    "citations": {"type": "array"},
                    "run_status": {"type": ["string", "null"], "description": (
                        "User messages only: the status of the run the message started.")},
                    "parent_seq": {"type": "integer", "description": (
                        "The message before it on its branch (-1: none, a first "
                        "message); seq - 1 unless it starts a branch.")}}}},
                "next_cursor": {"type": ["string", "null"], "description": (
                    "Continues in the direction read: pass it as `after` (or as `before` "
                    "if this page was read with `before`); null at the end.")}}},
            "Regenerated": {"type": "object", "properties": {
                "workflow_id": {"type": "string"},
                "run_id": {"type": "string", "description": "The new answer's run, named by "
                           "the Idempotency-Key: the same key is the same run."},
                "message_id": {"type": "string", "description": "The question answered again."},
                "branch": {"type": "integer", "description": "The question's seq: the new "
                           "answer follows it, on a new branch that becomes current."},
                "status": {"type": "string", "enum": ["accepted", "pending"]},
                "replayed": {"type": "boolean"}}},
            "Edited": {"type": "object", "properties": {
                "workflow_id": {"type": "string"}, "run_id": {"type": "string"},
                "message_id": {"type": "string", "description": "The new user message."},
                "edited_message_id": {"type": "string"},
                "status": {"type": "string", "enum": ["accepted", "pending"]},
                "replayed": {"type": "boolean"}}},
            "Branches": {"type": "object", "properties": {
                "thread_id": {"type": "string"},
                "current": {"type": "integer", "description": "The current branch."},
                "branches": {"type": "array", "items": {"type": "object", "properties": {
                    "branch": {"type": "integer", "description": (
                        "The seq of its newest message: its name in `?branch=` and in "
                        "POST .../branches/current.")},
                    "current": {"type": "boolean"},
                    "fork_seq": {"type": "integer", "description": (
                        "The newest message it shares with the current branch (-1: none, "
                        "an edit of the first message).")},
                    "first_seq": {"type": ["integer", "null"], "description": (
                        "Its first message after the fork (null: the current branch, or a "
                        "tip on the current branch's path).")},
                    "message_count": {"type": "integer"},
                    "message_id": {"type": ["string", "null"]},
                    "role": {"type": ["string", "null"]}}}}}},
            "Resume": {"type": "object", "properties": {
                "run_id": {"type": "string"},
                "status": {"type": "string", "enum": ["resumed", "pending"]}}},
            "Cancel": {"type": "object", "properties": {
                "run_id": {"type": "string"},
                "status": {"type": "string", "enum": ["cancelled", "pending"]}}},
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/": {"get": {"security": [], "summary": "The APIs this gateway serves and their "
                                                 "prefixes",
                      "responses": {"200": {"description": "the index"}}}},
        "/favicon.ico": {"get": {"security": [], "summary": "Nothing (a browser asks on "
                                                            "every page load)",
                                 "responses": {"204": {"description": "no icon"}}}},
        "/livez": {"get": {"security": [], "summary": "Liveness: the process serves (even "
                                                      "while its read model loads); with the "
                                                      "partitions it owns (`owned`: a list, "
                                                      "or `all` outside a group) of how many "
                                                      "(`partitions`)",
                           "responses": {"200": {"description": "alive"}}}},
        "/healthz": {"get": {"security": [], "summary": "Health detail: the broker answers, the "
                                                        "processor and worker groups have "
                                                        "members, the read model is loaded",
                             "responses": {"200": {"description": "healthy"},
                                           "503": {"description": "something is missing"}}}},
        "/readyz": {"get": {"security": [], "summary": (
            "Readiness, what a load balancer should probe: 200 only when the processor "
            "owns every partition, has restored it and decides (a probe command per "
            "partition is processed); a success is reused for 5 s"),
            "responses": {"200": {"description": "decisions are being made"},
                          "503": {"description": "not yet (partitions_waiting)"}}}},
        "/metrics": {"get": {"security": [], "summary": (
            "Prometheus metrics of this gateway process, in the text exposition format "
            "(THREADLINE_GATEWAY_METRICS=0 removes it; docs/operations.md)"),
            "responses": {"200": {"description": "metrics",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/openapi.json": {"get": {"security": [], "summary": "This document",
                                  "responses": {"200": {"description": "OpenAPI 3.1"}}}},
        "/demo": {"get": {"security": [], "summary": "A browser page watching a thread's stream "
                                                     "(/demo#key=KEY&thread=ID)",
                          "responses": {"200": {"description": "HTML"}}}},
        "/v1/browser_tokens": {"post": {
            "summary": "A short-lived token for a browser, instead of the API key (with "
                       "thread_id: for that thread only); a browser token cannot make one",
            "requestBody": {"content": {"application/json": {"schema": {
                "type": "object", "properties": {
                    "thread_id": {"type": "string"},
                    "ttl_s": {"type": "integer", "minimum": 1, "maximum": 3600,
                              "default": 900}}}}}},
            "responses": {"201": {"description": "The token: token, token_type, expires_in, "
                                                 "expires_at, tenant, thread_id"},
                          "401": _UNAUTHORIZED, "403": _problem("Called with a browser token"),
                          "404": _NOT_FOUND, "422": _problem("Bad ttl_s or thread_id")}}},
        "/v1/threads": {"get": {
            "summary": "The tenant's threads, most recently updated first",
            "parameters": [
                {"name": "limit", "in": "query", "schema": {
                    "type": "integer", "minimum": 1, "maximum": 200, "default": 50}},
                {"name": "cursor", "in": "query", "schema": {"type": "string"},
                 "description": "The previous page's next_cursor."}],
            "responses": {"200": _json("A page of threads", "Threads"),
                          "400": _problem("Bad limit or cursor"), "401": _UNAUTHORIZED}},
            "post": {
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
                          "404": _NOT_FOUND}},
            "delete": {
            "summary": "Delete a thread: its state and every message (a run in flight is "
                       "cancelled first); then 404 everywhere, and its open streams end",
            "parameters": [_THREAD_ID],
            "responses": {"204": {"description": "Deleted"},
                          "202": {"description": "Queued, not decided yet (status pending)",
                                  "content": {"application/json": {"schema": {
                                      "type": "object"}}}},
                          "401": _UNAUTHORIZED, "404": _NOT_FOUND}}},
        "/v1/threads/{thread_id}/messages": {"get": {
            "summary": "Stored messages of the current branch (or `branch`), user and "
                       "assistant, oldest first, a page at a time (without limit: the "
                       "first 100, with next_cursor)",
            "parameters": [_THREAD_ID, _LIMIT_MESSAGES, *_CURSORS, _BRANCH],
            "responses": {"200": _json("A page of messages", "Messages"),
                          "400": _problem("Bad limit or cursor"), "401": _UNAUTHORIZED,
                          "404": _problem("No such thread, or no such branch")}}},
        "/v1/threads/{thread_id}/messages/{message_id}/regenerate": {"post": {
            "summary": "Answer a user message again (or, named by an answer, its question) "
                       "on a new branch from it, which becomes current (docs/branches.md)",
            "parameters": [_THREAD_ID, _MESSAGE_ID, _KEY],
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"multitask_strategy": _STRATEGY}}}}},
            "responses": {"202": _json("Accepted, pending, or the run of a repeated "
                                       "Idempotency-Key", "Regenerated"),
                          "401": _UNAUTHORIZED,
                          "404": _problem("No such thread or message"),
                          "409": _problem("A run is active (reject), the message's own run "
                                          "is active, posts are queued, or the thread has "
                                          "its most branches (branch-conflict)"),
                          "422": _problem("Bad body, the key used with another message, or "
                                          "no answerable user message"),
                          "429": _POSTS}}},
        "/v1/threads/{thread_id}/messages/{message_id}/edit": {"post": {
            "summary": "Post new text in place of a user message: a new message on a new "
                       "branch from the edited one's parent, which becomes current and runs",
            "parameters": [_THREAD_ID, _MESSAGE_ID, _KEY],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["input_text"], "properties": {
                    "input_text": {"type": "string", "minLength": 1},
                    "message_id": {"type": "string", "description": (
                        "The new message's id (default: from the Idempotency-Key, else "
                        "random); it never runs twice.")},
                    "multitask_strategy": _STRATEGY}}}}},
            "responses": {"202": _json("Accepted, pending, or the original run of a "
                                       "repeated Idempotency-Key", "Edited"),
                          "401": _UNAUTHORIZED,
                          "404": _problem("No such thread or message"),
                          "409": _problem("As for a regenerate (branch-conflict)"),
                          "422": _problem("Empty or too long input, bad body, or the "
                                          "Idempotency-Key used with another body"),
                          "429": _POSTS}}},
        "/v1/threads/{thread_id}/branches": {"get": {
            "summary": "The thread's branches, the current one first, with where each "
                       "forks from it",
            "parameters": [_THREAD_ID],
            "responses": {"200": _json("The branches", "Branches"), "401": _UNAUTHORIZED,
                          "404": _NOT_FOUND}}},
        "/v1/threads/{thread_id}/branches/current": {"post": {
            "summary": "Make a branch current (`{branch}`: its seq); posts go on from it",
            "parameters": [_THREAD_ID],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["branch"],
                "properties": {"branch": {"type": "integer"}}}}}},
            "responses": {"200": {"description": "switched, or current already"},
                          "202": {"description": "pending"}, "401": _UNAUTHORIZED,
                          "404": _problem("No such thread or branch"),
                          "409": _problem("A run is active: switch once it has ended"),
                          "422": _problem("Bad body")}}},
        "/v1/threads/{thread_id}/copy": {"post": {
            "summary": "Copy the thread: a new thread holding its history, every branch at "
                       "the same seqs, the same branch current (docs/branches.md)",
            "parameters": [_THREAD_ID],
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"title": {"type": "string", "maxLength": 500,
                    "description": "The copy's title; by default the source's."}}}}}},
            "responses": {"201": {"description": "copied: the new thread, with copied_from"},
                          "202": {"description": "pending: the copy will be complete"},
                          "401": _UNAUTHORIZED, "404": _problem("No such thread"),
                          "409": _problem("The thread is itself still being copied into"),
                          "422": _problem("Bad body, or the thread is too large to copy")}}},
        "/v1/threads/{thread_id}/user_message": {"post": {
            "summary": "Post a user message: starts a run",
            "parameters": [_THREAD_ID, {"name": "Idempotency-Key", "in": "header",
                                        "schema": {"type": "string", "maxLength": 255}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["input_text"],
                "properties": {"input_text": {"type": "string", "minLength": 1},
                               "multitask_strategy": {
                                   "type": "string", "default": "reject",
                                   "enum": ["reject", "enqueue", "interrupt", "rollback"],
                                   "description": "What to do if a run is active: 409, "
                                   "queue behind it, cancel it and run, or cancel it and "
                                   "remove its messages (docs/multitask.md)"}}}}}},
            "responses": {"202": _json("Accepted, queued (enqueue), pending, or the original "
                                       "run of a repeated Idempotency-Key", "RunStarted"),
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
        "/v1/threads/{thread_id}/runs/{run_id}/resume": {"post": {
            "summary": "Resume an interrupted run: the agent's interrupt() returns `value`",
            "parameters": [_THREAD_ID, _RUN_ID],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["value"], "properties": {"value": {}}}}}},
            "responses": {"202": _json("Resumed or pending", "Resume"), "401": _UNAUTHORIZED,
                          "404": _NOT_FOUND, "409": _problem("The run is not interrupted"),
                          "413": _problem("The value is too large"),
                          "422": _problem("No value, or not a JSON body"), "429": _POSTS}}},
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
        # The Vercel AI SDK's UI message stream protocol (docs/clients.md).
        "/v1/ai/chat": {"post": {
            "summary": "useChat's HTTP transport: post the newest user message of chat `id` "
                       "(a new id creates the chat's thread) and stream its run as the UI "
                       "message stream (x-vercel-ai-ui-message-stream: v1)",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["id", "messages"], "properties": {
                    "id": {"type": "string"}, "messages": {"type": "array"},
                    "trigger": {"type": "string", "enum": ["submit-message"]},
                    "messageId": {"type": ["string", "null"]}}}}}},
            "responses": {"200": {"description": "text/event-stream of UI message chunks, "
                                                 "then data: [DONE]"},
                          "401": _UNAUTHORIZED, "409": _problem("A run is active"),
                          "422": _problem("Bad body, empty input, a reused message id with "
                                          "other text, or a trigger other than "
                                          "submit-message"),
                          "429": _POSTS}}},
        "/v1/ai/chat/{chat_id}/stream": {"get": {
            "summary": "The transport's reconnect: the chat's active run from its start",
            "parameters": [_CHAT_ID],
            "responses": {"200": {"description": "text/event-stream of UI message chunks"},
                          "204": {"description": "No run is active"},
                          "401": _UNAUTHORIZED, "429": _STREAMS}}},
        "/v1/ai/chat/{chat_id}/cancel": {"post": {
            "summary": "Cancel the chat's active run (call it, then the SDK's stop())",
            "parameters": [_CHAT_ID],
            "responses": {"202": _json("Cancelled or pending", "Cancel"), "401": _UNAUTHORIZED,
                          "404": _NOT_FOUND, "409": _problem("No run is active")}}},
        "/v1/ai/chat/{chat_id}/messages": {"get": {
            "summary": "The chat's newest stored messages as UIMessages (useChat's initial "
                       "messages)",
            "parameters": [_CHAT_ID, {"name": "limit", "in": "query", "schema": {
                "type": "integer", "minimum": 1, "maximum": 1000, "default": 100}}],
            "responses": {"200": {"description": "{thread_id, messages}"},
                          "401": _UNAUTHORIZED}}},
        "/console": {"get": {"security": [], "summary": "The web console (the key is asked "
                                                        "for in the page)",
                             "responses": {"200": {"description": "HTML"}}}},
        "/console/console.js": {"get": {"security": [], "summary": "The console's script",
                                        "responses": {"200": {"description": "JavaScript"}}}},
        "/console/console.css": {"get": {"security": [], "summary": "The console's styles",
                                         "responses": {"200": {"description": "CSS"}}}},
        "/console/vendor/marked.umd.js": {"get": {
            "security": [], "summary": "marked 18.2.1 (MIT), the console's Markdown parser",
            "responses": {"200": {"description": "JavaScript"}}}},
        "/console/vendor/purify.min.js": {"get": {
            "security": [], "summary": "DOMPurify 3.5.0 (Apache-2.0), the console's HTML "
                                       "sanitizer",
            "responses": {"200": {"description": "JavaScript"}}}},
        "/v1/console/threads/{thread_id}/run": {"get": {
            "summary": "The active run's attempt, status and liveness (last_heartbeat_ms)",
            "parameters": [_THREAD_ID],
            "responses": {"200": {"description": "{thread_id, active_run, last_run}"},
                          "401": _UNAUTHORIZED, "404": _NOT_FOUND}}},
        "/v1/console/threads/{thread_id}/runs": {"get": {
            "summary": "The thread's newest runs that ended, oldest first, each with its "
                       "timeline events (lifecycle, message start and end, with the "
                       "records' times) replayed from the stream topic",
            "parameters": [_THREAD_ID, {"name": "limit", "in": "query", "schema": {
                "type": "integer", "minimum": 1, "maximum": 50, "default": 20}}],
            "responses": {"200": {"description": "{thread_id, runs: [{run_id, status, "
                                                 "accepted_at_ms, retained, events}], more}"},
                          "400": _problem("A bad limit"),
                          "401": _UNAUTHORIZED, "404": _NOT_FOUND}}},
        **_LG_PATHS,
    },
}


async def openapi(request: web.Request) -> web.Response:
    """GET /openapi.json: the gateway's OpenAPI description."""
    return web.json_response(SPEC)
