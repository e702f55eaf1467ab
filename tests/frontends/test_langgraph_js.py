"""The LangGraph JavaScript SDK (`@langchain/langgraph-sdk` 2.0.0, pinned in tests/node)
in Node against the real stack, through its public `Client`: threads
(create/get/search/getState/getHistory), runs (create/stream/wait/join/joinStream/get/
list/cancel), assistants (search/get), multitask reject and enqueue, an interrupt with
`command: {resume}`, and a client pointed at the bare root. `joinStream` is called
with a string mode, an array of modes (the SDK sends it as JSON text in the query),
a mid-stream `lastEventId` and `-1` (what its React `useStream` sends with no id yet).

The script is tests/node/langgraph_js.mjs; it prints one `RESULT` line."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from tests.frontends.stack import KEY, ProcessStack
from tests.npm_kit import NODE_DIR, node_modules, require_tool

pytestmark = pytest.mark.kafka

SCRIPT_TIMEOUT_S = 600  # a backstop for a hung script; each call's own progress is what it waits for


@pytest.fixture(scope="module")
def result(processes: ProcessStack) -> dict[str, Any]:
    """What the script saw, method by method."""
    node_modules()
    done = subprocess.run([require_tool("node"), "langgraph_js.mjs"], cwd=NODE_DIR, text=True,
                          capture_output=True, timeout=SCRIPT_TIMEOUT_S, check=False,
                          env={**os.environ, "THREADLINE_BASE_URL": processes.base,
                               "THREADLINE_KEY": KEY})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"{done.stdout}\n{done.stderr}\n{processes.logs()}"
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def test_threads(result: dict[str, Any]) -> None:
    """create, get, search, getState and getHistory see one thread with its two messages."""
    thread_id = result["create"]["thread_id"]
    assert result["get"]["thread_id"] == thread_id
    assert result["search"]["found"]
    assert result["getState"] == {"messages": 2, "next": []}
    assert result["getHistory"]["states"] >= 1
    assert result["getHistory"]["first_messages"] >= 2


def test_stream_shows_what_is_stored(result: dict[str, Any]) -> None:
    """runs.stream in messages-tuple and values: metadata first, end last, and the
    screen built from the chunks is the stored answer."""
    stream = result["stream"]
    assert stream["first"] == "metadata" and stream["last"] == "end"
    assert {"messages", "values"} <= set(stream["events"])
    stored = stream["stored"]
    assert stream["screen"] == {stored["id"]: stored["content"]}


def test_runs_get_list_join_wait(result: dict[str, Any]) -> None:
    """get, join and wait end with the answers; list has every run of the thread."""
    assert result["get_run"]["status"] == "success"
    assert result["join"] == {"messages": 4, "status": "success"}
    assert result["wait"]["messages"] == 6
    assert result["stream"]["run_id"] in result["list"]["runs"]
    assert len(result["list"]["runs"]) == 3


def test_join_stream_in_every_form(result: dict[str, Any]) -> None:
    """A string mode, an array of modes, "-1" (the run's start) and a mid-stream id (the
    rest, exactly) each join the finished run; a live run joins too."""
    assert result["joinStream_string"]["events"] == ["metadata", "values", "end"]
    array = result["joinStream_array"]
    assert {"messages", "values"} <= set(array["events"])
    assert array["screen"] == result["stream"]["screen"]
    assert result["joinStream_minus_one"] == {"same": True, "parts": array["parts"]}
    assert result["joinStream_mid"]["id"]
    assert result["joinStream_mid"]["same"]
    live = result["joinStream_live"]
    assert "messages" in live["events"] and live["text"]


def test_cancel_assistants_and_multitask(result: dict[str, Any]) -> None:
    """cancel interrupts a streaming run; the one assistant is found and read; a reject
    double text is 409; an enqueued one runs after the first."""
    assert result["cancel"]["status"] == "interrupted"
    assert result["assistants"]["get"] in result["assistants"]["ids"]
    assert result["reject"]["status"] == 409
    assert result["enqueue"]["status"] == "success"


def test_interrupt_and_resume(result: dict[str, Any]) -> None:
    """The run asks, the stream ends at the interrupt; `command: {resume}` finishes it
    with the value."""
    interrupt = result["interrupt"]
    assert interrupt["asked"] == [{"question": "May I answer 'deploy it [approve]'?"}]
    assert interrupt["answer"].endswith("Approved: ship-js.")
    assert interrupt["thread_status"] == "idle"


def test_a_client_at_the_bare_root_is_told_where_the_api_is(result: dict[str, Any]) -> None:
    """The SDK pointed at the server's root gets a 404 that names /langgraph."""
    assert result["bare_root"]["status"] == 404
    assert "/langgraph" in result["bare_root"]["message"]
