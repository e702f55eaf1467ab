"""Give freed heap memory back to the operating system after a bulk load.

A restore decodes hundreds of thousands of records; glibc keeps the freed chunks
in its arenas, and its main (brk) heap only shrinks from the top, so one live
allocation late in the load keeps the whole peak resident. `malloc_trim(0)`
returns every free page of every arena (with `MADV_DONTNEED` for the pages in the
middle of a heap), which no Python-level call can do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
