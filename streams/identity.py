"""An instance's identity: unique per data folder's contents, stable across restarts.

Kafka fences by identity: a producer that calls `init_transactions` with a
`transactional.id` aborts and fences whatever an earlier producer with that id
left open. That is what a restarted instance wants from its crashed self, and
exactly what two live instances must never do to each other.

The identity used to be a hash of the data folder's absolute path, so two
replicas whose data folder is `/app/var` (every container built from one image)
had the same transactional id and fenced each other in a loop. Now it is a
uuid4 written into the data folder on first start (`<data_dir>/instance-id`,
atomically: temporary file, fsync, `os.link` so that two starts racing on one
folder agree on one id) and read back on every later start. A restart with the
same data folder is the same instance; a copy of the image with its own folder
is another one. `THREADLINE_INSTANCE_ID` still overrides it.

Roles that share a folder keep apart by a prefix (the connector's is `c`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import uuid
from pathlib import Path

from streams.config import Settings

__all__ = ["ID_FILE", "InstanceIdError", "claim_member_id", "instance_id", "stored_instance_id"]

ID_FILE = "instance-id"
_VALID = re.compile(r"[A-Za-z0-9._-]{1,200}")  # what a Kafka transactional or client id accepts


class InstanceIdError(RuntimeError):
    """The identity file exists but does not hold a usable id."""


def _read(path: Path) -> str:
    text = path.read_text(encoding="ascii", errors="replace").strip()
    if not _VALID.fullmatch(text):
        raise InstanceIdError(f"{path} holds {text[:60]!r}, not an instance id; "
                              "delete it to get a new one, or set THREADLINE_INSTANCE_ID")
    return text


def stored_instance_id(data_dir: Path) -> str:
    """The id stored in `data_dir`, created there (a new uuid4) if there is none yet."""
    path = data_dir / ID_FILE
    with contextlib.suppress(FileNotFoundError):
        return _read(path)
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f".{ID_FILE}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "x", encoding="ascii") as out:
            out.write(uuid.uuid4().hex + "\n")
            out.flush()
            os.fsync(out.fileno())
        # link, not rename: it fails if another start got there first, and then
        # both use the id that won.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # make the new name durable too
        fd = os.open(data_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return _read(path)


def instance_id(settings: Settings, prefix: str = "") -> str:
    """`THREADLINE_INSTANCE_ID` if set, else `prefix` and the id stored in the data folder."""
    if settings.instance_id:
        return settings.instance_id
    return prefix + stored_instance_id(settings.data_dir)


def claim_member_id(settings: Settings, prefix: str) -> str:
    """A consumer-group member id (`group.instance.id`) for a role that may run as
    several processes on one data folder: `THREADLINE_INSTANCE_ID` if set, else
    `prefix`, the folder's id and the lowest slot no live process holds.

    A slot is an exclusive `flock` on `<data_dir>/<prefix>member-<n>.lock`, held
    until the process ends: the kernel frees it when the process dies, even by
    SIGKILL, so a restarted process claims its dead self's slot, its member id and
    so its partitions at once (static membership), while two live processes never
    share one (a second member with the same id would fence the first)."""
    if settings.instance_id:
        return settings.instance_id
    base = stored_instance_id(settings.data_dir)
    for slot in range(1024):
        path = settings.data_dir / f"{prefix}member-{slot}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        _held_slots.append(fd)  # open for the process's lifetime: that is the claim
        return f"{prefix}{base}-{slot}"
    raise InstanceIdError(f"1024 {prefix!r} members already run on {settings.data_dir}")


_held_slots: list[int] = []
