"""Give freed heap memory back to the operating system after a bulk load; keep the
garbage collector off what a role holds for its whole life.

A restore decodes hundreds of thousands of records; glibc keeps the freed chunks
in its arenas, and its main (brk) heap only shrinks from the top, so one live
allocation late in the load keeps the whole peak resident. `malloc_trim(0)`
returns every free page of every arena (with `MADV_DONTNEED` for the pages in the
middle of a heap), which no Python-level call can do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from functools import cache

log = logging.getLogger(__name__)


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return libc


def release_free_memory() -> bool:
    """Return the allocator's free pages to the OS; False where the C library cannot."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))


_dedicated = False  # this process runs one role (`dedicate_process`), not a test or a library user


def dedicate_process() -> None:
    """Declare this process a role's own (`streams.cli.start_role`): only then does
    `freeze_startup_heap` freeze. A process that runs roles in-process (a test
    session starts and stops many) would keep every cycle among their frozen objects."""
    global _dedicated
    _dedicated = True


def freeze_startup_heap() -> int:
    """Move every object alive now out of the collector's reach (`gc.freeze`), once a
    role is up, in a role's own process; the number of objects frozen (0: not done).

    What a role holds by then (modules, classes, settings, its Kafka clients) lives as
    long as the process, and each full collection walked all of it again: 11-37 ms a
    time in the roles of the peers benchmark (gc.callbacks, issue #22), a pause of
    every run and stream the process serves; Python runs one whenever the objects that
    survived grew by a quarter. After the freeze it walks only what came since.
    Collected first, so no garbage is frozen; a frozen object freed by reference
    counting is freed as ever, only a cycle among frozen objects would stay."""
    if not _dedicated:
        return 0
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
