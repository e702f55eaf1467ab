"""Agents: what a worker runs for one attempt of a run.

An agent is an object with `run(history, message)`, an async generator of
`AgentOutput`: text deltas (`TextChunk`), tool steps (`AgentStep`) and
citations (`AgentCitations`), in the order they happen. An agent that cannot
answer raises `AgentError`, whose `retryable` flag tells the processor whether
another attempt may help. Agents know nothing of Kafka; the worker turns their
output into stream records and reports.

`create_agent(settings)` picks one by `settings.worker.agent` (THREADLINE_AGENT):

- `builtin` (deterministic, no network; a deterministic tool mode) or `openai`
  (any OpenAI-compatible chat-completions endpoint, with tools);
- `package.module:factory`: an agent of your own, `factory(settings) -> Agent`;
- any other name: the entry point of that name in the group `threadline.agents`,
  loaded and called the same way.

Tools, the step journal and the run's caps are in `streams.agents.tools` and
`streams.agents.runtime`; docs/agents.md describes the whole API with an example.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, Protocol, cast

from streams.config import Settings
from streams.core.domain import Citation, Step
from streams.core.records import HistoryMessage

__all__ = [
    "Agent",
    "AgentCitations",
    "AgentError",
    "AgentOutput",
    "AgentStep",
    "ENTRY_POINT_GROUP",
    "TextChunk",
    "create_agent",
    "load_factory",
]

ENTRY_POINT_GROUP = "threadline.agents"
_NAMED = {"builtin": "streams.agents.builtin:BuiltinAgent.from_settings",
          "openai": "streams.agents.openai:OpenAIAgent.from_settings"}


@dataclass(frozen=True, slots=True)
class TextChunk:
    """A piece of the answer's text, as the model produced it."""

    text: str


@dataclass(frozen=True, slots=True)
class AgentStep:
    """A tool call or tool result the agent made."""

    step: Step


@dataclass(frozen=True, slots=True)
class AgentCitations:
    """Sources the answer cites; several of these are concatenated."""

    citations: tuple[Citation, ...]


AgentOutput = TextChunk | AgentStep | AgentCitations


class AgentError(Exception):
    """The agent could not answer; `retryable` says whether a new attempt may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class Agent(Protocol):
    """What a worker runs: streams an answer to a message given the thread's history."""
    def run(self, history: Sequence[HistoryMessage], message: str) -> AsyncIterator[AgentOutput]:
        """Answer `message` given the thread's earlier messages (oldest first)."""
        ...

    async def aclose(self) -> None:
        """Release what the agent holds (HTTP sessions); called once, at worker exit."""
        ...


AgentFactory = Callable[[Settings], Agent]


def load_factory(name: str) -> AgentFactory:
    """The factory `name` stands for: a named agent, `package.module:attr[.attr]`, or
    an entry point of the group `threadline.agents`."""
    target = _NAMED.get(name, name)
    if ":" not in target:
        found = entry_points(group=ENTRY_POINT_GROUP).select(name=name)
        if not found:
            known = sorted({*_NAMED, *(e.name for e in entry_points(group=ENTRY_POINT_GROUP))})
            raise ValueError(f"unknown agent {name!r}: expected one of {known} (entry points of "
                             f"{ENTRY_POINT_GROUP!r} included) or package.module:factory")
        loaded: Any = next(iter(found)).load()
    else:
        module_name, _, attrs = target.partition(":")
        try:
            loaded = import_module(module_name)
            for attr in attrs.split("."):
                loaded = getattr(loaded, attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"agent {name!r} cannot be loaded: {exc}") from exc
    if not callable(loaded):
        raise ValueError(f"agent {name!r} is not callable: {loaded!r}")
    return cast(AgentFactory, loaded)


def create_agent(settings: Settings) -> Agent:
    """The agent `settings.worker.agent` names (see the module's docstring), from `settings`."""
    agent = load_factory(settings.worker.agent)(settings)
    if not callable(getattr(agent, "run", None)):
        raise ValueError(f"agent {settings.worker.agent!r} made {agent!r}, which has no run()")
    return agent
