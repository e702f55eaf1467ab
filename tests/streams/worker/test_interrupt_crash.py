"""Human in the loop end to end: an agent asks (`interrupt`), the run waits
`interrupted` (on the stream and in GET of the thread), every role is killed with
SIGKILL while it waits and started again, the run is resumed over HTTP with a value,
and the stored answer uses the value. Processor, worker and gateway are processes on
the session broker."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from streams.testing.process import RoleProcess
from streams.testing.stack import fresh_env, start_roles, wait_healthy_async

AUTH = {"Authorization": "Bearer key-h"}
HEARTBEAT_TIMEOUT_S = 4.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _json(session: aiohttp.ClientSession, method: str, url: str,
                body: Any = None) -> tuple[int, Any]:
    async with session.request(method, url, json=body, headers=AUTH) as response:
        return response.status, await response.json(content_type=None)


async def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {timeout}s: {what}")


async def _sse_events_until(session: aiohttp.ClientSession, url: str, name: str) -> list[str]:
    """Event names of the thread's stream until `name` (the gateway replays the active run)."""
    names: list[str] = []
    async with asyncio.timeout(60), session.get(url, headers=AUTH) as response:
        assert response.status == 200
        async for raw in response.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event:"):
                names.append(line[6:].strip())
                if names[-1] == name:
                    return names
    return names


@pytest.mark.kafka
@pytest.mark.chaos
async def test_an_interrupted_run_survives_kill_9_of_every_role_and_resumes_with_the_value(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """interrupt -> kill -9 processor, worker and gateway -> restart -> resume -> the answer
    uses the value; the tool called before the interrupt ran once."""
    log = tmp_path / "tools.log"
    port = _free_port()
    env = fresh_env(kafka_bootstrap, tmp_path, THREADLINE_API_KEYS="key-h=tenant-h",
                    THREADLINE_HTTP_PORT=str(port), THREADLINE_AGENT_TOKENS_PER_S="100",
                    THREADLINE_AGENT_WORDS="5", THREADLINE_AGENT_TOOLS="1",
                    THREADLINE_AGENT_TOOL_LOG=str(log),
                    THREADLINE_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S),
                    THREADLINE_HEARTBEAT_INTERVAL_S="0.5", THREADLINE_DECISION_TIMEOUT_S="10")
    base = f"http://127.0.0.1:{port}"
    roles: list[RoleProcess] = await asyncio.to_thread(
        start_roles, env, tmp_path, ("processor", "worker", "gateway"))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            await wait_healthy_async(session, f"{base}/healthz")
            status, created = await _json(session, "POST", f"{base}/v1/threads", {"title": "hitl"})
            assert status == 201, created
            thread = created["thread_id"]
            status, posted = await _json(session, "POST", f"{base}/v1/threads/{thread}/user_message",
                                         {"input_text": "deploy it [approve]"})
            assert status == 202, posted
            run_id = posted["run_id"]

            async def interrupted() -> Any:
                code, body = await _json(session, "GET", f"{base}/v1/threads/{thread}")
                run = body.get("active_run") if code == 200 else None
                return run if run and run["status"] == "interrupted" else None

            run = await _until(interrupted, 60, "the run interrupted")
            interrupted_at = time.monotonic()
            assert run["run_id"] == run_id and "May I answer" in run["interrupt"]["question"]
            names = await _sse_events_until(session, f"{base}/v1/threads/{thread}/stream",
                                            "interrupt")
            assert names[-1] == "interrupt" and "step" in names

            for role in roles:  # every role, while the run waits
                role.kill9()
            for role in roles:
                role.start()
            await wait_healthy_async(session, f"{base}/healthz")
            # Longer than a heartbeat timeout since the interrupt: waiting needs none.
            await _until(lambda: _true_after(interrupted_at + 2 * HEARTBEAT_TIMEOUT_S), 30,
                         "two heartbeat timeouts")
            assert (await _until(interrupted, 30, "still interrupted after the restart"))

            status, conflict = await _json(session, "POST",
                                           f"{base}/v1/threads/{thread}/user_message",
                                           {"input_text": "meanwhile"})
            assert status == 409, conflict  # an interrupted run is active
            status, refused = await _json(session, "POST",
                                          f"{base}/v1/threads/{thread}/runs/{run_id}/resume", {})
            assert status == 422, refused
            status, resumed = await _json(session, "POST",
                                          f"{base}/v1/threads/{thread}/runs/{run_id}/resume",
                                          {"value": "ship-42"})
            assert status == 202 and resumed["status"] in ("resumed", "pending"), resumed

            async def answered() -> Any:
                code, page = await _json(session, "GET", f"{base}/v1/threads/{thread}/messages")
                answers = [m for m in page.get("messages", []) if m["role"] == "assistant"] \
                    if code == 200 else []
                return answers

            answers = await _until(answered, 90, "the answer stored")
            assert len(answers) == 1
            assert answers[0]["text"].endswith("Approved: ship-42."), answers[0]
            assert [s["kind"] for s in answers[0]["steps"]] == ["tool_call", "tool_result"]
            status, again = await _json(session, "POST",
                                        f"{base}/v1/threads/{thread}/runs/{run_id}/resume",
                                        {"value": "twice"})
            assert status == 409, again
        done = [line.split()[1] for line in log.read_text().splitlines()
                if line.startswith("done")]
        assert done == [f"{run_id}:1"]  # the lookup before the interrupt ran once
    finally:
        for role in reversed(roles):
            role.stop()


async def _true_after(moment: float) -> bool:
    return time.monotonic() >= moment
