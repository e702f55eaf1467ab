"""The HTTP/SSE gateway: REST commands and reads, server-sent events, over Kafka.

Packages, one concern each:

    app       create_app (routes, middlewares, AppKeys, cleanup_ctx, the adapters
              as sub-apps), run_gateway; keys: the AppKeys and Options;
              kafka: aiokafka helpers (partitioning, group-less consumers, offsets)
    http/     the HTTP plumbing every API shares: auth, limits, problems (problem+json),
              plumbing (JSON bodies, integer parameters, END_SEQ, the readiness 503),
              ready (/readyz), health (/healthz), observability (/metrics, spans)
    model/    the read model (read_model, its RocksDB read_store) and the command bus
              (decisions: commands out, decisions back)
    live/     live streams: run_stream (the one in-process stream API: a thread's or a
              run's events from a position, replayed then live; every protocol serves
              from it), feed, replay, sse and tokens (pure), streaming (the native SSE
              endpoints and the SSE writer)
    api/      the native JSON API: rest, interrupts (resume), openapi
    adapters/ each a package mounted as an aiohttp sub-app (so auth, readiness, limits
              and problem+json apply to it), none importing another:
              ai_sdk (the Vercel AI SDK's chat under /v1/ai; ui_stream: pure, our
              events as its chunks), langgraph (the LangGraph Platform runs API under
              /langgraph; events: the pure mapping, views: its JSON objects), console
              (/console and gateway/adapters/console/static), demo (the /demo page)

Decisions. A write publishes a command (acks=all) carrying a fresh W3C traceparent;
the processor copies it onto the events it decides, and the events consumer resolves
the waiting request by it. No decision within `decision_timeout_ms`: 202 "pending".
With an `Idempotency-Key` the user message id is uuid5(tenant, thread, key), so a
resend is the processor's DUPLICATE (202, same ids) or PAYLOAD_MISMATCH (422).

Streams. Every stream-topic record goes through `sse.RunTracker`, in its thread's
order: as it is ingested if someone watches the thread, else when a client joins (the
feed keeps a thread nobody watches undecoded, but for its lifecycle records: see
`gateway.live.feed`). A run is known from its `run_accepted` record; a `MessageStart` of an attempt at least
as new as the current one makes its execution (the `part_id` prefix before ':')
current; other executions, attempts the processor moved past, repeated seqs and
anything after the terminal record are dropped. Event ids carry the offset of the
run's `run_accepted`, and a replay from Kafka starts reading there with a fresh
tracker, so it makes the very events (ids included) the feed made. A replay from a
position whose run start is unknown (ids never carry that, in practice) filters from
that position on and may let through output of an execution superseded earlier.

Replay positions: `Last-Event-ID`, or `last_event_id` / `last_entry_id` (reference
API) in the query, resume after that event. Each is a resume token (`gateway.live.tokens`):
HMAC-signed by a key every gateway of the deployment shares, bound to its thread, and
verified before anything is read; a replay that would read more than
`replay_max_records` offsets is answered as a position that is gone. `last_message_id` (reference API) alone
names a message the client holds; the stream then starts as a fresh one. A position
older than the partition's log start offset gets `message_not_streaming` (run and
message id; fetch `GET /v1/threads/{id}/messages`); a thread stream then starts as a
fresh one would (the active run from its start, else live), a run stream closes.

Delivery. A stream first catches up (Kafka replay, then the feed's window) while
its live events queue; then it is attached, and the feed writes each ingested
batch's events straight to the client's connection at the end of that batch (one
write per client per batch; no task wake-up per event). A client whose connection
holds more than 1 MiB unsent, or whose queue reaches `queue_limit` while it catches
up, is closed and resumes with Last-Event-ID. `/healthz` reports the feed's write
lag: a record's CreateTime until its events were written to every attached client
(records of threads someone watches).

Deletes. A ThreadDeleted decision (seen by every gateway's events consumer) or the
thread's tombstone in the changelog ends the thread's open streams and drops its
feed window; every route then answers 404 for it, so nothing of it is replayed.

Limits. The read store is on local disk: a gateway that was down longer than the
topics keep tombstones (`delete.retention.ms`, 24 h by default) starts it afresh,
as it must (a deleted thread could otherwise survive in it). Records
the stream topic compacted away (older than its 30 min lag, keyed by thread) leave
gaps a replay cannot see; only a log start past the position is detected.
"""
