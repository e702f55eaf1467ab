"""DBOS (PyPI) on a private PostgreSQL cluster from Debian's packages: initdb and
pg_ctl in the run's folder, on a free port, as the `postgres` user when run as root."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import aiohttp
from typing_extensions import override

from bench.peers import install
from bench.peers.procs import Proc, free_port, wait_port
from bench.peers.system import System, answered_ok
from bench.peers.workload import SHARED_LOG_ENV

APP = Path(__file__).parent / "apps" / "dbos_app.py"


class Dbos(System):
    """PostgreSQL, and the application process that runs the DBOS workflows."""

    name = "DBOS"
    roles = ("app",)

    def _as_owner(self, args: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return args
        return ["runuser", "-u", "postgres", "--", *args]

    @override
    async def start(self, session: aiohttp.ClientSession) -> None:
        self.pg = install.postgres_bin()
        self.python = install.venv_python("dbos")
        data = self.folder / "pgdata"
        self.folder.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chmod(self.folder, 0o777)
            data.mkdir()
            os.chown(data, user.pw_uid, user.pw_gid)
        subprocess.run(self._as_owner([str(self.pg / "initdb"), "-D", str(data), "-U", "postgres",
                                       "--auth=trust", "-E", "UTF8"]),
                       check=True, capture_output=True, timeout=120)
        self.port = free_port()
        self.procs["postgres"] = Proc("postgres", self._as_owner([
            str(self.pg / "postgres"), "-D", str(data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.folder}"]),
            {}, self.folder / "postgres.log").start()
        await asyncio.to_thread(wait_port, self.port, 60, [self.procs["postgres"]])
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/peers"
        await asyncio.sleep(0.5)
        subprocess.run([str(self.pg / "createdb"), "-h", "127.0.0.1", "-p", str(self.port),
                        "-U", "postgres", "peers"], check=True, capture_output=True, timeout=60)
        self.app_port = free_port()
        self.procs["app"] = Proc("dbos-app", [str(self.python), str(APP), str(self.app_port)],
                                 {SHARED_LOG_ENV: str(self.tool_log), "PEERS_DB_URL": self.url},
                                 self.folder / "dbos-app.log").start()
        await asyncio.to_thread(wait_port, self.app_port, 90, list(self.procs.values()))

    @override
    async def run(self, session: aiohttp.ClientSession, slot: str, key: str, delay_s: float,
                  deadline: float, ids: dict[str, str]) -> float | None:
        ids[key] = key
        body = {"run": key, "steps": 4, "delay": delay_s}
        ok = await answered_ok(session, "POST", f"http://127.0.0.1:{self.app_port}/run", deadline,
                               json=body)
        return time.time() if ok else None

    def _sql(self, query: str) -> str:
        psql = self.pg / "psql"
        return subprocess.run([str(psql), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                               "-Atc", query], capture_output=True, text=True, check=False,
                              timeout=30).stdout.strip().replace("\n", ", ")

    @override
    def version(self) -> str:
        dbos = subprocess.run([str(self.python), "-c", "import importlib.metadata as m; "
                               "print(m.version('dbos'))"], capture_output=True, text=True,
                              check=False).stdout.strip()
        return f"dbos {dbos}, PostgreSQL {self._sql('SHOW server_version')} (Debian)"

    @override
    def durability(self) -> str:
        return (f"PostgreSQL fsync={self._sql('SHOW fsync')}, synchronous_commit="
                f"{self._sql('SHOW synchronous_commit')}, wal_level={self._sql('SHOW wal_level')}, "
                "no replica; each step's result committed to the system database before the next")

    @override
    def settings(self) -> str:
        return ("shipped defaults of dbos and PostgreSQL (initdb, trust auth on 127.0.0.1); "
                "the HTTP front is the stdlib ThreadingHTTPServer, backlog 1024")

    @override
    async def stop(self) -> None:
        await super().stop()
        shutil.rmtree(self.folder / "pgdata", ignore_errors=True)
