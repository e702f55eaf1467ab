"""An instance's identity: stored in its data folder on first start, stable after,
different for two folders even at the same path, overridable."""

from __future__ import annotations

import multiprocessing
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streams.config import Settings
from streams.connectors.config import instance_id_for as connector_id
from streams.identity import (
    ID_FILE,
    InstanceIdError,
    claim_member_id,
    instance_id,
    stored_instance_id,
)
from streams.processor import instance_id_for as processor_id


def _settings(data_dir: Path, **env: str) -> Settings:
    return Settings.from_env({"THREADLINE_DATA_DIR": str(data_dir), "THREADLINE_INSTANCE_ID": "",
                              **env})


def test_the_first_start_stores_an_id_and_every_later_start_reads_it_back(tmp_path: Path) -> None:
    """The first start writes an instance id file; later starts read the same id back."""
    folder = tmp_path / "var"  # not created yet: the first start makes it
    first = stored_instance_id(folder)
    assert (folder / ID_FILE).read_text().strip() == first
    assert stored_instance_id(folder) == first
    assert processor_id(_settings(folder)) == first
    assert list(folder.iterdir()) == [folder / ID_FILE], "no temporary file is left behind"


def test_two_replicas_with_the_same_data_path_get_different_ids(tmp_path: Path) -> None:
    """Two containers from one image both use `/app/var`: same path, own contents."""
    folder = tmp_path / "app" / "var"
    first = processor_id(_settings(folder))
    shutil.rmtree(folder)  # the second container's own, empty folder at the same path
    second = processor_id(_settings(folder))
    assert first != second


def test_the_override_wins_and_nothing_is_written(tmp_path: Path) -> None:
    """THREADLINE_INSTANCE_ID is used as is, and no id file is written."""
    settings = _settings(tmp_path / "var", THREADLINE_INSTANCE_ID="proc-7")
    assert processor_id(settings) == "proc-7"
    assert connector_id(settings) == "proc-7"
    assert not (tmp_path / "var").exists()


def test_the_connector_in_the_same_folder_keeps_apart_by_its_prefix(tmp_path: Path) -> None:
    """The connector's id is the processor's id with a "c" prefix."""
    settings = _settings(tmp_path / "var")
    assert connector_id(settings) == "c" + processor_id(settings)
    assert instance_id(settings, prefix="c") == connector_id(settings)


@pytest.mark.parametrize("content", ["", "two words\n", "x" * 300, "évian"])
def test_an_unusable_id_file_is_refused_with_its_path(tmp_path: Path, content: str) -> None:
    """An empty, spaced, overlong or non-ASCII id file is refused, naming the file."""
    (tmp_path / ID_FILE).write_text(content)
    with pytest.raises(InstanceIdError, match=ID_FILE):
        stored_instance_id(tmp_path)


def test_an_id_written_by_an_operator_is_used_as_is(tmp_path: Path) -> None:
    """An id file written by hand is used as it is."""
    (tmp_path / ID_FILE).write_text("eu-west-processor-3\n")
    assert processor_id(_settings(tmp_path)) == "eu-west-processor-3"


def _start(folder: str, out: multiprocessing.Queue[str]) -> None:
    out.put(stored_instance_id(Path(folder)))


def test_starts_racing_on_one_empty_folder_agree_on_one_id(tmp_path: Path) -> None:
    """Six processes starting at once on an empty folder all get the same stored id."""
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[str] = context.Queue()
    procs = [context.Process(target=_start, args=(str(tmp_path / "var"), out)) for _ in range(6)]
    for p in procs:
        p.start()
    ids = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join()
    assert len(ids) == 1
    assert ids == {(tmp_path / "var" / ID_FILE).read_text().strip()}


_CLAIM = """
import sys, time
from pathlib import Path
from streams.config import Settings
from streams.identity import claim_member_id
settings = Settings.from_env({"THREADLINE_DATA_DIR": sys.argv[1], "THREADLINE_INSTANCE_ID": ""})
print(claim_member_id(settings, "w"), flush=True)
time.sleep(3600)  # holds its slot until killed
"""


def _claimer(folder: Path) -> tuple[subprocess.Popen[str], str]:
    """A process that claims a worker member id in `folder` and holds it; and the id."""
    child = subprocess.Popen([sys.executable, "-c", _CLAIM, str(folder)], stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).resolve().parents[2])
    assert child.stdout is not None
    line = child.stdout.readline().strip()  # "" if it died first: fails below, never hangs
    assert line, f"the claiming process ended with {child.wait()}"
    return child, line


def test_a_worker_member_id_is_its_dead_selfs_and_never_a_live_processs(tmp_path: Path) -> None:
    """Static membership needs the restart of a process to be the same member and two
    live processes never to be: a slot is held by a live process only, and freed by
    the kernel when the process is killed with SIGKILL."""
    folder = tmp_path / "var"
    holder, held = _claimer(folder)
    try:
        mine = claim_member_id(_settings(folder), "w")  # a second live process: its own slot
        assert mine != held and held.endswith("-0") and mine.endswith("-1")
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        restarted, again = _claimer(folder)
        restarted.kill()
        restarted.wait()
        assert again == held  # the dead process's slot, so its member id
    finally:
        holder.kill()
        holder.wait()
    assert claim_member_id(_settings(folder, THREADLINE_INSTANCE_ID="pod-3"), "w") == "pod-3"
