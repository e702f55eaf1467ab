"""The LangGraph Platform runs API (an Agent Protocol subset), under `/langgraph`.

What `langgraph-sdk` (and agent-chat-ui, assistant-ui, CopilotKit through it) calls:
threads (create, get, search, state, history), the one assistant, and runs (create,
stream, wait, list, get, join, join_stream, cancel). `setup(app)` adds the routes.
The SDK's `x-api-key` is one of the deployment's API keys (`gateway.auth`).

Modules: `langgraph_threads` (threads, the assistant, shared request helpers),
`langgraph_runs` (runs), `langgraph_stream` (run streams: resumable, every SSE `id:`
a Kafka position), `langgraph_events` (the pure event mapping), `langgraph_views`
(the JSON objects, thread ids per tenant). Responses carry `Location` (the join
stream, relative to the API root, as LangGraph servers send it) and
`Content-Location` (the run), which the SDK follows to reconnect. docs/clients.md
has the mapping tables.

`multitask_strategy` is served: `reject` (the default), `enqueue`, `interrupt`,
`rollback` (docs/multitask.md). Human in the loop: `__interrupt__` in the stream (which
then ends), threads and runs `interrupted`, `command.resume` continues the same run
(`langgraph_runs`). Not served (a 422 names them): `command.goto`/`update`,
`interrupt_before`/`after`, checkpoints, cancel `action=rollback`.
"""

from __future__ import annotations

from aiohttp import web

from gateway.langgraph_runs import (
    cancel_run,
    create_run,
    get_run,
    join_run,
    join_stream,
    list_runs,
    stream_run,
    wait_run,
)
from gateway.langgraph_threads import (
    create_thread,
    get_assistant,
    get_history,
    get_state,
    get_thread,
    search_assistants,
    search_threads,
)

__all__ = ["PREFIX", "setup"]

PREFIX = "/langgraph"


def setup(app: web.Application) -> None:
    """Add the LangGraph routes under PREFIX."""
    r = app.router
    r.add_post(f"{PREFIX}/threads", create_thread)
    r.add_post(f"{PREFIX}/threads/search", search_threads)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}", get_thread)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/state", get_state)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/history", get_history)
    r.add_post(f"{PREFIX}/assistants/search", search_assistants)
    r.add_get(f"{PREFIX}/assistants/{{assistant_id}}", get_assistant)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs", create_run)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs/stream", stream_run)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs/wait", wait_run)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs", list_runs)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}", get_run)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}/join", join_run)
    r.add_get(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}/stream", join_stream)
    r.add_post(f"{PREFIX}/threads/{{thread_id}}/runs/{{run_id}}/cancel", cancel_run)
