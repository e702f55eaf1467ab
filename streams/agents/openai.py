"""An agent backed by any OpenAI-compatible chat-completions endpoint, streamed.

It POSTs `{base_url}/chat/completions` with `"stream": true` and reads the
server-sent events: each `data:` line holds a JSON chunk whose
`choices[0].delta.content` is the next piece of text; `data: [DONE]` ends the
answer. Failures map to `AgentError`: HTTP 408, 429 and 5xx, connection
errors, timeouts and a stream cut short are retryable; other 4xx (a bad key,
an unknown model, a request the server refuses) are not.

Settings (`settings.extra`):

    THREADLINE_AGENT_OPENAI_BASE_URL       default https://api.openai.com/v1
    THREADLINE_AGENT_OPENAI_API_KEY        sent as a bearer token if set
    THREADLINE_AGENT_OPENAI_MODEL          default gpt-4o-mini
    THREADLINE_AGENT_OPENAI_SYSTEM_PROMPT  optional first message
    THREADLINE_AGENT_OPENAI_TIMEOUT_S      connect and between-chunk timeout, default 60
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp

from streams.agents import AgentError, AgentOutput, TextChunk
from streams.config import Settings
from streams.records import HistoryMessage

__all__ = ["OpenAIAgent"]

_RETRYABLE_STATUS = frozenset({408, 429})
_ERROR_BODY_CHARS = 300


class OpenAIAgent:
    """An agent that streams answers from an OpenAI-compatible chat completions API."""
    def __init__(
        self,
        base_url: str = "https://api.openai.com/v1",
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        system_prompt: str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.model = model
        self.system_prompt = system_prompt
        self.timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None  # made on first use, in the loop

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIAgent:
        """The agent configured from THREADLINE_AGENT_OPENAI_* settings."""
        extra = settings.extra
        prefix = "THREADLINE_AGENT_OPENAI_"
        return cls(
            base_url=extra.get(f"{prefix}BASE_URL") or "https://api.openai.com/v1",
            api_key=extra.get(f"{prefix}API_KEY") or None,
            model=extra.get(f"{prefix}MODEL") or "gpt-4o-mini",
            system_prompt=extra.get(f"{prefix}SYSTEM_PROMPT") or None,
            timeout_s=float(extra.get(f"{prefix}TIMEOUT_S") or 60.0),
        )

    def request_body(self, history: Sequence[HistoryMessage], message: str) -> dict[str, Any]:
        """The streaming chat completions request: system prompt, history, then the message."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages += [{"role": m.role, "content": m.text} for m in history]
        messages.append({"role": "user", "content": message})
        return {"model": self.model, "messages": messages, "stream": True}

    async def run(
        self, history: Sequence[HistoryMessage], message: str
    ) -> AsyncIterator[AgentOutput]:
        """Stream the model's answer, chunk by chunk, from the API's server-sent events."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        headers = {"Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = self.request_body(history, message)
        try:
            async with self._session.post(self.url, json=body, headers=headers) as response:
                if response.status != 200:
                    detail = (await response.text(errors="replace"))[:_ERROR_BODY_CHARS]
                    retryable = response.status in _RETRYABLE_STATUS or response.status >= 500
                    raise AgentError(f"HTTP {response.status} from {self.url}: {detail}",
                                     retryable=retryable)
                finished = False
                async for data in _sse_data(response.content):
                    if data.strip() == "[DONE]":
                        return
                    text, done = _parse_chunk(data)
                    finished = finished or done
                    if text:
                        yield TextChunk(text)
                if not finished:
                    raise AgentError("the completion stream ended before [DONE]", retryable=True)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise AgentError(f"{type(exc).__name__} talking to {self.url}: {exc}",
                             retryable=True) from exc

    async def aclose(self) -> None:
        """Close the HTTP session, if one was opened."""
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The data of each server-sent event (its `data:` lines joined by newlines)."""
    lines: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
        # Comments (":") and the event, id and retry fields carry nothing we use.
    if lines:
        yield "\n".join(lines)


def _parse_chunk(data: str) -> tuple[str, bool]:
    """The text delta of one chunk, and whether the chunk names a finish reason."""
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise AgentError(f"malformed completion chunk: {data[:_ERROR_BODY_CHARS]!r}",
                         retryable=True) from exc
    if not isinstance(chunk, dict):
        raise AgentError(f"completion chunk is not an object: {data[:_ERROR_BODY_CHARS]!r}",
                         retryable=True)
    if "error" in chunk:
        raise AgentError(f"error in completion stream: {chunk['error']}", retryable=True)
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return "", False  # e.g. a usage-only chunk
    choice = choices[0]
    delta = choice.get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    return (content if isinstance(content, str) else ""), bool(choice.get("finish_reason"))
