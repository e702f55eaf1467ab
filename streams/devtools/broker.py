"""The embedded broker, development and test infrastructure (not the runtime): real
Apache Kafka 3.9 (KRaft) fetched from Maven Central, for `threadline run`/`broker`,
the tests, the chaos program and the benchmarks.

No Docker: `ensure_jars` runs Maven once to copy `kafka_2.13` and a logging
binding into a cache outside git; `EmbeddedKafka` formats storage with
`kafka.tools.StorageTool` and runs `kafka.Kafka` as a combined
broker+controller. `EmbeddedCluster` runs three such nodes on one machine
(shared cluster id, one static quorum) for failover tests.

The JVM is started with a parent-death signal, so a killed launcher never
leaves an orphan broker behind. Where `ensure_class_archive` has made one (`make
install` does), it starts with a class-data archive of the broker's own start, which
cuts a JVM start to ready from about 1.3 s to 0.75 s.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from streams.supervisor import die_with_parent

__all__ = [
    "KAFKA_VERSION",
    "BrokerError",
    "EmbeddedCluster",
    "EmbeddedKafka",
    "ensure_class_archive",
    "ensure_jars",
    "free_port",
]

KAFKA_VERSION = "3.9.1"
POM = Path(__file__).resolve().parents[2] / "infra" / "kafka" / "pom.xml"
HEAP = os.environ.get("THREADLINE_KAFKA_HEAP", "-Xms256m -Xmx1g")
SCRAM = "SCRAM-SHA-512"
BROKER_USER = "threadline-broker"  # the broker's own SCRAM user, inter-broker and readiness
# A node killed and started again cannot register with its controller until the
# registration of the node it was has timed out (broker.session.timeout.ms, counted
# from the controller's own restart). Until then each try is refused with
# DUPLICATE_BROKER_REGISTRATION and the next waits twice as long: 0.1 s, doubling,
# capped at the session timeout, so the tries come 0.1, 0.3, 0.7, 1.5, 3.1 and 6.3 s
# after the first. Kafka's 9 s session: up 15 s after a SIGKILL; 4 s: 8.6 s (its
# expiry just missed the 3.1 s try); 3 s: 5.3-5.6 s (`bench.broker_restart`). The
# heartbeat every 0.5 s fences a node only after 2.5 s without one: on 127.0.0.1, a
# node that is gone or whose JVM stalled that long. Withdrawing the dead node's
# registration at the first refusal (UnregisterBroker) registers it 2 s sooner but
# moves every partition's leadership away and back, and the group coordinator's
# reload fenced a static member (the processor exited) in 5 of 8 restarts: not done
# (docs/benchmarks.md).
# And a killed node's unflushed segments are recovered on two threads, not one.
_QUICK_RESTART: dict[str, object] = {"broker.session.timeout.ms": 3000,
                                     "broker.heartbeat.interval.ms": 500,
                                     "num.recovery.threads.per.data.dir": 2}
_SCRAM_SAFE = re.compile(r"[A-Za-z0-9._-]+")  # nothing to escape in the JAAS line or StorageTool's syntax


class BrokerError(RuntimeError):
    """The embedded broker could not be fetched, formatted or started."""


def cache_dir() -> Path:
    base = os.environ.get("THREADLINE_CACHE_DIR") or Path.home() / ".cache" / "threadline"
    return Path(base) / f"kafka-{KAFKA_VERSION}"


def ensure_jars() -> Path:
    """Fetch the broker's jars with Maven once; return the folder holding them."""
    libs = cache_dir() / "libs"
    done = libs / ".complete"
    if done.exists():
        return libs
    if shutil.which("mvn") is None:
        raise BrokerError(
            "Maven (mvn) is needed to fetch Apache Kafka; install it or set KAFKA_BOOTSTRAP_SERVERS")
    if not shutil.which("java"):
        raise BrokerError("Java 17 is needed to run the embedded Kafka broker")
    tmp = libs.with_name("libs.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [
        "mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
        f"-Dkafka.version={KAFKA_VERSION}", f"-DoutputDirectory={tmp}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BrokerError(f"mvn failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)
    done.touch()
    return libs


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kafka_uuid() -> str:
    # Never starting with "-": StorageTool would read such a cluster id as an option
    # (one start in 64 failed so; Kafka's own Uuid.randomUuid avoids it the same way).
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def class_archive(libs: Path) -> Path:
    """Where the class-data archive of this JVM and these jars is (it may not exist).

    An archive is valid for one JVM build only (the JVM ignores another's, with a
    warning), so the name follows the `java` found: its path, size and time."""
    java = Path(shutil.which("java") or "java").resolve()
    with contextlib.suppress(OSError):
        st = java.stat()
        java = Path(f"{java}:{st.st_size}:{st.st_mtime_ns}")
    return libs.parent / f"classes-{hashlib.sha256(str(java).encode()).hexdigest()[:16]}.jsa"


