"""An Apicurio Registry from Maven Central, for the schema-registry tests.

Confluent's Schema Registry is not on Maven Central and Karapace is not on PyPI;
Apicurio Registry is on Central, with the Confluent REST API at `/apis/ccompat/v7`.
Central has no runnable jar of it, only the plain Quarkus application jar (and,
for most releases, not all of its own modules): `infra/registry/pom.xml` pins
2.4.2.Final, the newest release whose modules all resolve from Central and
that runs on Java 17, and Quarkus's build goal turns it into a runner jar plus
`lib/` (built once, by `make install`, into the cache folder). Storage is
in-memory H2: a registry lives as long as its process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from streams.devtools.broker import free_port
from streams.supervisor import die_with_parent

__all__ = ["APICURIO_VERSION", "EmbeddedRegistry", "RegistryServerError", "ensure_registry"]

APICURIO_VERSION = "2.4.2.Final"
POM = Path(__file__).resolve().parents[2] / "infra" / "registry" / "pom.xml"
CCOMPAT = "/apis/ccompat/v7"


class RegistryServerError(RuntimeError):
    """The registry could not be built or started."""


def cache_dir() -> Path:
    base = os.environ.get("THREADLINE_CACHE_DIR") or Path.home() / ".cache" / "threadline"
    return Path(base) / f"apicurio-registry-{APICURIO_VERSION}"


def ensure_registry() -> Path:
    """Build the registry's runner jar with Maven once; return its path."""
    build = cache_dir()
    runner = build / "embedded-registry-1-runner.jar"
    done = build / ".complete"
    if done.exists() and runner.exists():
        return runner
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise RegistryServerError("Maven (mvn) and Java 17 are needed to build Apicurio Registry")
    tmp = build.with_name(build.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = ["mvn", "-q", "-B", "-f", str(POM), "package",
           f"-Dapicurio.version={APICURIO_VERSION}", f"-DbuildDir={tmp}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RegistryServerError(
            f"mvn failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    shutil.rmtree(build, ignore_errors=True)
    tmp.rename(build)
    done.touch()
    return runner


class EmbeddedRegistry:
    """One registry process on a free 127.0.0.1 port; `url` is its Confluent API."""

    def __init__(self, log_file: Path, *, timeout_s: float = 90.0) -> None:
        self.log_file = log_file
        self.timeout_s = timeout_s
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The registry's Confluent-compatible REST API base URL."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"

    def start(self) -> None:
        """Launch the registry jar on a free port and wait until it answers."""
        runner = ensure_registry()
        self.port = free_port()
        env = os.environ | {"HTTP_PORT": str(self.port), "QUARKUS_HTTP_HOST": "127.0.0.1"}
        with self.log_file.open("wb") as log:
            self._proc = subprocess.Popen(
                ["java", "-Xms64m", "-Xmx512m", "-XX:+ExitOnOutOfMemoryError", "-jar", str(runner)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=runner.parent,
                preexec_fn=die_with_parent)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RegistryServerError(
                    f"the registry exited ({self._proc.returncode}): "
                    f"{self.log_file.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/subjects", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RegistryServerError(f"the registry did not answer within {self.timeout_s:.0f} s")

    def stop(self) -> None:
        """Terminate the registry process (kill it after 15 s)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> EmbeddedRegistry:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
