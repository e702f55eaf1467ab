"""streams/heap.py: a role's start-up heap is frozen in a role's own process only."""

from __future__ import annotations

import gc
import subprocess
import sys

from streams import heap


def test_a_process_not_dedicated_to_a_role_freezes_nothing() -> None:
    """The test session runs roles in-process: its heap stays the collector's."""
    before = gc.get_freeze_count()
    assert heap.freeze_startup_heap() == 0
    assert gc.get_freeze_count() == before


def test_a_role_process_freezes_its_start_up_heap_and_collects_new_cycles() -> None:
    """In a process started as a role (`start_role`), what is alive is frozen after a
    collection; a cycle made afterwards is still collected."""
    script = """
import gc, logging, weakref
from streams.cli import start_role
from streams.heap import freeze_startup_heap
start_role("WARNING")
class Node: pass
garbage = Node(); garbage.me = garbage; dead = weakref.ref(garbage); del garbage
frozen = freeze_startup_heap()
assert dead() is None, "garbage frozen"
assert frozen > 10_000 and gc.get_freeze_count() == frozen, frozen
late = Node(); late.me = late; gone = weakref.ref(late); del late
gc.collect()
assert gone() is None, "a cycle made after the freeze was not collected"
print("ok", frozen)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok ")
