"""The agent worker: runs dispatched attempts and streams their output live.

Modules, as the parts of one worker process:

- `group`: the dispatch consumer group's loop (`Worker`): takes dispatch records,
  runs each as an `Execution` (at most `concurrency` at a time), commits;
- `offsets`: one dispatch partition's running and finished offsets (`PartitionOffsets`);
- `watch`: the lifecycle follower (`LifecycleWatch`), which learns each run's fate;
- `execution`: one execution of one attempt (`Execution`) and its reports;
- `answer`: the pure part of an execution, its numbered, coalesced stream records;
- `role`: the `threadline worker` role (`run_worker`).

For one attempt the worker, with an idempotent (not transactional, so tokens
are not held back) producer:

1. reports `ReportAttemptStarted` to the commands topic;
2. streams `StreamOutput` records to the stream topic, on the dispatch record's
   partition number: MessageStart, then per text part TextStart, TextDelta*
   (deltas coalesced for `delta_coalesce_ms`), TextEnd, then StepOutput*,
   CitationsOutput?, MessageEnd. Every execution has a fresh id, part of each
   `part_id`, and numbers its records by `seq` from 0, so a re-run of the same
   attempt starts a new message that a reader can tell apart;
3. reports `ReportHeartbeat` every `heartbeat_interval_ms` while the agent makes
   progress (it stops when the agent has been silent for half the processor's
   heartbeat timeout, so a hung agent is rescheduled);
4. reports `ReportAttemptCompleted` or `ReportAttemptFailed` and waits for the
   broker's ack.

Offsets: a partition's committed offset is the lowest dispatch still running,
so the group only moves past attempts whose outcome report was acked, or that
were superseded. A dispatch whose worker dies mid-attempt is redelivered after
the session timeout and run again, same attempt number, by whoever owns the
partition then.

Supersession: a second, group-less consumer follows the lifecycle records the
processor mirrors into the stream topic (`RunLifecycle`) on the partitions this
worker owns, and folds them into each run's fate (`streams.core.lifecycle.RunFate`).
An attempt whose run ended (completed, failed, cancelled) or whose attempt number
is past (retry_scheduled for it, attempt_dispatched for a later one) is stopped at
once, reports nothing more and counts as finished. Before an attempt starts, the
follower has read its partition to the end at least once since assignment, and
from the dispatch's time on (it goes back for a redelivered dispatch), so a
dispatch that is already dead is not started; a dispatch older than the attempt
timeout is never started.

Shutdown (SIGTERM, SIGINT): stop fetching, report running attempts failed
(retryable) so the processor retries them at once, commit, leave the group.
"""

from __future__ import annotations

from streams.worker.execution import SHUTDOWN_ERROR
from streams.worker.group import Worker
from streams.worker.offsets import PartitionOffsets
from streams.worker.role import run_worker

__all__ = ["SHUTDOWN_ERROR", "PartitionOffsets", "Worker", "run_worker"]
