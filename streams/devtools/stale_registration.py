"""A restarted embedded node withdraws the registration of the node it was.

A KRaft node killed and started again finds its controller (itself, restarted with
it) holding the registration of its dead predecessor, with a session counted from
the controller's activation. Until that session runs out
(`broker.session.timeout.ms`, 3 s here) each registration try of the new incarnation
is refused with DUPLICATE_BROKER_REGISTRATION, and the tries back off 0.1 s doubling:
the node registered 3.1 s after its first try, about 4 s after the kill.

On a node that is its own quorum's only voter, the registration its controller
holds at activation can only be its predecessor's: a live JVM of the same node would
hold the log directory's lock, and no other node heartbeats to this controller. The
launcher knows the predecessor is dead; the controller cannot. So when the new
node's try is refused, `RegistrationWatch` withdraws the stale registration with
UnregisterBroker (the request `kafka-cluster.sh unregister` sends, KIP-500's
decommissioning) on the controller listener, and the node's next try, 0.1-0.4 s
later, registers. To the partitions it does what the session's expiry does: the
node leaves their leadership and is elected again once it is unfenced.

The hazard is withdrawing the new incarnation's own registration (had it registered
between the refusal and the request, it would heartbeat into errors for good). So
the request goes out only while the old session has at least `MARGIN_S` to run,
counted from the controller's activation as its log dates it: no try can register
before then. And the log says which registration went (the broker epoch of the
`UnregisterBrokerRecord`): should it ever be the new one's, the JVM is killed, and
its restart, with no registration left to wait for, registers at once.

The request is encoded with aiokafka's protocol structs (it has no UnregisterBroker
of its own; neither has librdkafka's admin API): a JVM of Kafka's own tools would
cost as long as the wait it saves.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path

from aiokafka.protocol.api import RequestStruct, Response
from aiokafka.protocol.types import CompactString, Int16, Int32, Schema, TaggedFields

__all__ = ["MARGIN_S", "Action", "RegistrationScan", "RegistrationWatch", "unregister_broker"]

log = logging.getLogger("threadline.broker")

MARGIN_S = 1.0  # the least session left to the stale registration when it is withdrawn
_POLL_S = 0.02
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


class _UnregisterBrokerResponse(Response):  # type: ignore[misc] # aiokafka is untyped here
    API_KEY = 64
    API_VERSION = 0
    SCHEMA = Schema(("throttle_time_ms", Int32), ("error_code", Int16),
                    ("error_message", CompactString("utf-8")), ("tags", TaggedFields))


class _UnregisterBrokerRequest(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 64
    API_VERSION = 0
    RESPONSE_TYPE = _UnregisterBrokerResponse
    SCHEMA = Schema(("broker_id", Int32), ("tags", TaggedFields))


def unregister_broker(controller_port: int, node_id: int, timeout_s: float = 5.0) -> int:
    """Send UnregisterBroker for `node_id` to the controller listener on 127.0.0.1;
    its error code (0: withdrawn, committed to the metadata log)."""
    request = _UnregisterBrokerRequest(node_id, {})
    message = request.build_request_header(1, "threadline-launcher").encode() + request.encode()
    with socket.create_connection(("127.0.0.1", controller_port), timeout=timeout_s) as conn:
        conn.sendall(struct.pack(">i", len(message)) + message)
        size = struct.unpack(">i", _read(conn, 4))[0]
        body = io.BytesIO(_read(conn, size))
    request.parse_response_header(body)
    return int(_UnregisterBrokerResponse.decode(body).error_code)


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the controller closed the connection")
        data += chunk
    return data


class Action(Enum):
    """What a log line calls for."""

    WATCH = "watch"        # nothing to do yet
    WITHDRAW = "withdraw"  # unregister the stale registration now
    KILL = "kill"          # the new incarnation's registration went: restart the node
    DONE = "done"          # nothing more to watch


@dataclass
class RegistrationScan:
    """What the node's log lines call for; pure (the time comes with each line)."""

    node_id: int
    session_s: float
    activated_at: float | None = None  # the controller's activation, epoch seconds
    withdrawn: bool = False
    removed_epoch: int | None = None  # of the UnregisterBrokerRecord the log showed
    registered_epoch: int | None = None  # the new incarnation's

    def feed(self, line: str, now: float) -> Action:
        """The action `line`, read at `now` (epoch seconds), calls for."""
        if "Becoming the active controller" in line:
            stamp = _STAMP.match(line)
            logged = _epoch_s(stamp.group(1)) if stamp is not None else now
            # The earlier of the two, should the JVM's clock zone differ from ours.
            self.activated_at = min(logged, now)
            return Action.WATCH
        if f"Unable to register broker {self.node_id} because the controller returned " \
                "error DUPLICATE_BROKER_REGISTRATION" in line:
            if self.withdrawn:
                return Action.WATCH  # a try sent before the withdrawal was answered
            if self.activated_at is not None and \
                    now < self.activated_at + self.session_s - MARGIN_S:
                self.withdrawn = True
                return Action.WITHDRAW
            return Action.DONE  # too late to be safe: the session's expiry registers it
        if (found := re.search(rf"Replayed UnregisterBrokerRecord\(brokerId={self.node_id}, "
                               r"brokerEpoch=(\d+)\)", line)) is not None:
            self.removed_epoch = int(found.group(1))
            return self._verdict()
        if (found := re.search(rf"Successfully registered broker {self.node_id} with broker "
                               r"epoch (\d+)", line)) is not None:
            self.registered_epoch = int(found.group(1))
            return self._verdict() if self.withdrawn else Action.DONE
        return Action.WATCH

    def _verdict(self) -> Action:
        if self.removed_epoch is None or self.registered_epoch is None:
            return Action.WATCH
        return Action.KILL if self.removed_epoch == self.registered_epoch else Action.DONE

    def answered(self, error_code: int | None) -> Action:
        """The controller's answer to the withdrawal: 0 (removed, the log will say
        which), another error (nothing removed), or None (no answer: it may have been
        removed, so the log is still read for which)."""
        return Action.DONE if error_code not in (0, None) else Action.WATCH