def ensure_class_archive() -> Path | None:
    """Make the broker's class-data archive once, by starting a broker and stopping it.

    AppCDS: the classes a broker loads to start are kept parsed and verified in one
    file that later JVMs map. A start to ready takes about 0.75 s instead of 1.3 here,
    which is that much off every broker restart's recovery. Returns None, and the
    broker runs without, where the JVM could not write a usable one (a JDK without
    its base archive, say)."""
    libs = ensure_jars()
    archive = class_archive(libs)
    if archive.exists():
        return archive
    dump = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="threadline-cds-") as folder:
        node = EmbeddedKafka(Path(folder) / "node", port=0, archive_to=dump)
        try:
            node.start()
        finally:
            node.stop()  # the JVM writes the archive as it exits
        usable = dump.exists() and class_archive_maps(libs, dump, Path(folder))
    if not usable:
        dump.unlink(missing_ok=True)
        return None
    os.replace(dump, archive)  # whole or not at all: concurrent installs race here safely
    for stale in archive.parent.glob("classes-*.jsa"):  # another JVM build's: 44 MB each
        if stale != archive:
            stale.unlink(missing_ok=True)  # a JVM mapping it keeps its pages
    return archive


def class_archive_maps(libs: Path, archive: Path, cwd: Path) -> bool:
    """Whether a JVM required to map `archive` (-Xshare:on) starts from it.

    A damaged archive is not ignored: a JVM that maps one cut short dies of SIGBUS
    (JDK 17, -Xshare:auto included), writing its crash report into `cwd`. So an
    archive goes into place only once this held."""
    return subprocess.run(
        ["java", "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-XX:-CreateCoredumpOnCrash",
         "-cp", f"{libs}/*", "kafka.Kafka", "--version"],
        cwd=cwd, capture_output=True, check=False, timeout=300).returncode == 0


def _java(libs: Path, main: str, args: Sequence[str], log4j: Path, heap: str,
          archive_to: Path | None = None) -> list[str]:
    archive = class_archive(libs)
    if archive_to is not None:
        sharing = [f"-XX:ArchiveClassesAtExit={archive_to}"]
    elif archive.exists():
        sharing = [f"-XX:SharedArchiveFile={archive}"]
    else:
        sharing = []
    return [
        # A 10 ms pause goal, not Kafka's 20: with the cleaner's smaller key map
        # (`properties`) G1 grew its young generation to meet 20 ms, and each of its
        # pauses (a produce waits it out: a durable step's tail) grew with it.
        "java", *heap.split(), *sharing, "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=10",
        # C1 only: the C2 compiler spent about half of a fresh broker's CPU for minutes
        # (idle and per run, 2 cores); C1 code served requests as fast here (issue #22,
        # docs/benchmarks.md). An embedded broker lives for a dev session or a test run.
        "-XX:TieredStopAtLevel=1",
        "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
        f"-Dlog4j.configuration=file:{log4j}", "-cp", f"{libs}/*", main, *args,
    ]


LOG4J = """\
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.RollingFileAppender
log4j.appender.file.File={log}
log4j.appender.file.MaxFileSize=20MB
log4j.appender.file.MaxBackupIndex=2
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=INFO
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
"""


