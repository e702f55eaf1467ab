"""The LangGraph Platform runs API (an Agent Protocol subset), under `/langgraph`.

What `langgraph-sdk` (and agent-chat-ui, assistant-ui, CopilotKit through it) calls:
threads (create, get, search, state, history with checkpoints), the one assistant, and
runs (create, stream, wait, list, get, join, join_stream, cancel), runs from a
checkpoint (a regenerate or an edit: a new branch). `create_app()` is the API as an
aiohttp sub-app, which the gateway mounts at `PREFIX`: the gateway's middlewares (API
keys, with the SDK's `x-api-key`; readiness; limits; problem+json) apply to it.

Modules: `threads` (threads, the assistant, finding a thread by its client's id),
`checkpoints` (state, history and runs from a checkpoint over the thread's tree),
`runs` (runs), `stream` (run streams from `gateway.live.run_stream`: resumable, every SSE
`id:` a Kafka position), `events` (the pure event mapping), `views` (the JSON
objects, thread ids per tenant). Responses carry `Location` (the join
stream, relative to the API root, as LangGraph servers send it) and
`Content-Location` (the run), which the SDK follows to reconnect. docs/clients.md
has the mapping tables.

`multitask_strategy` is served: `reject` (the default), `enqueue`, `interrupt`,
`rollback` (docs/multitask.md). Human in the loop: `__interrupt__` in the stream (which
then ends), threads and runs `interrupted`, `command.resume` continues the same run
(`runs`). Not served (a 422 names them): `command.goto`/`update`,
`interrupt_before`/`after`, subgraph checkpoints, cancel `action=rollback`.
threads.copy makes a new thread with every branch (docs/branches.md, "Copies")."""

from __future__ import annotations

from aiohttp import web

from gateway.adapters.langgraph.checkpoints import (
    get_history,
    get_state,
    get_state_at,
    post_state_at,
)
from gateway.adapters.langgraph.runs import (
    cancel_run,
    create_run,
    get_run,
    join_run,
    join_stream,
    list_runs,
    stream_run,
    wait_run,
)
from gateway.adapters.langgraph.threads import (
    copy_thread,
    create_thread,
    get_assistant,
    get_thread,
    search_assistants,
    search_threads,
)
from gateway.adapters.langgraph.views import internal_thread_id
from gateway.http.plumbing import READY_WAIT

__all__ = ["PREFIX", "READY_WAIT_S", "create_app", "internal_thread_id"]

PREFIX = "/langgraph"
# How long a request waits for the gateway's load before its 503 (the SDK gives up
# on an error where a moment's wait would have served it).
READY_WAIT_S = 30.0


def create_app() -> web.Application:
    """The LangGraph API as a sub-app, its routes relative to PREFIX."""
    app = web.Application()
    app[READY_WAIT] = READY_WAIT_S
    r = app.router
    r.add_post("/threads", create_thread)
    r.add_post("/threads/search", search_threads)
    r.add_get("/threads/{thread_id}", get_thread)
    r.add_get("/threads/{thread_id}/state", get_state)
    r.add_get("/threads/{thread_id}/state/{checkpoint_id}", get_state_at)
    r.add_post("/threads/{thread_id}/state/checkpoint", post_state_at)
    r.add_post("/threads/{thread_id}/history", get_history)
    r.add_post("/threads/{thread_id}/copy", copy_thread)
    r.add_post("/assistants/search", search_assistants)
    r.add_get("/assistants/{assistant_id}", get_assistant)
    r.add_post("/threads/{thread_id}/runs", create_run)
    r.add_post("/threads/{thread_id}/runs/stream", stream_run)
    r.add_post("/threads/{thread_id}/runs/wait", wait_run)
    r.add_get("/threads/{thread_id}/runs", list_runs)
    r.add_get("/threads/{thread_id}/runs/{run_id}", get_run)
    r.add_get("/threads/{thread_id}/runs/{run_id}/join", join_run)
    r.add_get("/threads/{thread_id}/runs/{run_id}/stream", join_stream)
    r.add_post("/threads/{thread_id}/runs/{run_id}/cancel", cancel_run)
    return app
