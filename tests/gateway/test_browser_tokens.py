"""Browser tokens (gateway/http/browser_tokens.py): a tenant's backend trades its API
key for a short-lived token a browser presents instead. The pure part signs and
refuses; against the real stack, a tenant-wide token works as the key would, a
thread-scoped one only on that thread (its routes, its runs' events, the LangGraph
API's view of it), an expired or out-of-scope one is refused, and no token mints
another."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.http.browser_tokens import MAX_TTL_S, BadBrowserToken, BrowserGrant, BrowserTokens
from streams.testing.sse import read_sse
from tests.gateway.conftest import AUTH_A, AUTH_B, Stack

NOW = 1_800_000_000.0


def test_a_token_verifies_until_it_expires_and_only_as_issued() -> None:
    """Its grant until its expiry, not at it; a changed payload, another deployment's
    key or garbage is refused; the second of two keys still verifies (rotation)."""
    tokens = BrowserTokens([b"k1"])
    token, expires = tokens.issue("tenant-a", "thread-1", 60, NOW)
    assert expires == NOW + 60
    assert tokens.verify(token, NOW + 59) == BrowserGrant("tenant-a", "thread-1", int(NOW) + 60)
    with pytest.raises(BadBrowserToken, match="expired"):
        tokens.verify(token, NOW + 60)
    payload, mac = token.removeprefix("tlb1.").split(".")
    forged, _ = tokens.issue("tenant-b", None, 60, NOW)
    with pytest.raises(BadBrowserToken, match="signature"):
        tokens.verify(f"tlb1.{forged.split('.')[1]}.{mac}", NOW)
    with pytest.raises(BadBrowserToken, match="signature"):
        BrowserTokens([b"another"]).verify(token, NOW)
    assert BrowserTokens([b"new", b"k1"]).verify(token, NOW).tenant == "tenant-a"
    for garbage in ("", "tlb1.", "tlb1..", "key-a", "tlb1." + "x" * 2000):
        with pytest.raises(BadBrowserToken):
            tokens.verify(garbage, NOW)
    assert payload


@given(tenant=st.text(min_size=1, max_size=40), thread=st.none() | st.text(max_size=60),
       ttl=st.integers(1, MAX_TTL_S))
def test_every_grant_round_trips(tenant: str, thread: str | None, ttl: int) -> None:
    """Any tenant and thread id, any allowed lifetime: verified, it is what was issued."""
    tokens = BrowserTokens([b"k"])
    token, expires = tokens.issue(tenant, thread, ttl, NOW)
    assert tokens.verify(token, NOW) == BrowserGrant(tenant, thread, expires)


async def _issue(stack: Stack, body: dict[str, object], auth: dict[str, str] = AUTH_A) \
        -> tuple[int, dict[str, object]]:
    async with stack.session.post(stack.url("/v1/browser_tokens"), json=body,
                                  headers=auth) as response:
        return response.status, await response.json(content_type=None)


@pytest.mark.kafka
async def test_scoped_tokens_work_within_their_scope_only(stack: Stack) -> None:
    """A tenant token lists threads; a thread token reads and posts to its thread, reads
    its run's events and its LangGraph view, and is refused (403) anywhere else; an
    expired token and another tenant's thread are refused; no token mints another."""
    mine, other = await stack.create_thread(), await stack.create_thread()
    status, tenant_wide = await _issue(stack, {"ttl_s": 120})
    assert status == 201 and tenant_wide["tenant"] == "tenant-a", tenant_wide
    as_tenant = {"Authorization": f"Bearer {tenant_wide['token']}"}
    status, listing = await stack.get("/v1/threads", auth=as_tenant)
    assert status == 200 and {mine, other} <= {t["thread_id"] for t in listing["threads"]}

    status, scoped = await _issue(stack, {"thread_id": mine})
    assert status == 201 and scoped["thread_id"] == mine and scoped["expires_in"] == 900
    token = str(scoped["token"])
    as_thread = {"Authorization": f"Bearer {token}"}
    assert (await stack.get(f"/v1/threads/{mine}", auth=as_thread))[0] == 200
    assert (await stack.get(f"/langgraph/threads/{mine}", auth={"x-api-key": token}))[0] == 200
    for path in (f"/v1/threads/{other}", "/v1/threads", f"/v1/threads/{other}/messages"):
        status, problem = await stack.get(path, auth=as_thread)
        assert status == 403 and mine in problem["detail"], (path, problem)
    async with stack.session.post(stack.url(f"/v1/threads/{mine}/user_message"),
                                  json={"input_text": "from the browser"},
                                  headers=as_thread) as response:
        accepted = await response.json()
        assert response.status == 202, accepted
    events = await read_sse(stack.session, stack.url(
        f"/v1/runs/{accepted['run_id']}/events?access_token={token}"))
    assert events[-1].event == "done"

    assert (await _issue(stack, {}, auth=as_tenant))[0] == 403  # no token mints another
    assert (await _issue(stack, {"thread_id": mine}, auth=AUTH_B))[0] == 404
    assert (await _issue(stack, {"ttl_s": MAX_TTL_S + 1}))[0] == 422
    assert (await _issue(stack, {"thread_id": "\ud800"}))[0] == 422  # the fuzzer's 500
    expired, _ = BrowserTokens.from_settings(stack.settings).issue(
        "tenant-a", mine, 60, time.time() - 3600)
    status, problem = await stack.get(f"/v1/threads/{mine}",
                                      auth={"Authorization": f"Bearer {expired}"})
    assert status == 401 and "expired" in problem["detail"]