@dataclass
class EmbeddedKafka:
    """One KRaft node (broker + controller) on 127.0.0.1."""

    data_dir: Path
    port: int = 9092
    node_id: int = 1
    controller_port: int = 0
    cluster_id: str = ""
    voters: str = ""  # "1@127.0.0.1:9093,..."; empty: this node alone
    replication_factor: int = 1
    min_insync_replicas: int = 1
    heap: str = HEAP
    # name -> password: the client listener then takes SASL/SCRAM-SHA-512 only, with
    # these users created when the storage is formatted (and a user of its own).
    scram_users: dict[str, str] = field(default_factory=dict, repr=False)
    broker_password: str = field(default="", repr=False)  # kept in the data folder
    # With SASL: run the StandardAuthorizer (nothing allowed without an ACL) with
    # these users and the broker's own as super users.
    super_users: tuple[str, ...] | None = None
    # server.properties set on top of the ones below (a test's own broker, say).
    overrides: dict[str, object] = field(default_factory=dict)
    # Where the JVM writes a class-data archive as it exits (`ensure_class_archive`).
    archive_to: Path | None = field(default=None, repr=False)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        if self.port == 0:
            self.port = free_port()
        if self.controller_port == 0:
            self.controller_port = free_port()
        if not self.voters:
            self.voters = f"{self.node_id}@127.0.0.1:{self.controller_port}"

    @property
    def bootstrap(self) -> str:
        """The client address, `127.0.0.1:<port>`."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl(self) -> bool:
        """Whether clients must authenticate with SASL/SCRAM (some SCRAM users are given)."""
        return bool(self.scram_users)

    @property
    def client_security(self) -> dict[str, str]:
        """librdkafka settings of the broker's own user (for its readiness probe and admins)."""
        if not self.sasl:
            return {}
        return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SCRAM,
                "sasl.username": BROKER_USER, "sasl.password": self.broker_password}

    @property
    def log_file(self) -> Path:
        """The broker's log file, in its data folder."""
        return self.data_dir / "server.log"

    def properties(self) -> str:
        """The node's server.properties text: listeners, quorum, replication and, with SASL, auth settings."""
        rf, isr = self.replication_factor, self.min_insync_replicas
        listener = "SASL_PLAINTEXT" if self.sasl else "PLAINTEXT"
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": self.voters,
            "listeners": f"{listener}://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"CONTROLLER:PLAINTEXT,{listener}:{listener}",
            "log.dirs": self.data_dir / "logs",
            "auto.create.topics.enable": "false",
            "num.partitions": 1,
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 10,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": 10,
            "group.initial.rebalance.delay.ms": 0,
            # THREADLINE_SESSION_TIMEOUT_S is 2 s (docs/operations.md); a stock broker
            # refuses any below 6 s.
            "group.min.session.timeout.ms": 1000,
            # A crashed transactional producer's open transaction blocks read_committed
            # readers until it times out; check for such transactions often.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
            "log.cleaner.backoff.ms": 5000,
            # The log cleaner's key map is one heap array of this size, made at start:
            # Kafka's 128 MiB was half of this broker's 256 MiB starting heap, so G1 ran a
            # concurrent marking cycle (and its remark pause) after every other young
            # collection. 32 MiB holds about 1.2 million keys a pass: more than any
            # partition of a dev or test broker (docs/operations.md).
            "log.cleaner.dedupe.buffer.size": 32 * 1024 * 1024,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "log.flush.interval.messages": 9223372036854775807,
            **_QUICK_RESTART,
        }
        if self.sasl:
            props |= {
                "sasl.enabled.mechanisms": SCRAM,
                "sasl.mechanism.inter.broker.protocol": SCRAM,
                "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
                    "org.apache.kafka.common.security.scram.ScramLoginModule required "
                    f'username="{BROKER_USER}" password="{self.broker_password}";',
            }
        if self.sasl and self.super_users is not None:
            # ANONYMOUS is only ever the PLAINTEXT controller listener on 127.0.0.1:
            # the node's own broker-to-controller traffic.
            supers = [BROKER_USER, "ANONYMOUS", *self.super_users]
            props |= {
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "allow.everyone.if.no.acl.found": "false",
                "super.users": ";".join(f"User:{u}" for u in supers),
            }
        return "".join(f"{k}={v}\n" for k, v in (props | self.overrides).items())

    def _prepare(self) -> tuple[Path, Path, Path]:
        libs = ensure_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.sasl and not self.broker_password:
            # The SCRAM credentials live in the cluster metadata from the first format
            # on, so the broker's own password must survive restarts.
            secret = self.data_dir / "broker-password"
            if not secret.exists():
                fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(secrets.token_hex(24))
            self.broker_password = secret.read_text().strip()
        config = self.data_dir / "server.properties"
        config.write_text(self.properties())
        log4j = self.data_dir / "log4j.properties"
        log4j.write_text(LOG4J.format(log=self.log_file))
        meta = self.data_dir / "logs" / "meta.properties"
        if not meta.exists():
            if not self.cluster_id:
                self.cluster_id = _kafka_uuid()
            args = ["format", "-t", self.cluster_id, "-c", str(config), "--ignore-formatted"]
            users = {**self.scram_users, BROKER_USER: self.broker_password} if self.sasl else {}
            for name, password in users.items():
                if not _SCRAM_SAFE.fullmatch(name) or not _SCRAM_SAFE.fullmatch(password):
                    raise BrokerError(f"SCRAM user {name!r}: names and passwords are [A-Za-z0-9._-]+")
                args += ["--add-scram", f"{SCRAM}=[name={name},password={password}]"]
            proc = subprocess.run(
                _java(libs, "kafka.tools.StorageTool", args, log4j, "-Xmx256m"),
                capture_output=True, text=True, check=False,
            )
            if proc.returncode != 0:
                raise BrokerError(f"StorageTool format failed: {proc.stdout}{proc.stderr}")
        return libs, config, log4j

    def start(self, wait_s: float = 90.0) -> EmbeddedKafka:
        """Format the storage if new, start the broker process and wait up to `wait_s` until it is ready."""
        libs, config, log4j = self._prepare()
        out = open(self.data_dir / "stdout.log", "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            _java(libs, "kafka.Kafka", [str(config)], log4j, self.heap, self.archive_to),
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        out.close()
        if wait_s:
            self.wait_ready(wait_s)
        return self

    def wait_ready(self, wait_s: float = 90.0) -> None:
        """Wait until the broker answers with a controller, or raise BrokerError if it
        exits or makes no progress (writes nothing to its log) for `wait_s`.

        The answer must name this node among its cluster's brokers: a port that
        `free_port` handed out may be taken by another process before the JVM binds
        it, and another test's broker there once passed for a node still starting."""
        from confluent_kafka.admin import AdminClient

        since, logged = time.monotonic(), (-1, -1)
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0, **self.client_security})
        last: Exception | None = None
        while time.monotonic() - since < wait_s:
            with contextlib.suppress(FileNotFoundError):
                st = self.log_file.stat()
                if (st.st_size, st.st_mtime_ns) != logged:  # a starting broker logs each step
                    since, logged = time.monotonic(), (st.st_size, st.st_mtime_ns)
            if self.process is not None and self.process.poll() is not None:
                raise BrokerError(f"broker exited with {self.process.returncode}; see {self.log_file}")
            try:
                md = admin.list_topics(timeout=2)
                if md.brokers and md.controller_id >= 0:
                    # Its cluster's metadata, naming this node among the brokers serving.
                    if self.node_id in md.brokers and md.cluster_id == self._cluster_id():
                        return
                    last = BrokerError(f"{self.bootstrap} answers for brokers "
                                       f"{sorted(md.brokers)} of cluster {md.cluster_id}, "
                                       f"not node {self.node_id} of {self._cluster_id()}")
            except Exception as exc:  # not ready yet
                last = exc
            time.sleep(0.2)
        raise BrokerError(
            f"broker on {self.bootstrap} not ready, nothing logged for {wait_s}s ({last}); "
            f"see {self.log_file}")

    def _cluster_id(self) -> str:
        """The cluster id its storage was formatted with (its meta.properties)."""
        meta = (self.data_dir / "logs" / "meta.properties").read_text()
        return next((line.split("=", 1)[1].strip() for line in meta.splitlines()
                     if line.startswith("cluster.id=")), "")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker with SIGTERM, or SIGKILL after `timeout_s`; nothing if it is not running."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class EmbeddedCluster:
    """Three KRaft nodes on one machine: replication factor 3, min ISR 2."""

    data_dir: Path
    size: int = 3
    nodes: list[EmbeddedKafka] = field(default_factory=list)

    def __post_init__(self) -> None:
        cluster_id = _kafka_uuid()
        ports = [(free_port(), free_port()) for _ in range(self.size)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
        isr = min(2, self.size)
        self.nodes = [
            EmbeddedKafka(
                Path(self.data_dir) / f"node-{i + 1}", port=p, node_id=i + 1, controller_port=c,
                cluster_id=cluster_id, voters=voters, replication_factor=self.size,
                min_insync_replicas=isr, heap="-Xms256m -Xmx768m",
            )
            for i, (p, c) in enumerate(ports)
        ]

    @property
    def bootstrap(self) -> str:
        """The client addresses of every node, comma-separated."""
        return ",".join(n.bootstrap for n in self.nodes)

    def start(self, wait_s: float = 120.0) -> EmbeddedCluster:
        """Start every node, then wait until each one is ready."""
        for node in self.nodes:
            node.start(wait_s=0)
        for node in self.nodes:
            node.wait_ready(wait_s)
        return self

    def stop(self) -> None:
        """Stop every node."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_broker(data_dir: Path, port: int) -> Iterator[EmbeddedKafka]:
    broker = EmbeddedKafka(data_dir, port=port)
    try:
        yield broker.start()
    finally:
        broker.stop()


def main(argv: Sequence[str] | None = None) -> None:  # pragma: no cover - manual use
    port = int((argv or sys.argv[1:] or ["9092"])[0])
    with running_broker(Path("var/broker"), port) as broker:
        print(f"Kafka {KAFKA_VERSION} on {broker.bootstrap}", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
