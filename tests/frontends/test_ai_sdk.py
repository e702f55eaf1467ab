"""The official AI SDK (`ai`, pinned in tests/node) in Node against the real stack:
its Chat logic over its own HTTP chat transport and strict stream parser streams
answers, stops a run (the cancel endpoint, then `stop()`), and resumes a run after
the gateway process is killed mid-answer, ending with the stored message's text.

The script is tests/node/ai_chat.mjs; it prints `MARK` lines where the driver acts
(kill -9 the gateway, restart it) and waits for `GO` lines, then one `RESULT`."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from streams.testing.process import wait_for
from tests.frontends.stack import KEY, ProcessStack
from tests.npm_kit import NODE_DIR, node_modules, require_tool

pytestmark = pytest.mark.kafka

LINE_TIMEOUT_S = 120.0


class NodeScript:
    """tests/node/ai_chat.mjs running one scenario, read line by line."""

    def __init__(self, stack: ProcessStack, scenario: str) -> None:
        node_modules()
        self.proc = subprocess.Popen(
            [require_tool("node"), "ai_chat.mjs", scenario], cwd=NODE_DIR, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "THREADLINE_BASE_URL": stack.base, "THREADLINE_KEY": KEY})
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until(self, word: str) -> tuple[str, Any]:
        """The next `MARK name {json}` or `RESULT {json}` line (anything else is log)."""
        while True:
            try:
                line = self.lines.get(timeout=LINE_TIMEOUT_S)
            except queue.Empty:
                raise AssertionError(f"no {word} line:\n{''.join(self.output)}") from None
            if line is None:
                raise AssertionError(f"node ended before {word}:\n{''.join(self.output)}")
            if line.startswith(word + " "):
                rest = line[len(word) + 1:]
                name, _, data = rest.partition(" ") if word == "MARK" else ("", "", rest)
                return name, json.loads(data)

    def go(self, name: str) -> None:
        """Let the script past its `go(name)`."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"GO {name}\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        """The script's RESULT, once it exits; a failure inside it fails the test."""
        _, result = self.until("RESULT")
        self.proc.wait(timeout=30)
        assert "failure" not in result, result["failure"]
        return dict(result)


def _answers(stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in stored if m["role"] == "assistant"]


def _attempt_of(tool_call_id: str) -> int:
    """The attempt that made a tool call (`<message>:<attempt>:tool:<k>`)."""
    return int(tool_call_id.split(":")[-3])


def _assert_retries_explained(processes: ProcessStack, run_id: str, asking: int,
                              answering: int) -> None:
    """The attempt that asked for approval is the one that answered, unless its
    heartbeats timed out on a loaded machine: then each attempt in between failed for
    that reason and no other (never deposed, never a failure of the resume itself)."""
    assert processes.retries(run_id) == [(a, "heartbeat_timeout")
                                         for a in range(asking, answering)], \
        (asking, answering, processes.logs())


def _text(ui_message: dict[str, Any]) -> str:
    return "".join(p["text"] for p in ui_message["parts"] if p["type"] == "text")


def test_the_sdk_streams_two_answers_equal_to_the_stored_messages(
        processes: ProcessStack) -> None:
    """Two `sendMessage`s on a new chat id: the thread is created, both answers stream
    through the SDK's validation, each with a step, a tool part and a source."""
    result = NodeScript(processes, "stream").result()
    assert result["errors"] == []
    answers = _answers(result["stored"])
    assert len(answers) == 2
    for streamed, stored in zip(result["results"], answers, strict=True):
        assert streamed["status"] == "ready"
        assert streamed["text"] == _text(stored)
        assert streamed["id"] == stored["id"]  # the `start` chunk names the stored message
        assert {"step-start", "text", "dynamic-tool", "source-url", "data-run"} <= \
            set(streamed["parts"])
        assert streamed["metadata"]["status"] == "completed"
    assert {"run_accepted", "attempt_dispatched", "run_completed"} <= set(result["data"])


def test_the_sdk_regenerates_and_edits_on_branches(processes: ProcessStack) -> None:
    """`regenerate()` twice and an edit (`sendMessage({text, messageId})`): each streams
    a new answer that the chat shows in place of the old one, equal to the stored
    current branch; the thread keeps every branch (issue #30)."""
    result = NodeScript(processes, "branches").result()
    assert result["errors"] == []
    steps = result["steps"]
    assert [s["status"] for s in steps] == ["ready"] * 4
    assert all(s["roles"] == ["user", "assistant"] for s in steps), steps
    answer_ids = [s["ids"][1] for s in steps]
    assert len(set(answer_ids)) == 4, answer_ids  # each a new answer
    assert steps[3]["userText"] == "what is a tree"
    stored = result["stored"]
    assert [m["id"] for m in stored][1:] == [answer_ids[3]]
    assert _text(stored[0]) == "what is a tree" and _text(stored[1]) == steps[3]["text"]
    status, listed = processes.call("GET", f"/v1/threads/{result['threadId']}/branches")
    assert status == 200 and len(listed["branches"]) == 4, listed