def _epoch_s(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # log4j's local time


class RegistrationWatch(threading.Thread):
    """Follows a starting node's log from `offset` and acts on `RegistrationScan`'s
    calls, until the node registered or exited."""

    def __init__(self, log_file: Path, offset: int, process: subprocess.Popen[bytes],
                 controller_port: int, node_id: int, session_s: float) -> None:
        super().__init__(name=f"registration-watch-{node_id}", daemon=True)
        self.log_file, self.offset, self.process = log_file, offset, process
        self.controller_port = controller_port
        self.scan = RegistrationScan(node_id, session_s)
        self.actions: list[Action] = []  # what it did, for tests and the log

    def run(self) -> None:
        """Read the log as it grows and act, until done or the node exits."""
        pending = b""
        while self.process.poll() is None:
            try:
                with self.log_file.open("rb") as f:
                    if f.seek(0, io.SEEK_END) < self.offset:
                        self.offset, pending = 0, b""  # the log rolled over
                    f.seek(self.offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            self.offset += len(data)
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                if self._act(self.scan.feed(line.decode("utf-8", "replace"), time.time())):
                    return
            time.sleep(_POLL_S)

    def _act(self, action: Action) -> bool:
        """Carry out `action`; whether the watch is over."""
        if action is Action.WATCH:
            return False
        self.actions.append(action)
        if action is Action.WITHDRAW:
            code: int | None = None
            try:
                code = unregister_broker(self.controller_port, self.scan.node_id)
            except (OSError, ValueError) as exc:
                log.warning("node %d: no answer to the withdrawal of its stale "
                            "registration: %s", self.scan.node_id, exc)
            if code == 0:
                log.info("node %d: withdrew its stale registration", self.scan.node_id)
            elif code is not None:
                log.warning("node %d: its stale registration stays (error %d); it "
                            "registers once the session runs out", self.scan.node_id, code)
            return self._act(self.scan.answered(code))
        if action is Action.KILL:
            log.error("node %d: its new registration was withdrawn, not the stale one; "
                      "killing it so that it registers afresh", self.scan.node_id)
            self.process.kill()
        return True
