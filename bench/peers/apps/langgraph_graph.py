"""The workload as a LangGraph graph for `langgraph dev` (PEERS_TOOL_LOG: the side-effect log).

Input `{"run", "steps", "delay"}`: the node `tool` runs `steps` times in a row
(each a super-step, checkpointed), then `answer` answers.
"""

import os
import time
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    """The graph's state."""

    run: str
    steps: int
    delay: float
    step: int
    facts: list[str]
    answer: str


def side_effect(what: str, key: str) -> None:
    """Append one line to the side-effect log in one write."""
    fd = os.open(os.environ["PEERS_TOOL_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key} {os.getpid()} {time.time() * 1000:.3f}\n".encode())
    finally:
        os.close(fd)


def tool(state: State) -> State:
    """One tool call: `begin`, the work, `done`."""
    # A sync node: the dev server runs it in a thread (it refuses blocking calls,
    # such as the log's write, in an async one).
    step = state.get("step", 0) + 1
    key = f"{state['run']}:{step}"
    side_effect("begin", key)
    if state["delay"] > 0:
        time.sleep(state["delay"])
    side_effect("done", key)
    return {"step": step, "facts": [*state.get("facts", []), f"fact {key}"]}


def route(state: State) -> str:
    """The next tool call, or the answer."""
    return "tool" if state["step"] < state["steps"] else "answer"


def answer(state: State) -> State:
    """The run's answer."""
    return {"answer": "answer: " + "; ".join(state["facts"])}


builder = StateGraph(State)
builder.add_node("tool", tool)
builder.add_node("answer", answer)
builder.add_edge(START, "tool")
builder.add_conditional_edges("tool", route, ["tool", "answer"])
builder.add_edge("answer", END)
graph = builder.compile()