def test_cancel_then_stop_really_stops_the_run(processes: ProcessStack) -> None:
    """The cancel endpoint ends the run (not only the fetch); nothing is left to resume."""
    result = NodeScript(processes, "stop").result()
    assert result["cancelStatus"] == 202, result["cancel"]
    assert result["status"] == "ready"
    assert result["resumeStatus"] == 204
    thread_id = result["metadata"]["thread_id"]
    status, listing = processes.call("GET", f"/v1/threads/{thread_id}/messages")
    assert status == 200
    users = [m for m in listing["messages"] if m["role"] == "user"]
    assert [u["run_status"] for u in users] == ["cancelled"]
    assert _answers(listing["messages"]) == []


def test_resume_after_the_gateway_is_killed_ends_with_the_stored_text(
        processes: ProcessStack) -> None:
    """kill -9 of the gateway mid-answer: the fetch fails; `resumeStream()` replays the
    run from the durable log and the answer ends equal to the stored message."""
    script = NodeScript(processes, "resume")
    _, streaming = script.until("MARK")
    assert streaming["chars"] > 0
    processes.gateway.kill9()
    script.go("killed")
    processes.restart(processes.gateway)  # already dead: starts it and waits for health
    script.go("restarted")
    result = script.result()
    assert result["statusAfterKill"] == "error", "the kill should have broken the fetch"
    assert result["status"] == "ready", result["errors"]
    answers = _answers(result["stored"])
    assert len(answers) == 1, processes.logs()
    assert result["text"] == _text(answers[0])
    assert result["id"] == answers[0]["id"]
    assert result["text"].startswith(result["seenBefore"])


def test_after_a_worker_kill_the_answering_attempt_equals_the_stored_message(
        processes: ProcessStack) -> None:
    """kill -9 of the worker mid-answer: the stream goes on with a new execution in a new
    step (of the same attempt: the restarted worker takes its dispatch back at once);
    the text of the newest execution of the attempt `finish` names equals the stored
    message."""
    script = NodeScript(processes, "worker")
    script.until("MARK")
    processes.restart(processes.worker)
    result = script.result()
    assert result["status"] == "ready", result["errors"]
    assert result["parts"].count("step-start") >= 2
    answers = _answers(result["stored"])
    assert len(answers) == 1
    assert len(set(result["executions"])) >= 2 and result["attempts"][-1] == \
        result["metadata"]["attempt"]
    assert result["text"] == _text(answers[0]) and result["id"] == answers[0]["id"]


