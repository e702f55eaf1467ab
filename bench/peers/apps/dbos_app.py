"""The workload as a DBOS workflow on PostgreSQL, behind a small HTTP server.

    python dbos_app.py PORT      (PEERS_DB_URL: the system database; PEERS_TOOL_LOG)

`POST /run {"run", "steps", "delay"}` starts the workflow `agent` with the run as
its workflow id (so a repeated post joins the same workflow) and answers its
result. Each tool call is a `@DBOS.step`. A restarted process recovers the
workflows it left pending (DBOS.launch).
"""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dbos import DBOS, DBOSConfig, SetWorkflowID

LOG = os.environ["PEERS_TOOL_LOG"]


def side_effect(what: str, key: str) -> None:
    """Append one line to the side-effect log in one write."""
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{what} {key} {os.getpid()} {time.time() * 1000:.3f}\n".encode())
    finally:
        os.close(fd)


@DBOS.step()
def tool(key: str, delay: float) -> str:
    """One tool call: `begin`, the work, `done`."""
    side_effect("begin", key)
    if delay > 0:
        time.sleep(delay)
    side_effect("done", key)
    return f"fact {key}"


@DBOS.workflow()
def agent(run: str, steps: int, delay: float) -> str:
    """One run: the tool calls in a row, then the answer."""
    facts = [tool(f"{run}:{step}", delay) for step in range(1, steps + 1)]
    return "answer: " + "; ".join(facts)


class Handler(BaseHTTPRequestHandler):
    """`POST /run`: start (or join) the run's workflow and answer its result."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        """Start or join the workflow, wait for its result."""
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with SetWorkflowID(body["run"]):
            handle = DBOS.start_workflow(agent, body["run"], int(body["steps"]),
                                         float(body["delay"]))
        out = json.dumps({"answer": handle.get_result()}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: object) -> None:
        """No access log."""
        return


class Server(ThreadingHTTPServer):
    """One thread a request, a deep accept queue."""

    daemon_threads = True
    request_queue_size = 1024


if __name__ == "__main__":
    config: DBOSConfig = {"name": "peers", "system_database_url": os.environ["PEERS_DB_URL"]}
    DBOS(config=config)
    DBOS.launch()
    server = Server(("127.0.0.1", int(sys.argv[1])), Handler)
    print("serving", flush=True)
    server.serve_forever()
