"""The Vercel AI SDK's chat (`useChat` with `DefaultChatTransport`), under `/v1/ai`.

`create_app()` is the chat API as an aiohttp sub-app, which the gateway mounts at
`PREFIX`: the gateway's middlewares (API keys, readiness, limits, problem+json)
apply to it. Modules: `chat` (the endpoints; runs stream from `gateway.live.run_stream`),
`ui_stream` (pure: our events as the UI message stream's chunks, stored messages as
`UIMessage`s).
"""

from __future__ import annotations

from aiohttp import web

from gateway.adapters.ai_sdk import chat

__all__ = ["PREFIX", "create_app"]

PREFIX = "/v1/ai"


def create_app() -> web.Application:
    """The chat endpoints as a sub-app, their routes relative to PREFIX."""
    app = web.Application()
    app[chat.RESUMING] = {}
    app.router.add_post("/chat", chat.chat)
    app.router.add_get("/chat/{chat_id}/stream", chat.resume_chat)
    app.router.add_post("/chat/{chat_id}/cancel", chat.cancel_chat)
    app.router.add_get("/chat/{chat_id}/messages", chat.chat_messages)
    return app