def _chat(stack: ProcessStack, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        stack.base + "/v1/ai/chat", method="POST", data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def _chunks(raw: bytes) -> list[Any]:
    return [line[len("data: "):] if line == "data: [DONE]" else json.loads(line[len("data: "):])
            for line in raw.decode().split("\n") if line.startswith("data: ")]


def _user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


def test_an_interrupt_is_resumed_over_the_native_endpoint_and_the_stream_goes_on(
        processes: ProcessStack) -> None:
    """The run asks after a journaled turn: a `data-run` part with the question while the
    stream stays open; the native resume answers it and the same stream ends with the
    answer; the newest execution's text is the stored answer, which used the value."""
    result = NodeScript(processes, "interrupt").result()
    assert result["errors"] == [] and result["status"] == "ready"
    assert "deploy it" in result["question"]["question"]
    assert result["statusWhileWaiting"] == "streaming" and result["resumeStatus"] == 202
    [answer] = _answers(result["stored"])
    assert _text(answer).endswith("Approved: yes.")
    assert result["text"] == _text(answer)
    assert len(set(result["executions"])) == 2  # the resumed execution replayed the turn
    assert result["allText"] != result["text"]
    assert result["metadata"]["status"] == "completed"


@pytest.mark.parametrize(("scenario", "value"), [
    ("approve", {"approved": True, "reason": None}),
    ("deny", {"approved": False, "reason": "not today"})])
def test_a_tools_interrupt_is_approved_with_the_sdks_own_api(
        processes: ProcessStack, scenario: str, value: dict[str, Any]) -> None:
    """`useChat`'s flow: the first response ends at the `confirm` tool's approval request
    (status `ready`, finish `tool-calls`); `addToolApprovalResponse` and
    `sendAutomaticallyWhen` post the answer; its response is the rest of the run, into
    the same message: the tool part ends `output-available` with the value, and the
    newest execution's text is the stored answer, which used the value. The identical
    post again streams the same chunks, and nothing runs twice."""
    result = NodeScript(processes, scenario).result()
    assert result["errors"] == [] and result["status"] == "ready"
    assert result["asked"]["state"] == "approval-requested" and result["statusAsked"] == "ready"
    assert result["asked"]["approval"]["descriptor"] == {
        "question": "May I deploy it?", "tool": "confirm"}
    assert result["finishes"] == ["tool-calls", "stop"]
    first, answer = result["posts"]
    assert first["status"] == answer["status"] == 200
    answered = answer["body"]["messages"][-1]
    assert answered["role"] == "assistant" and answered["id"] == result["id"]
    part = result["part"]  # the call of the attempt that answered
    assert part["state"] == "output-available", part
    assert part["output"]["content"]["answer"] == value
    attempt = result["metadata"]["attempt"]
    assert part["toolCallId"].startswith(f"{result['id']}:{attempt}:tool:")
    _assert_retries_explained(processes, result["metadata"]["run_id"],
                              _attempt_of(result["asked"]["toolCallId"]), attempt)
    if _attempt_of(result["asked"]["toolCallId"]) == attempt:
        assert part["toolCallId"] == result["asked"]["toolCallId"]
        assert part["approval"]["id"] == result["asked"]["approval"]["id"]
    assert result["messageIds"] == ["user", "assistant"]
    [stored] = _answers(result["stored"])
    suffix = f"Confirmed: {json.dumps(value, sort_keys=True)}."
    assert _text(stored).endswith(suffix) and result["text"] == _text(stored)
    assert stored["id"] == result["id"] and result["metadata"]["status"] == "completed"
    assert result["again"]["status"] == 200
    assert _chunks(result["again"]["text"].encode()) == _chunks(answer["text"].encode())
    assert [m["role"] for m in result["stored"]] == ["user", "assistant"]


def test_the_chat_endpoint_keeps_the_native_rules(processes: ProcessStack) -> None:
    """The header; a resend of the same message replays its run; another message while a
    run is active is 409, and so is a regenerate of the message whose run it is
    (docs/branches.md); an idle or unknown chat resumes with 204."""
    chat_id = f"rules-{uuid.uuid4().hex[:8]}"
    first = {"id": chat_id, "trigger": "submit-message", "messageId": None,
             "messages": [_user("m1", "first question")]}
    status, headers, raw = _chat(processes, first)
    assert status == 200 and headers["x-vercel-ai-ui-message-stream"] == "v1"
    chunks = _chunks(raw)
    assert chunks[0]["type"] == "start" and chunks[-1] == "[DONE]"
    status, _, again = _chat(processes, first)  # the same UI message id: the same run
    assert status == 200 and _chunks(again) == chunks
    slow = {**first, "messages": [_user("m1", "first question"), _user("m2", "[slow] long")]}
    with ThreadPoolExecutor(1) as pool:
        streaming = pool.submit(_chat, processes, slow)
        thread_id = chunks[0]["messageMetadata"]["thread_id"]
        wait_for(lambda: processes.call("GET", f"/v1/threads/{thread_id}")[1]["active_run"],
                 timeout=60, progress=processes.progress)
        status, _, problem = _chat(processes, {**first, "messages": [_user("m3", "more")]})
        assert status == 409, problem
        assert json.loads(problem)["active_run_id"]
        assert _chat(processes, {**slow, "trigger": "regenerate-message"})[0] == 409
        cancel = urllib.request.Request(
            f"{processes.base}/v1/ai/chat/{chat_id}/cancel", method="POST",
            headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(cancel, timeout=60) as response:
            assert response.status == 202
        status, _, raw = streaming.result(timeout=120)
    assert [c if c == "[DONE]" else c["type"] for c in _chunks(raw)][-2:] == ["abort", "[DONE]"]
    for chat in (chat_id, "never-used"):
        resume = urllib.request.Request(f"{processes.base}/v1/ai/chat/{chat}/stream",
                                        headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(resume, timeout=60) as response:
            assert response.status == 204


def _types(chunks: list[Any]) -> list[str]:
    return [c if c == "[DONE]" else c["type"] for c in chunks]


def _answer(chat_id: str, asked: dict[str, Any], call_id: str, approved: bool,
            approval_id: str | None = None) -> dict[str, Any]:
    """The body `sendAutomaticallyWhen` posts: the last message is the assistant's, its
    tool part answered (`approval-responded`)."""
    part = {"type": "dynamic-tool", "toolName": "confirm", "toolCallId": call_id,
            "state": "approval-responded", "input": {"action": "ship it"},
            "approval": {"id": approval_id or asked["approvalId"], "approved": approved}}
    return {"id": chat_id, "trigger": "submit-message", "messageId": "a",
            "messages": [{"id": "a", "role": "assistant",
                          "parts": [{"type": "step-start"}, part]}]}


def test_an_approval_answer_resumes_the_run_once_and_a_wrong_one_is_a_409(
        processes: ProcessStack) -> None:
    """Over HTTP: the response ends at the approval request, and the reconnect replays up
    to the same one (same ids). An approval of no run of the chat, or of an interrupt the
    run does not wait on, is 409 problem+json. Two identical answers at once both stream
    the rest of the run, the same chunks, from one resume; another answer to it while
    the run goes on is 409; after the end the answer replays the same chunks."""
    chat_id = f"approval-{uuid.uuid4().hex[:8]}"
    status, _, raw = _chat(processes, {"id": chat_id, "trigger": "submit-message",
                                       "messages": [_user("m1", "[slow] ship it [confirm]")]})
    assert status == 200
    chunks = _chunks(raw)
    assert _types(chunks)[-4:] == ["tool-approval-request", "data-run", "finish", "[DONE]"]
    asked = chunks[-4]
    thread_id = chunks[0]["messageMetadata"]["thread_id"]
    reconnect = urllib.request.Request(f"{processes.base}/v1/ai/chat/{chat_id}/stream",
                                       headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(reconnect, timeout=60) as response:
        assert _chunks(response.read()) == chunks
    call_id = asked["toolCallId"]
    for wrong in (f"{uuid.uuid4()}:interrupt:1", asked["approvalId"][:-1] + "2"):
        status, headers, problem = _chat(processes, _answer(chat_id, asked, call_id, True, wrong))
        assert status == 409, problem
        assert headers["Content-Type"].startswith("application/problem+json")
        assert json.loads(problem)["type"].endswith("run-not-interrupted")
    yes = _answer(chat_id, asked, call_id, True)
    with ThreadPoolExecutor(2) as pool:
        both = [pool.submit(_chat, processes, yes) for _ in range(2)]

        def resumed() -> bool:
            run = processes.call("GET", f"/v1/threads/{thread_id}")[1]["active_run"]
            return run is not None and run["status"] != "interrupted"

        wait_for(resumed, timeout=60, progress=processes.progress)
        status, _, problem = _chat(processes, _answer(chat_id, asked, call_id, False))
        assert status == 409, problem  # the slow answer still streams: the run is active
        assert json.loads(problem)["answer"] == {"approved": True, "reason": None}
        streams = [future.result(timeout=120) for future in both]
    assert [s[0] for s in streams] == [200, 200]
    rest = _chunks(streams[0][2])
    assert _chunks(streams[1][2]) == rest
    assert rest[0] == chunks[0]  # `start`: the same message goes on
    assert _types(rest)[-2:] == ["finish", "[DONE]"]
    # Under load the resumed attempt can miss its heartbeats and be retried: the answer
    # is then the next attempt's, its calls named `<message>:<attempt>:tool:<k>`.
    attempt = rest[-2]["messageMetadata"]["attempt"]
    ours = f"{chunks[0]['messageId']}:{attempt}:tool:"
    confirms = {c["toolCallId"] for c in chunks + rest if c != "[DONE]"
                and c["type"] == "tool-input-available" and c["toolName"] == "confirm"
                and c["toolCallId"].startswith(ours)}
    outputs = [c for c in rest if c != "[DONE]" and c["type"] == "tool-output-available"
               and c["toolCallId"] in confirms]
    assert [o["output"]["content"]["answer"] for o in outputs] == \
        [{"approved": True, "reason": None}], (attempt, call_id, rest)
    _assert_retries_explained(processes, chunks[0]["messageMetadata"]["run_id"],
                              _attempt_of(call_id), attempt)
    assert attempt > _attempt_of(call_id) or confirms == {call_id}
    status, listing = processes.call("GET", f"/v1/threads/{thread_id}/messages")
    assert [m["role"] for m in listing["messages"]] == ["user", "assistant"]
    assert listing["messages"][1]["text"].endswith('Confirmed: {"approved": true, "reason": null}.')
    status, _, again = _chat(processes, yes)
    assert status == 200 and _chunks(again) == rest
