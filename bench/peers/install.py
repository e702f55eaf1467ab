"""Installing the peers from the registries, each in its own folder under
`~/.cache/threadline/peers` (PEERS_HOME): a virtualenv per Python peer (pip), the
Restate server and CLI from npm, PostgreSQL from Debian's packages (apt-get).
Pinned, so every run measures the same versions. A failure raises `Missing`."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.peers.system import Missing

__all__ = ["HOME", "postgres_bin", "restate_server", "venv_python"]

HOME = Path(os.environ.get("PEERS_HOME") or Path.home() / ".cache" / "threadline" / "peers")
PIP = {
    "restate": ["restate-sdk==1.3.0", "hypercorn==0.18.0"],
    "dbos": ["dbos==3.4.0"],
    "langgraph": ["langgraph-cli[inmem]==0.4.40"],
}
NPM = ["@restatedev/restate-server@1.7.12", "@restatedev/restate@1.7.12"]
INSTALL_TIMEOUT_S = 600


def _run(args: list[str], cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Missing(f"{' '.join(args[:4])}: {exc}") from exc
    if done.returncode != 0:
        raise Missing(f"{' '.join(args[:4])} failed: {(done.stderr or done.stdout)[-600:]}")


def venv_python(name: str) -> Path:
    """The interpreter of the peer's virtualenv, created and installed on first use."""
    folder = HOME / name
    python = folder / "bin" / "python"
    stamp = folder / (".installed-" + "-".join(PIP[name]).replace("[", "").replace("]", ""))
    if not stamp.exists():
        HOME.mkdir(parents=True, exist_ok=True)
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(folder)])
        _run([str(python), "-m", "pip", "install", "-q", *PIP[name]])
        stamp.touch()
    return python


def restate_server() -> Path:
    """The restate-server binary the npm package ships."""
    folder = HOME / "restate-npm"
    found = glob.glob(str(folder / "node_modules/@restatedev/restate-server-*/bin/restate-server"))
    if not found:
        if shutil.which("npm") is None:
            raise Missing("npm is not installed")
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "package.json").exists():
            (folder / "package.json").write_text('{"name": "peers", "private": true}\n')
        _run(["npm", "install", "--silent", "--no-audit", "--no-fund", *NPM], cwd=folder)
        found = glob.glob(str(folder / "node_modules/@restatedev/restate-server-*/bin/restate-server"))
    if not found:
        raise Missing("npm installed @restatedev/restate-server without a binary for this platform")
    return Path(found[0])


def postgres_bin() -> Path:
    """The folder of PostgreSQL's initdb, pg_ctl and postgres (apt-get install postgresql if needed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            raise Missing("PostgreSQL is not installed and apt-get cannot install it here")
        _run(["apt-get", "install", "-y", "-q", "postgresql"])
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise Missing("apt-get install postgresql left no initdb")
    return Path(found[-1]).parent
