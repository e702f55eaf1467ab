"""The workload as a Restate service (restate-sdk), served by hypercorn over h2c.

    python restate_app.py PORT      (PEERS_TOOL_LOG: the side-effect log)

`Agent/run {"run", "steps", "delay"}` makes `steps` tool calls in a row, each a
`ctx.run` (journaled by the Restate server), then answers.
"""

import asyncio
import os
import sys
import time
from typing import Any

import restate
from hypercorn.asyncio import serve
from hypercorn.config import Config

LOG = os.environ["PEERS_TOOL_LOG"]


def side_effect(what: str, key: str) -> None:
    """Append one line to the side-effect log in one write."""
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key} {os.getpid()} {time.time() * 1000:.3f}\n".encode())
    finally:
        os.close(fd)


agent = restate.Service("Agent")


async def tool(key: str, delay: float) -> str:
    """One tool call: `begin`, the work, `done`."""
    side_effect("begin", key)
    if delay > 0:
        await asyncio.sleep(delay)
    side_effect("done", key)
    return f"fact {key}"


async def model_turn(key: str) -> str:
    """A stand-in for a model's turn (no side effect): its output is journaled."""
    return f"looking up {key}"


@agent.handler()
async def run(ctx: restate.Context, req: dict[str, Any]) -> str:
    """One run: the tool calls in a row, each journaled, then the answer. With
    `turns`, each call follows a journaled model turn, as Threadline's builtin agent does."""
    facts = []
    for step in range(1, int(req["steps"]) + 1):
        key = f"{req['run']}:{step}"
        if req.get("turns"):
            await ctx.run_typed(f"turn-{step}", model_turn, restate.RunOptions(), key)
        facts.append(await ctx.run_typed(f"tool-{step}", tool, restate.RunOptions(),
                                         key, float(req["delay"])))
    return "answer: " + "; ".join(facts)


app = restate.app([agent])

if __name__ == "__main__":
    config = Config()
    config.bind = [f"127.0.0.1:{sys.argv[1]}"]
    config.h2_max_concurrent_streams = 2147483647
    config.keep_alive_max_requests = 2147483647
    config.keep_alive_timeout = 2147483647
    config.backlog = 1024
    print("serving", flush=True)
    asyncio.run(serve(app, config))
