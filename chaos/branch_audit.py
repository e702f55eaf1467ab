"""The branch audit (issue #30): each regenerate and edit answered once, on its branch.

Pure, like `chaos.audit`, which calls `audit_branches` and adds its findings to the
report. It reads what the API serves of every branch (`GET .../branches`, then each
branch's messages with `?branch=`, merged by seq: the answers left on older branches
are there, so they are not lost) and the events topic. For every accepted regenerate
or edit whose run was not cancelled by a later post:

* a regenerate's key named one run, however often it was sent (a 202 each time,
  the deliberate second send included), and the events hold one
  `RegenerateAccepted` for that run;
* its answer's parent is its question (a regenerate: the user message it answers
  again, at an older seq; an edit: the new message), and some branch's path holds
  the question directly followed by that answer;
* an edit's new message stands beside the message it replaces: both have the same
  parent, and the replaced message is still stored (on the older branch).

That each run has exactly one stored answer, and its question one record, is checked
by `chaos.audit` (over every branch) and, on the topics, by `chaos.topic_audit`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from typing import Protocol

from streams.core.domain import Event, RegenerateAccepted

__all__ = ["audit_branches"]

Violation = tuple[str | None, str]  # (report counter or None, text)


class _Post(Protocol):
    @property
    def thread_id(self) -> str: ...
    @property
    def message_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def edits(self) -> str | None: ...
    @property
    def run_ids(self) -> list[str]: ...
    @property
    def statuses(self) -> list[int]: ...
    @property
    def key_resent(self) -> bool: ...


def audit_branches(posts: Sequence[_Post], events: Sequence[Event],
                   stored: dict[str, list[dict[str, object]]],
                   paths: dict[str, dict[int, list[int]]] | None,
                   superseded: dict[str, str]) -> list[Violation]:
    """The violations of the accepted `posts` that regenerate or edit; `stored` is every
    branch's messages of each thread, `paths` each branch's seqs root first (None, or
    a thread missing: not read), `superseded` the runs a later post rightly cancelled."""
    found: list[Violation] = []
    regenerated = Counter(e.run_id for e in events if isinstance(e, RegenerateAccepted))
    for post in posts:
        if post.kind == "post":
            continue
        if len(set(post.run_ids)) > 1:
            found.append(("duplicated", f"{post.kind} of {post.message_id}: one key named runs "
                          f"{sorted(set(post.run_ids))}"))
        if post.key_resent and post.statuses[-1:] != [202]:
            found.append((None, f"regenerate {post.run_id}: its key sent again answered "
                          f"{post.statuses[-1:]}, not 202 with its run"))
        if post.kind == "regenerate" and regenerated[post.run_id] != 1:
            found.append(("lost" if not regenerated[post.run_id] else "duplicated",
                          f"regenerate {post.run_id}: {regenerated[post.run_id]} "
                          "RegenerateAccepted decisions"))
        if post.run_id not in superseded:
            found += _on_its_branch(post, stored.get(post.thread_id, []),
                                    None if paths is None else paths.get(post.thread_id) or None)
    return found


def _on_its_branch(post: _Post, messages: list[dict[str, object]],
                   paths: dict[int, list[int]] | None) -> list[Violation]:
    users = [m for m in messages if m.get("role") == "user"
             and m.get("message_id") == post.message_id]
    answers = [m for m in messages if m.get("role") == "assistant"
               and m.get("run_id") == post.run_id and not m.get("partial")]
    if len(users) != 1 or len(answers) != 1:
        return []  # lost or stored twice: chaos.audit says so
    question, answer = users[0], answers[0]
    found: list[Violation] = []
    if answer.get("parent_seq") != question.get("seq"):
        found.append(("gaps", f"{post.kind} run {post.run_id}: its answer at seq "
                      f"{answer.get('seq')} follows seq {answer.get('parent_seq')}, not its "
                      f"question at {question.get('seq')}: answered off its branch"))
    if paths is not None and not any(
            _follows(path, question.get("seq"), answer.get("seq")) for path in paths.values()):
        found.append(("gaps", f"{post.kind} run {post.run_id}: no branch reads its question "
                      f"(seq {question.get('seq')}) and then its answer (seq {answer.get('seq')})"))
    if post.kind == "edit":
        replaced = [m for m in messages if m.get("message_id") == post.edits]
        if len(replaced) != 1:
            found.append(("lost", f"edit {post.message_id}: the message it replaces, "
                          f"{post.edits}, is stored {len(replaced)} times"))
        elif replaced[0].get("parent_seq") != question.get("parent_seq"):
            found.append(("gaps", f"edit {post.message_id}: its parent is seq "
                          f"{question.get('parent_seq')}, the message it replaces has "
                          f"{replaced[0].get('parent_seq')}"))
    return found


def _follows(path: list[int], first: object, second: object) -> bool:
    return any(a == first and b == second for a, b in pairwise(path))
