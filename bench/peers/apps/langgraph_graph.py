"""The workload as a LangGraph graph for `langgraph dev` (PEERS_TOOL_LOG: the side-effect log).

Input `{"run", "steps", "delay"}`: the node `tool` runs `steps` times in a row
(each a super-step, checkpointed), then `answer` answers.
"""

import asyncio
import os
import time
from typing import TypedDict

from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    run: str
    steps: int
    delay: float
    step: int
    facts: list
    answer: str


def side_effect(what: str, key: str) -> None:
    fd = os.open(os.environ["PEERS_TOOL_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key} {os.getpid()} {time.time() * 1000:.3f}\n".encode())
    finally:
        os.close(fd)


async def tool(state: State) -> State:
    step = state.get("step", 0) + 1
    key = f"{state['run']}:{step}"
    side_effect("begin", key)
    if state["delay"] > 0:
        await asyncio.sleep(state["delay"])
    side_effect("done", key)
    return {"step": step, "facts": [*state.get("facts", []), f"fact {key}"]}


def route(state: State) -> str:
    return "tool" if state["step"] < state["steps"] else "answer"


def answer(state: State) -> State:
    return {"answer": "answer: " + "; ".join(state["facts"])}


builder = StateGraph(State)
builder.add_node("tool", tool)
builder.add_node("answer", answer)
builder.add_edge(START, "tool")
builder.add_conditional_edges("tool", route, ["tool", "answer"])
builder.add_edge("answer", END)
graph = builder.compile()
