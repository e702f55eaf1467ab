"""The LangGraph dev server (`langgraph-cli[inmem]`, `langgraph dev`) running the
workload's graph. A run is `POST /threads/{id}/runs/wait`; after a kill the driver
reads the thread's state and, with no run active, resumes it from its checkpoint
(input null) as a LangGraph client would."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
from typing_extensions import override

from bench.peers import install
from bench.peers.procs import Proc, free_port, wait_port
from bench.peers.system import System, answered_ok, retry_pause
from bench.peers.workload import SHARED_LOG_ENV

# `langgraph dev` runs 1 job at a time by default (langgraph_api.cli); as Threadline's
# worker concurrency, raised so that 200 runs at once are not run one by one.
JOBS = 256
GRAPH = Path(__file__).parent / "apps" / "langgraph_graph.py"


class LangGraph(System):
    """`langgraph dev`: one process, the in-memory runtime."""

    name = "LangGraph dev"
    roles = ("server",)
    # The in-memory runtime writes its state to disk every 10 s
    # (langgraph_runtime_inmem._persistence): the threads of a recovery test are given
    # that long to be on disk, so the test shows what a kill does to the runs.
    settle_s = 11.0

    @override
    async def start(self, session: aiohttp.ClientSession) -> None:
        self.python = install.venv_python("langgraph")
        project = self.folder / "project"
        project.mkdir(parents=True, exist_ok=True)
        shutil.copy(GRAPH, project / "graph.py")
        (project / "langgraph.json").write_text(json.dumps(
            {"dependencies": ["."], "graphs": {"agent": "./graph.py:graph"}}))
        self.port = free_port()
        cli = self.python.parent / "langgraph"
        self.procs["server"] = Proc("langgraph-dev", [
            str(cli), "dev", "--port", str(self.port), "--host", "127.0.0.1", "--no-browser",
            "--no-reload", "--n-jobs-per-worker", str(JOBS), "--config", str(project / "langgraph.json")],
            {SHARED_LOG_ENV: str(self.tool_log), "LANGSMITH_TRACING": "false",
             "LANGCHAIN_TRACING_V2": "false", "LANGGRAPH_CLI_NO_ANALYTICS": "1"},
            self.folder / "langgraph-dev.log", cwd=project).start()
        await asyncio.to_thread(wait_port, self.port, 120, [self.procs["server"]])
        deadline = time.monotonic() + 60
        if not await answered_ok(session, "GET", f"{self.base}/ok", deadline, pause_s=0.3):
            raise RuntimeError(f"langgraph dev not ready:\n{self.procs['server'].tail()}")

    @property
    def base(self) -> str:
        """The server's URL."""
        return f"http://127.0.0.1:{self.port}"

    @override
    async def prepare(self, session: aiohttp.ClientSession, count: int) -> list[str]:
        gate = asyncio.Semaphore(16)

        async def one() -> str:
            async with gate, session.post(f"{self.base}/threads", json={}) as r:
                body: dict[str, Any] = await r.json()
                return str(body["thread_id"])

        return list(await asyncio.gather(*(one() for _ in range(count))))

    @override
    async def run(self, session: aiohttp.ClientSession, slot: str, key: str, delay_s: float,
                  deadline: float, ids: dict[str, str]) -> float | None:
        ids[key] = key
        payload: dict[str, Any] | None = {"run": key, "steps": 4, "delay": delay_s}
        while True:
            try:
                async with session.post(f"{self.base}/threads/{slot}/runs/wait", json={
                        "assistant_id": "agent", "input": payload}) as r:
                    body = await r.json(content_type=None)
                    if r.status == 200 and isinstance(body, dict) and body.get("answer"):
                        return time.time()
            except (aiohttp.ClientError, json.JSONDecodeError):
                pass
            if not await retry_pause(deadline, 0.3):
                return None
            resume = await self._resume_input(session, slot)
            if resume == "done":
                return time.time()
            if resume == "lost":
                return None
            if resume == "busy":
                continue
            payload = None if resume == "resume" else payload

    async def _resume_input(self, session: aiohttp.ClientSession, slot: str) -> str:
        """What posting again should do: "done", "busy" (a run is active: wait),
        "resume" (continue from the checkpoint), "again" (no checkpoint: the input) or
        "lost" (the thread itself is gone: the dev server had not saved it)."""
        try:
            async with session.get(f"{self.base}/threads/{slot}/state") as r:
                if r.status == 404:
                    return "lost"
                state = await r.json(content_type=None)
            if isinstance(state, dict) and (state.get("values") or {}).get("answer"):
                return "done"
            async with session.get(f"{self.base}/threads/{slot}/runs") as r:
                runs = await r.json(content_type=None)
            if isinstance(runs, list) and any(x.get("status") in ("pending", "running")
                                              for x in runs):
                await asyncio.sleep(0.3)
                return "busy"
            return "resume" if isinstance(state, dict) and state.get("next") else "again"
        except (aiohttp.ClientError, json.JSONDecodeError):
            return "busy"

    @override
    def version(self) -> str:
        out = subprocess.run([str(self.python), "-c", "import importlib.metadata as m; print(', '"
                              ".join(p + ' ' + m.version(p) for p in ('langgraph', 'langgraph-api',"
                              " 'langgraph-runtime-inmem', 'langgraph-cli')))"],
                             capture_output=True, text=True, check=False)
        return out.stdout.strip()

    @override
    def durability(self) -> str:
        return ("in-memory runtime: runs, threads and checkpoints in the server's memory, "
                "pickled to .langgraph_api/ from time to time (no fsync); no replica")

    @override
    def settings(self) -> str:
        return (f"shipped defaults, except --n-jobs-per-worker {JOBS} (default 1 run at a time); "
                "`langgraph dev --no-browser --no-reload`; in the recovery test the threads "
                f"are created {self.settle_s:.0f} s before the runs (its flush period is 10 s)")
