"""The branch audit (issue #30): each regenerate and edit answered once, on its branch.

Pure, like `chaos.audit`, which calls `audit_branches` and adds its findings to the
report. It reads what the API serves of every branch (`GET .../branches`, then each
branch's messages with `?branch=`, merged by seq: the answers left on older branches
are there, so they are not lost) and the events topic. For every accepted regenerate
or edit whose run was not cancelled by a later post:

* a regenerate's key named one run, however often it was sent (a 202 each time,
  the deliberate second send included), and the events hold one
  `RegenerateAccepted` for that run;
* its answer is linked to its question (a regenerate: the user message it answers
  again, at an older seq; an edit: the new message) through the parent links, past
  only messages posted meanwhile with `enqueue` (stored at once on the branch, before
  the running answer, as for any post), and some branch read holds the question and
  then the answer the same way;
* an edit's new message stands beside the message it replaces: both have the same
  parent, and the replaced message is still stored (on the older branch).

That each run has exactly one stored answer, and its question one record, is checked
by `chaos.audit` (over every branch) and, on the topics, by `chaos.topic_audit`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from chaos.topic_audit import AcceptedPost
from streams.core.domain import Event, RegenerateAccepted

__all__ = ["audit_branches"]

Violation = tuple[str | None, str]  # (report counter or None, text)


class _Post(AcceptedPost, Protocol):
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
                   superseded: dict[str, str], queued: set[str] | None = None) -> list[Violation]:
    """The violations of the accepted `posts` that regenerate or edit; `stored` is every
    branch's messages of each thread, `paths` each branch's seqs root first (None, or
    a thread missing: not read), `superseded` the runs a later post rightly cancelled,
    `queued` the message ids posted with multitask_strategy enqueue."""
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
                                    None if paths is None else paths.get(post.thread_id) or None,
                                    queued or set())
    return found


def _on_its_branch(post: _Post, messages: list[dict[str, object]],
                   paths: dict[int, list[int]] | None, queued: set[str]) -> list[Violation]:
    users = [m for m in messages if m.get("role") == "user"
             and m.get("message_id") == post.message_id]
    answers = [m for m in messages if m.get("role") == "assistant"
               and m.get("run_id") == post.run_id and not m.get("partial")]
    if len(users) != 1 or len(answers) != 1:
        return []  # lost or stored twice: chaos.audit says so
    question, answer = users[0], answers[0]
    found: list[Violation] = []
    by_seq = {m.get("seq"): m for m in messages}
    if not _answers(_ancestors(answer, by_seq), question, queued):
        found.append(("gaps", f"{post.kind} run {post.run_id}: its answer at seq "
                      f"{answer.get('seq')} is not linked to its question at "
                      f"{question.get('seq')} (answered off its branch)"))
    at = answer.get("seq")
    if paths is not None and not any(
            _answers([by_seq.get(s, {}) for s in reversed(path[:path.index(at)])], question,
                     queued)
            for path in paths.values() if isinstance(at, int) and at in path):
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


def _ancestors(message: dict[str, object],
               by_seq: dict[object, dict[str, object]]) -> list[dict[str, object]]:
    """The messages above `message` through the parent links, nearest first."""
    found: list[dict[str, object]] = []
    parent = message.get("parent_seq")
    while isinstance(parent, int) and parent in by_seq and len(found) <= len(by_seq):
        found.append(by_seq[parent])
        parent = by_seq[parent].get("parent_seq")
    return found


def _answers(above: list[dict[str, object]], question: dict[str, object],
             queued: set[str]) -> bool:
    """Whether the messages `above` an answer (nearest first) reach `question` past
    only messages posted meanwhile with multitask_strategy enqueue (stored at once,
    on the branch, before the running answer: docs/multitask.md)."""
    for message in above:
        if message.get("seq") == question.get("seq"):
            return True
        if message.get("role") != "user" or message.get("message_id") not in queued:
            return False
    return False
