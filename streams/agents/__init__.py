"""Agents: what a worker runs for one attempt of a run.

An agent is an object with `run(history, message)`, an async generator of
`AgentOutput`: text deltas (`TextChunk`), tool steps (`AgentStep`) and
citations (`AgentCitations`), in the order they happen. An agent that cannot
answer raises `AgentError`, whose `retryable` flag tells the processor whether
another attempt may help. Agents know nothing of Kafka; the worker turns their
output into stream records and reports.

`create_agent(settings)` picks one by `settings.agent`: "builtin" (deterministic,
no network) or "openai" (any OpenAI-compatible chat-completions endpoint).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from streams.config import Settings
from streams.domain import Citation, Step
from streams.records import HistoryMessage

__all__ = [
    "Agent",
    "AgentCitations",
    "AgentError",
    "AgentOutput",
    "AgentStep",
    "TextChunk",
    "create_agent",
]


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


def create_agent(settings: Settings) -> Agent:
    """The agent `settings.agent` names, configured from `settings.extra`."""
    if settings.agent == "builtin":
        from streams.agents.builtin import BuiltinAgent

        return BuiltinAgent.from_settings(settings)
    if settings.agent == "openai":
        from streams.agents.openai import OpenAIAgent

        return OpenAIAgent.from_settings(settings)
    raise ValueError(f"unknown agent {settings.agent!r}; expected 'builtin' or 'openai'")
