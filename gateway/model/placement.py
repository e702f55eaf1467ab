"""Where a thread's reads are served when the gateways split the partitions (issue #26).

In a gateway group each gateway's read model holds only the partitions it owns
(`ReadModel.hold`). A request about a thread held elsewhere is served one of two
ways, chosen per request by `ROUTE`:

- `FORWARD` (the default): nothing has been done for the request yet, so the whole
  request goes to the partition's owner (`HeldElsewhere`, caught by
  `gateway.cluster.route`), which answers it as a single gateway would.
- `REMOTE`: the request must stay here, because it published a command (forwarding
  it would publish again) or it streams (its stream must outlive the owner:
  `gateway.cluster.remote`). Its few reads are asked of the owner one by one
  (`ElsewhereReads`).
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from gateway.model.read_model import RunView
    from gateway.model.read_store import MessagePage, ThreadPage
    from streams.core.domain import ThreadState

__all__ = ["FORWARD", "REMOTE", "ROUTE", "ElsewhereReads", "HeldElsewhere", "Hints",
           "NowHeldHere", "is_served_here", "served_here", "stay_here"]

FORWARD, REMOTE = "forward", "remote"
ROUTE: contextvars.ContextVar[str] = contextvars.ContextVar("threadline_route", default=FORWARD)


F = TypeVar("F")
_SERVED_HERE = "__threadline_served_here__"


def served_here(handler: F) -> F:
    """Mark a route's handler as one that stays where the request arrived: it streams
    (its stream outlives the owner's) or publishes at once. Its reads of threads held
    elsewhere are asked remotely."""
    setattr(handler, _SERVED_HERE, True)
    return handler


def is_served_here(handler: object) -> bool:
    """Whether `served_here` marked the handler."""
    return bool(getattr(handler, _SERVED_HERE, False))


def stay_here() -> None:
    """This request has done something that must not be done twice (it published a
    command): from now on its reads of threads held elsewhere are asked remotely."""
    ROUTE.set(REMOTE)


class HeldElsewhere(Exception):
    """The thread's partition is held by another gateway: forward the request whole."""

    def __init__(self, partition: int) -> None:
        super().__init__(f"partition {partition} is held by another gateway")
        self.partition = partition


class NowHeldHere(Exception):
    """A partition whose owner was being asked came to this gateway meanwhile (the
    group gave it here, a killed owner's): read it here instead."""

    def __init__(self, partition: int) -> None:
        super().__init__(f"partition {partition} is held here now")
        self.partition = partition


# What the asking gateway knows of a thread that the owner may not know yet (it
# published the command and read the decision): (created, accepted run, ended run).
Hints = tuple[bool, str | None, str | None]


class ElsewhereReads(Protocol):
    """The reads of a `REMOTE` request, asked of the owner of the thread's partition
    (`gateway.cluster.reads`); each raises `Problem` as the owner answers, and
    `NowHeldHere` if a partition it waited for an owner of came here."""

    async def thread(self, tenant: str, thread_id: str, hints: Hints) -> ThreadState | None:
        """The thread as the owner reads it after catching up."""
        ...

    async def run(self, tenant: str, run_id: str, thread_id: str | None,
                  hints: Hints) -> RunView | None:
        """The run (its thread's owner asked; every other gateway if the thread is unknown)."""
        ...

    async def current_messages(self, tenant: str, thread_id: str, after: int | None,
                               before: int | None, limit: int) -> MessagePage:
        """A page of the thread's current branch."""
        ...

    async def threads(self, tenant: str, after: tuple[int, str] | None, limit: int,
                      here: ThreadPage) -> ThreadPage:
        """The tenant's threads over every gateway, `here` being this one's page."""
        ...
