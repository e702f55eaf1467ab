"""`threadline run` as a real process on the session broker: a role killed with
SIGKILL is restarted and the stack keeps serving; the development key only on a
loopback host."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.cli import _BrokerChild, dev_keys_refusal, is_loopback_host
from streams.config import Settings
from streams.devtools.broker import EmbeddedKafka, free_port
from streams.supervisor import Backoff, Supervisor
from streams.testing.process import logs_of, wait_for

DEV = {"Authorization": "Bearer dev"}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST."])
def test_loopback_hosts(host: str) -> None:
    """Loopback addresses and localhost, in any spelling, count as loopback."""
    assert is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.5", "example.com", "localhost.example",
                                  "128.0.0.1"])
def test_hosts_reachable_from_elsewhere(host: str) -> None:
    """Wildcard, private, public and look-alike hosts do not count as loopback."""
    assert not is_loopback_host(host)


def test_the_dev_key_is_refused_off_loopback_unless_keys_are_set() -> None:
    """The dev API key is refused on a non-loopback host unless API keys are set."""
    def refusal(**env: str) -> str | None:
        return dev_keys_refusal(Settings.from_env({"THREADLINE_API_KEYS": "", **env}))

    assert refusal(THREADLINE_HTTP_HOST="127.0.0.1") is None
    assert refusal(THREADLINE_HTTP_HOST="0.0.0.0", THREADLINE_API_KEYS="k=t") is None
    message = refusal(THREADLINE_HTTP_HOST="0.0.0.0")
    assert message is not None and "THREADLINE_API_KEYS" in message and "'0.0.0.0'" in message


def _threadline_run(env: dict[str, str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "run"],
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"}, cwd=cwd,
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_run_refuses_the_dev_key_on_a_public_host(tmp_path: Path) -> None:
    """`threadline run` on 0.0.0.0 without API keys exits with status 2 before touching Kafka."""
    log = tmp_path / "run.log"
    # An unreachable broker: the refusal comes before any Kafka work.
    proc = _threadline_run({"THREADLINE_HTTP_HOST": "0.0.0.0", "THREADLINE_API_KEYS": "",
                            "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}, log, tmp_path)
    assert proc.wait(60) == 2
    text = log.read_text()
    assert "refusing to start" in text and "THREADLINE_API_KEYS" in text, text


def _http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={**DEV, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc)


def _children(pid: int) -> dict[str, int]:
    """The role processes `threadline run` started: role -> pid."""
    found: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"streams.cli" in argv:
                found[argv[argv.index(b"streams.cli") + 1].decode()] = int(child)
            elif argv[1:3] == [b"-m", b"gateway"]:  # the gateway role runs by module name
                found["gateway"] = int(child)
    return found


def _free_port_pair() -> int:
    """A port free now whose next port is free too, outside the range the kernel hands
    out to client sockets (a Kafka client's own port sat on `free_port() + 1` once)."""
    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    candidates = [*range(20_000, low - 1, 2), *range(high + 1, 65_534, 2)]
    port: int
    for port in random.sample(candidates, len(candidates)):  # concurrent runs pick apart
        try:
            with socket.socket() as first, socket.socket() as second:
                first.bind(("127.0.0.1", port))
                second.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise AssertionError("no two free ports in a row outside the ephemeral range")


@pytest.fixture
def stack(test_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """A whole `threadline run` stack on a free port, stopped with SIGTERM afterwards."""
    port = free_port()
    env = {**test_env, "THREADLINE_HTTP_HOST": "127.0.0.1", "THREADLINE_HTTP_PORT": str(port),
           "THREADLINE_API_KEYS": "", "THREADLINE_AGENT_TOKENS_PER_S": "0",
           "THREADLINE_DECISION_TIMEOUT_S": "20",
           # metrics: the processor on this port, the worker on the next (docs/operations.md)
           "THREADLINE_METRICS_PORT": str(_free_port_pair())}
    log = tmp_path / "run.log"
    proc = _threadline_run(env, log, tmp_path)
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _metrics_port(log: Path) -> str:
    """The processor's metrics port, as its log announces it."""
    def announced() -> str | None:
        for line in log.read_text().splitlines():
            if "processor metrics on http://" in line:
                return line.rsplit(":", 1)[1].split("/")[0]
        return None

    return str(wait_for(announced, timeout=60, progress=logs_of(log)))


def _healthy(base: str, log: Path) -> None:
    wait_for(lambda: _http("GET", f"{base}/healthz")[0] == 200, timeout=120, interval=0.3,
             progress=logs_of(log))


def _answered(base: str, text: str, log: Path) -> None:
    """A new thread and message are accepted, and the answer is stored."""
    status, thread = _http("POST", f"{base}/v1/threads", {"title": "supervised"})
    assert status == 201, thread
    thread_id = thread["thread_id"]
    status, run = _http("POST", f"{base}/v1/threads/{thread_id}/user_message", {"input_text": text})
    assert status == 202, run

    def answer() -> Any:
        status, body = _http("GET", f"{base}/v1/threads/{thread_id}/messages")
        return status == 200 and [m for m in body["messages"] if m["role"] == "assistant"]

    stored = wait_for(answer, timeout=120, interval=0.3, progress=logs_of(log))
    assert len(stored) == 1 and stored[0]["text"], stored


@pytest.mark.kafka
@pytest.mark.chaos
def test_run_restarts_a_killed_processor_and_gateway_and_keeps_serving(
        stack: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    """After SIGKILL of the processor and the gateway, `threadline run` restarts both and still answers."""
    proc, base, log = stack
    _healthy(base, log)
    _answered(base, "before the kills", log)
    assert "accepting the development key 'dev'" in log.read_text()
    # One metrics port a role: the processor's, the worker's next to it, the gateway's /metrics.
    first = int(_metrics_port(log))
    for url, family in ((f"http://127.0.0.1:{first}/metrics", "threadline_processor_commands_total"),
                        (f"http://127.0.0.1:{first + 1}/metrics", "threadline_worker_attempts_started_total"),
                        (f"{base}/metrics", "threadline_gateway_http_requests_total")):
        with urllib.request.urlopen(url, timeout=10) as response:
            assert family in response.read().decode(), url
    for role in ("processor", "gateway"):
        victim = _children(proc.pid)[role]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda role=role, victim=victim:  # type: ignore[misc]
                 f"role {role} (pid {victim}) killed by SIGKILL" in log.read_text()
                 and _children(proc.pid).get(role) not in (None, victim), timeout=120,
                 progress=logs_of(log))
        assert "restarting it in 0.0 s (failure 1 in a row)" in log.read_text()
    assert proc.poll() is None, "the stack stopped"
    _healthy(base, log)
    _answered(base, "after the kills", log)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0  # SIGTERM stops it, children included
    assert "threadline: stopped" in log.read_text()


@pytest.mark.kafka
@pytest.mark.chaos
def test_the_embedded_broker_killed_under_run_is_started_again(tmp_path: Path) -> None:
    """`threadline run`'s own broker is supervised too: SIGKILL, restart on the same
    port and data, and it serves again."""
    broker = EmbeddedKafka(tmp_path / "broker", port=0).start()
    supervisor = Supervisor([], Backoff(initial_s=0.1), base=_BrokerChild(broker), poll_s=0.05)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        assert broker.process is not None  # started above: the supervisor keeps it
        first = broker.process.pid
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: supervisor.restarts == 1, timeout=60, progress=logs_of(broker.log_file))
        assert broker.process is not None and broker.process.pid != first
        broker.wait_ready(120)
    finally:
        supervisor.stop()
        runner.join()
    assert broker.process is None  # stopped with the supervisor
