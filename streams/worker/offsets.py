"""One dispatch partition's offsets: which dispatches run, and what may be committed.

Pure bookkeeping, no I/O.
"""

from __future__ import annotations

__all__ = ["PartitionOffsets"]


class PartitionOffsets:
    """One dispatch partition's offsets: running, finished, and what may be committed.

    The commit position is the lowest running offset, or one past the highest
    taken when none runs. `take` refuses offsets already taken, so records
    fetched again after a rebalance are not run twice.
    """

    def __init__(self) -> None:
        self.running: set[int] = set()
        self.done: set[int] = set()  # finished, above the commit position
        self.fetched_to: int | None = None
        self.committed: int | None = None

    def take(self, offset: int) -> bool:
        """Start running `offset`; False if it was taken already."""
        position = self.position()
        if (position is not None and offset < position) or offset in self.running \
                or offset in self.done:
            return False
        self.running.add(offset)
        self.fetched_to = max(self.fetched_to or 0, offset + 1)
        return True

    def finish(self, offset: int) -> None:
        """`offset` is finished: the group may move past it."""
        if offset in self.running:
            self.running.discard(offset)
            self.done.add(offset)

    def position(self) -> int | None:
        """The offset to commit: the lowest running, else one past the highest taken."""
        if self.fetched_to is None:
            return None
        position = min(self.running) if self.running else self.fetched_to
        self.done = {o for o in self.done if o >= position}
        return position
