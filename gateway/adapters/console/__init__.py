"""`GET /console`: the web console, a page a person uses to look at threads and runs.

Plain HTML, CSS and JavaScript from `gateway/adapters/console/static/`, nothing from another
host and no build step: Markdown is rendered by `marked` and sanitized by `DOMPurify`,
both vendored unchanged in `static/vendor/` (versions, licenses and hashes in its
README). The page asks for an API key once and keeps it in `sessionStorage`; it calls
the same `/v1` API as any client (`Authorization: Bearer`, and `?access_token=` for
`EventSource`, which cannot set headers). Its endpoints of their own:

* `GET /v1/console/threads/{thread_id}/run`: the active run's liveness (heartbeats),
  which no SSE event carries;
* `GET /v1/console/threads/{thread_id}/runs`: the thread's runs that ended, each with
  its timeline events read from the stream topic (`timeline.py`), so a reloaded page
  shows every run with the events' own times.

Two sub-apps, as the paths have two roots: `page_app()` at `PAGE_PREFIX` (public,
`gateway.http.auth.PUBLIC_PREFIXES`: the files hold no data, the key stays in the
browser) and `api_app()` at `API_PREFIX`; the gateway's middlewares apply to both.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from gateway.adapters.console.timeline import MAX_ENTRIES_PER_RUN, timeline_entry
from gateway.http.auth import TENANT
from gateway.http.plumbing import END_SEQ, query_limit
from gateway.http.problems import Problem
from gateway.keys import READ_MODEL
from gateway.live.run_stream import STREAMS, Gone, KeepAlive
from gateway.model.read_model import ReadModel, RunView
from streams.core.domain import ThreadState

__all__ = ["API_PREFIX", "CONSOLE_PATHS", "MAX_RUNS", "PAGE_PREFIX", "RUNS_PAGE", "api_app",
           "console_file", "page_app", "run_history", "run_liveness"]

PAGE_PREFIX = "/console"
API_PREFIX = "/v1/console"

STATIC = Path(__file__).parent / "static"
_FILES = {
    "/console": ("index.html", "text/html"),
    "/console/console.js": ("console.js", "text/javascript"),
    "/console/console.css": ("console.css", "text/css"),
    "/console/vendor/marked.umd.js": ("vendor/marked.umd.js", "text/javascript"),
    "/console/vendor/purify.min.js": ("vendor/purify.min.js", "text/javascript"),
}
CONSOLE_PATHS = frozenset(_FILES)  # public: the page holds no data, the key stays in the browser
RUNS_PAGE, MAX_RUNS = 20, 50  # GET .../runs: default and largest `limit`
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                                       "frame-ancestors 'none'"}


async def console_file(request: web.Request) -> web.Response:
    """One of the console's files."""
    name, content_type = _FILES[request.path]
    return web.Response(body=(STATIC / name).read_bytes(), content_type=content_type,
                        charset="utf-8", headers=_HEADERS)


async def run_liveness(request: web.Request) -> web.Response:
    """GET /v1/console/threads/{thread_id}/run: the active run's attempt, status and
    liveness times (`last_heartbeat_ms`), and the last run's outcome."""
    state = await request.config_dict[READ_MODEL].thread(request[TENANT],
                                                 request.match_info["thread_id"])
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    run, last = state.active_run, state.last_run
    return web.json_response({
        "thread_id": state.thread_id,
        "active_run": None if run is None else {
            "run_id": run.run_id, "attempt": run.attempt, "status": run.status.value,
            "attempt_started_ms": run.attempt_started_ms,
            "last_heartbeat_ms": run.last_heartbeat_ms, "retry_due_ms": run.retry_due_ms},
        "last_run": None if last is None else {
            "run_id": last.run_id, "status": last.status.value, "attempts": last.attempts},
    }, headers={"Cache-Control": "no-store"})


async def run_history(request: web.Request) -> web.Response:
    """GET /v1/console/threads/{thread_id}/runs?limit=: the thread's newest `limit` runs
    that ended, oldest first, each with its timeline events (`timeline.py`) replayed
    from the stream topic, or `retained: false` once retention removed them. The
    active run is not here: the thread's stream carries it from its start."""
    limit = query_limit(request, RUNS_PAGE, MAX_RUNS)
    read_model = request.config_dict[READ_MODEL]
    tenant = request[TENANT]
    state = await read_model.thread(tenant, request.match_info["thread_id"])
    if state is None:
        raise Problem(404, "not-found", "no such thread")
    run_ids, more = _newest_runs(read_model, state, limit)
    runs = []
    for run_id in run_ids:
        run = await read_model.run(tenant, run_id)
        if run is None or run.status is None or not run.terminal:
            continue  # active or queued: the thread's stream has it
        events, retained = await _timeline(request, run)
        runs.append({"run_id": run_id, "status": run.status.value,
                     "accepted_at_ms": run.accepted_at_ms or None, "retained": retained,
                     "events": events})
    return web.json_response({"thread_id": state.thread_id, "runs": runs, "more": more},
                             headers={"Cache-Control": "no-store"})


def _newest_runs(read_model: ReadModel, state: ThreadState, limit: int) -> tuple[list[str], bool]:
    """The runs of the thread's newest `limit` user messages, oldest first (the active
    run's aside), and whether older ones exist."""
    active = state.active_run.run_id if state.active_run is not None else None
    found: list[str] = []
    before = END_SEQ
    while True:  # pages backwards: a user message, then usually its answer
        page = read_model.messages(state.thread_id, before=before, limit=2 * limit)
        for record in reversed(page.records):
            m = record.message
            if m.role == "user" and m.run_id and m.run_id != active and m.run_id not in found:
                if len(found) == limit:
                    return found[::-1], True
                found.append(m.run_id)
        if not page.more or not page.records:
            return found[::-1], False
        before = page.records[0].seq


async def _timeline(request: web.Request, run: RunView) -> tuple[list[dict[str, object]], bool]:
    """The ended run's timeline entries from its events, and whether the topic still
    had them."""
    entries: list[dict[str, object]] = []
    async with request.config_dict[STREAMS].open(request[TENANT], run.state, run) as stream:
        async for item in stream:
            if isinstance(item, Gone):
                return [], False
            if isinstance(item, KeepAlive):  # an ended run: nothing more is coming
                break
            for event in item:
                entry = timeline_entry(event.name, event.data)
                if entry is not None and len(entries) < MAX_ENTRIES_PER_RUN:
                    entries.append(entry)
    return entries, True


def page_app() -> web.Application:
    """The page and its files, relative to PAGE_PREFIX."""
    app = web.Application()
    for path in _FILES:
        app.router.add_get(path.removeprefix(PAGE_PREFIX), console_file)
    return app


def api_app() -> web.Application:
    """The console's endpoints, relative to API_PREFIX."""
    app = web.Application()
    app.router.add_get("/threads/{thread_id}/run", run_liveness)
    app.router.add_get("/threads/{thread_id}/runs", run_history)
    return app
