"""Resume checks for the gateway tests, over the testing kit's SSE client."""

from __future__ import annotations

import aiohttp

from streams.testing.sse import SseEvent as Ev
from streams.testing.sse import read_sse


def _never(_: list[Ev]) -> bool:
    return False


async def check_every_resume(session: aiohttp.ClientSession, base: str, reference: list[Ev],
                             thread_id: str, run_id: str,
                             auth: dict[str, str] | None = None) -> None:
    """Resuming after each event of `reference`, on both endpoints, yields the rest of it."""
    auth = auth or {"Authorization": "Bearer key-a"}
    run_url = f"{base}/v1/runs/{run_id}/events"
    whole_run = await read_sse(session, run_url, headers=auth, until=_never)
    assert whole_run == reference, base
    for k, event in enumerate(reference):
        assert event.id
        if k < len(reference) - 1:
            rest = await read_sse(session, f"{base}/v1/threads/{thread_id}/stream",
                                  headers={**auth, "Last-Event-ID": event.id})
            assert reference[:k + 1] + rest == reference, (base, k)
        rest = await read_sse(session, f"{run_url}?last_event_id={event.id}", headers=auth,
                              until=_never)
        assert rest == reference[k + 1:], (base, k)
