"""The embedded broker's JVM starts from its class-data archive (AppCDS), when there
is one: a start to ready in about 0.75 s instead of 1.3, off every broker restart. And
its readiness is its own, not another broker's on its port."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.devtools.broker import (
    BrokerError,
    EmbeddedKafka,
    _java,
    cache_dir,
    class_archive,
    class_archive_maps,
    ensure_class_archive,
    ensure_jars,
)


def test_every_broker_jvm_maps_the_class_archive_made_for_it(tmp_path: Path) -> None:
    """`ensure_class_archive` (run by `make install`) leaves an archive that a JVM
    required to map it starts from, and every broker command line names it."""
    libs = ensure_jars()
    archive = ensure_class_archive()
    assert archive is not None and archive == class_archive(libs)
    assert class_archive_maps(libs, archive, tmp_path)
    for main in ("kafka.Kafka", "kafka.tools.StorageTool"):
        command = _java(libs, main, [], tmp_path / "log4j.properties", "-Xmx256m")
        assert f"-XX:SharedArchiveFile={archive}" in command


def test_an_archive_cut_short_is_never_put_in_place(tmp_path: Path) -> None:
    """The check `ensure_class_archive` makes before an archive goes into place fails
    for one cut short (a JVM mapping it would die of SIGBUS, -Xshare:auto or not)."""
    archive = ensure_class_archive()
    assert archive is not None
    cut = tmp_path / "cut.jsa"
    cut.write_bytes(archive.read_bytes()[:1_000_000])
    assert not class_archive_maps(ensure_jars(), cut, tmp_path)
    assert list(tmp_path.glob("hs_err_pid*.log")), "the JVM's crash report, in the folder given"


def test_a_new_archive_is_made_from_a_broker_and_replaces_another_builds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no archive for this JVM, `ensure_class_archive` starts a broker, stops it,
    checks what its JVM wrote and puts it in place; another JVM build's archive (44 MB,
    useless here) is removed, so a cache does not grow with each JDK update."""
    libs = ensure_jars()
    monkeypatch.setenv("THREADLINE_CACHE_DIR", str(tmp_path / "cache"))
    fresh = cache_dir()
    fresh.mkdir(parents=True)
    (fresh / "libs").symlink_to(libs)  # the same jars, found by a new folder
    stale = fresh / "classes-0000000000000000.jsa"
    stale.write_bytes(b"another build's")
    archive = ensure_class_archive()
    assert archive is not None and archive.parent == fresh and archive.stat().st_size > 1_000_000
    assert class_archive_maps(fresh / "libs", archive, tmp_path)
    assert not stale.exists()
    assert sorted(p.name for p in fresh.iterdir()) == sorted(["libs", archive.name])


def test_a_broker_on_its_port_that_is_not_this_node_is_not_taken_for_it(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """A port handed out by `free_port` can be taken by another process before the JVM
    binds it: the node's readiness wait must not take another broker there for it
    (CI, 58c5265: a three-node cluster went on with its third node still starting,
    and topic creation found two brokers). Here the port is the session broker's: the
    new node cannot bind it and exits, and the wait says so."""
    port = int(kafka_bootstrap.rsplit(":", 1)[1])
    node = EmbeddedKafka(tmp_path / "node", port=port, node_id=2)
    try:
        with pytest.raises(BrokerError, match="exited"):
            node.start(wait_s=60)
    finally:
        node.stop()
