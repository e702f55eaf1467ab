"""HAProxy (the Debian package) in front of several gateways, for tests and the chaos
program: round robin (or random) per request, no affinity, as issue #26 asks of a
deployment.

A request to a server that refuses the connection is sent to another (`retry-on
conn-failure`, `option redispatch`); a killed gateway is taken out once three health
checks of `/livez` fail (half a second apart once one has), and put back once one
passes. A check waits up to 5 s for its answer: on a loaded machine, checks that
gave up sooner took every gateway out at once, and HAProxy answered 503 (which
EventSource does not retry). SSE
responses are long reads: the client and server timeouts are an hour, and HAProxy
does not buffer (it never does for a streamed HTTP/1.1 body). Each request is
logged to `haproxy.log` as it starts (`logasap`: an SSE stream would be logged only
at its end), naming the gateway that served it.

With `owner_routing`, HAProxy also runs deploy/haproxy/threadline.lua: a request
about a thread goes to the gateway that owns its partition (learned from each
gateway's `/livez`), the rest round robin; and `/_threadline/partition/<id>` answers
the partition the script computes for a thread id (a test's check, not a route a
deployment needs).
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Self

from streams.testing.process import wait_for

__all__ = ["OWNER_SCRIPT", "HAProxy", "haproxy_binary"]

OWNER_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "threadline.lua"


def haproxy_binary() -> str | None:
    """The haproxy executable, or None where it is not installed."""
    return shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)


class HAProxy:
    """One HAProxy process balancing `127.0.0.1:port` over the gateways' ports."""

    def __init__(self, port: int, servers: list[int], folder: Path,
                 balance: str = "roundrobin", *, owner_routing: bool = False) -> None:
        self.port, self.servers, self.folder, self.balance = port, servers, folder, balance
        self.owner_routing = owner_routing
        self.config = folder / "haproxy.cfg"
        self.log = folder / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        """The URL clients use."""
        return f"http://127.0.0.1:{self.port}"

    def render(self) -> str:
        """The configuration file's text."""
        servers = "\n".join(f"    server g{n} 127.0.0.1:{port} check"
                            for n, port in enumerate(self.servers))
        lua = by_owner = probe = ""
        if self.owner_routing:
            lua = f"    lua-load {OWNER_SCRIPT}\n"
            probe = ("    http-request use-service lua.threadline_partition "
                     "if { path_beg /_threadline/partition/ }\n")
            by_owner = "    http-request lua.threadline_owner\n" + "".join(
                f"    use-server g{n} if {{ var(txn.threadline_owner) -m str g{n} }}\n"
                for n in range(len(self.servers)))
        return f"""global
    maxconn 4000
    log stdout format raw local0 info
{lua}defaults
    mode http
    log global
    option httplog
    option logasap
    option redispatch
    retries 3
    retry-on conn-failure empty-response
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    timeout http-request 30s
frontend threadline
    bind 127.0.0.1:{self.port}
{probe}    default_backend gateways
backend gateways
    balance {self.balance}
{by_owner}    option httpchk GET /livez
    timeout check 5s
    default-server inter 1s fastinter 500ms downinter 500ms fall 3 rise 1
{servers}
"""

    def start(self) -> Self:
        """Write the configuration and start HAProxy in the foreground (-db)."""
        binary = haproxy_binary()
        if binary is None:
            raise FileNotFoundError("haproxy is not installed (apt-get install haproxy)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.render())
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([binary, "-db", "-f", str(self.config)], stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def wait_serving(self, path: str = "/livez", timeout_s: float = 60.0,
                     progress: Callable[[], object] | None = None) -> None:
        """Until a request through HAProxy is answered by a gateway: within `timeout_s`,
        or, with `progress` (the gateways' logs, say), while it changes."""
        def served() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(self.base + path, timeout=5) as response:
                    return bool(response.status == 200)
            except OSError:
                return False
        try:
            wait_for(served, timeout_s, progress=progress)
        except AssertionError as exc:
            raise AssertionError(f"HAProxy did not serve {path}: {exc}\n"
                                 f"{self.log.read_text()}") from None

    def owner_polls(self) -> int:
        """With `owner_routing`: the script's polls of a gateway's `/livez` so far
        (HAProxy logs each of its own HTTP client's requests)."""
        if not self.log.exists():
            return 0
        return sum(1 for line in self.log.read_text(errors="replace").splitlines()
                   if "<HTTPCLIENT>" in line and "/livez HTTP" in line)

    def stop(self) -> None:
        """Stop HAProxy."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
