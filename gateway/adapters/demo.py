"""`GET /demo`: a one-page watcher of a thread's SSE stream, for people and for
the browser test. The key and thread come in the URL fragment (never sent to the
server with the page); the page passes the key to `EventSource` as
`?access_token=` because browsers' EventSource cannot set headers, and
EventSource itself reconnects with `Last-Event-ID`; where it gives up (an answer that
is not a 200 stream, such as a proxy's 503), the page opens a new one from the last
id it saw (`last_event_id=`)."""

from __future__ import annotations

import json

from aiohttp import web

__all__ = ["demo_page"]

EVENTS = [
    "run_accepted", "attempt_dispatched", "message_start", "text_start", "text_delta", "text_end",
    "step", "citations", "message_end", "retry_scheduled", "run_completed", "run_failed",
    "run_cancelled", "done", "message_not_streaming",
]

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Threadline watcher</title>
<style>body{font:14px system-ui;margin:2em;max-width:60em}pre{white-space:pre-wrap}
#answer{border-left:3px solid #888;padding-left:1em}</style></head>
<body><h1>Threadline watcher</h1>
<p>Open as <code>/demo#key=API_KEY&amp;thread=THREAD_ID</code>.</p>
<p id="status">connecting…</p><div id="answer"></div><pre id="log"></pre>
<script>
const EVENTS = __EVENTS__;
const params = new URLSearchParams(location.hash.slice(1));
const url = `/v1/threads/${encodeURIComponent(params.get("thread"))}/stream?access_token=`
  + encodeURIComponent(params.get("key"));
const state = window.threadline = {events: [], opens: 0, errors: 0, reopens: 0};
const show = (text) => { answer.textContent = text; };
let text = "";
let lastId = "";
// EventSource reconnects by itself (with Last-Event-ID) after a dropped connection,
// but gives up for good on an answer that is not a 200 stream (a proxy's 503 while
// every gateway is busy or restarting): then open a new one from the last id seen.
const open = () => {
  const resume = lastId ? "&last_event_id=" + encodeURIComponent(lastId) : "";
  const source = new EventSource(url + resume);
  source.onopen = () => { state.opens++; status.textContent = "open (" + state.opens + ")"; };
  source.onerror = () => {
    state.errors++;
    status.textContent = "reconnecting…";
    if (source.readyState === EventSource.CLOSED) {
      state.reopens++;
      setTimeout(open, 1000);
    }
  };
  for (const name of EVENTS) {
    source.addEventListener(name, (e) => {
      if (e.lastEventId) lastId = e.lastEventId;
      state.events.push({type: name, id: e.lastEventId, data: e.data});
      if (name === "message_start") text = "";
      if (name === "text_delta") text += JSON.parse(e.data).delta;
      show(text);
      log.textContent += name + " " + e.lastEventId.slice(0, 12) + "\\n";
    });
  }
};
open();
</script></body></html>
""".replace("__EVENTS__", json.dumps(EVENTS))


async def demo_page(request: web.Request) -> web.Response:
    """The demo chat page, served uncached."""
    return web.Response(text=PAGE, content_type="text/html",
                        headers={"Cache-Control": "no-store"})
