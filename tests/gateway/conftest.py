"""One Threadline stack for the gateway tests: processor and worker processes on the
session broker, and the gateway in-process on 127.0.0.1 (aiohttp test server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from gateway.app import Options, create_app
from gateway.keys import READ_MODEL
from gateway.model.read_model import ReadModel
from streams.config import Settings
from streams.testing.process import RoleProcess
from streams.testing.stack import fresh_env, start_roles, unique_prefix, wait_healthy_async

KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
AUTH_A = {"Authorization": "Bearer key-a"}
AUTH_B = {"Authorization": "Bearer key-b"}


def gateway_env(bootstrap: str, folder: Path) -> dict[str, str]:
    """Environment of a gateway test stack: a fresh prefix, the tenants of KEYS and quick agent runs."""
    return fresh_env(bootstrap, folder, prefix=unique_prefix("g"),
                     THREADLINE_API_KEYS=",".join(f"{k}={t}" for k, t in KEYS.items()),
                     THREADLINE_AGENT_TOKENS_PER_S="150", THREADLINE_AGENT_SLOW_TOKENS_PER_S="25",
                     THREADLINE_AGENT_WORDS="12", THREADLINE_DECISION_TIMEOUT_S="10")


@dataclass
class Stack:
    """The gateway test stack: processor and worker processes, the in-process gateway and a client."""
    env: dict[str, str]
    settings: Settings
    folder: Path
    server: TestServer
    session: aiohttp.ClientSession
    processor: RoleProcess
    worker: RoleProcess

    def url(self, path: str) -> str:
        """The gateway's URL of `path`."""
        return str(self.server.make_url(path))

    async def create_thread(self, auth: dict[str, str] = AUTH_A, title: str = "t") -> str:
        """Create a thread as `auth`'s tenant and return its id (fails unless 201)."""
        async with self.session.post(self.url("/v1/threads"), json={"title": title},
                                     headers=auth) as response:
            body = await response.json()
            assert response.status == 201, body
            return str(body["thread_id"])

    async def call(self, path: str, body: dict[str, Any] | None = None, auth: dict[str, str] = AUTH_A,
                   key: str | None = None) -> tuple[int, dict[str, Any]]:
        """POST `body` ({} if none) to `path` as `auth`'s tenant, with an Idempotency-Key
        if given; its status and JSON body."""
        headers = {**auth, **({"Idempotency-Key": key} if key is not None else {})}
        async with self.session.post(self.url(path), json=body or {}, headers=headers) as response:
            return response.status, await response.json(content_type=None)

    async def post(self, thread_id: str, text: str, auth: dict[str, str] = AUTH_A,
                   key: str | None = None) -> tuple[int, dict[str, Any]]:
        """Post a user message to a thread (with an Idempotency-Key if given); its status and JSON body."""
        return await self.call(f"/v1/threads/{thread_id}/user_message", {"input_text": text}, auth, key)

    async def get(self, path: str, auth: dict[str, str] = AUTH_A) -> tuple[int, Any]:
        """GET `path` as `auth`'s tenant; its status and JSON body."""
        async with self.session.get(self.url(path), headers=auth) as response:
            return response.status, await response.json(content_type=None)

    def logs(self) -> str:
        """The tail of the processor's and the worker's logs, for a failure message."""
        return f"--- processor\n{self.processor.tail()}\n--- worker\n{self.worker.tail()}"


@contextlib.asynccontextmanager
async def running_stack(env: dict[str, str], folder: Path) -> AsyncIterator[Stack]:
    """Processor and worker processes with `env`, and the gateway in-process, healthy."""
    settings = Settings.from_env(env)
    processor, worker = await asyncio.to_thread(start_roles, env, folder, ("processor", "worker"))
    server = TestServer(create_app(settings, Options(keepalive_s=1.0)), host="127.0.0.1",
                        handler_cancellation=True)  # as run_gateway serves it
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    try:
        await server.start_server()
        await wait_healthy_async(session, str(server.make_url("/healthz")))
        yield Stack(env, settings, folder, server, session, processor, worker)
    finally:
        await session.close()
        await server.close()
        worker.stop()
        processor.stop()


@contextlib.asynccontextmanager
async def in_process_gateway(settings: Settings, options: Options | None = None) -> \
        AsyncIterator[tuple[str, ReadModel]]:
    """Another gateway of `settings`' deployment, in this process (a read store of its
    own): its base URL and read model, once its start returned (the model loaded)."""
    app = create_app(settings, options or Options(keepalive_s=1))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")), app[READ_MODEL]
    finally:
        await server.close()


@pytest_asyncio.fixture(scope="session")
async def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> \
        AsyncIterator[Stack]:
    """One running gateway test stack for the whole session, on fresh topics."""
    folder = tmp_path_factory.mktemp("gateway")
    async with running_stack(gateway_env(kafka_bootstrap, folder), folder) as running:
        yield running
