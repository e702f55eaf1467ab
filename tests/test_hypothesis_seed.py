"""Property tests draw from a random seed every session, CI included, and the
session prints it, so what one seed found can be replayed (tests/conftest.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PROBE = '''
import os
from hypothesis import given, settings, strategies as st

@settings(database=None, max_examples=20)
@given(st.integers())
def test_probe(n):
    with open(os.environ["PROBE_OUT"], "a") as out:
        out.write(f"{n}\\n")
'''


def _session(tmp_path: Path, name: str, **env: str) -> tuple[str, list[str]]:
    """Run the probe in a pytest session with the suite's conftest, as CI runs it;
    its output, and the values the property was called with."""
    probe = tmp_path / "probe" / "test_probe.py"
    probe.parent.mkdir(exist_ok=True)
    probe.write_text(PROBE)
    drawn = tmp_path / f"{name}.txt"
    clean = {k: v for k, v in os.environ.items() if k not in ("THREADLINE_HYPOTHESIS_SEED", "CI")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(probe.parent), "-c", os.devnull, str(probe)],
        cwd=REPO, env={**clean, "CI": "1", "PROBE_OUT": str(drawn), **env},
        capture_output=True, text=True, check=False)  # the suite's hang guard bounds it
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout, drawn.read_text().split()


def _seeds(output: str) -> list[str]:
    return re.findall(r"hypothesis seed: (\S+) \(replay: THREADLINE_HYPOTHESIS_SEED=\1\)", output)


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    """One CI session of the probe, the one each test below compares another with
    (a session takes about 5 s: one for the module, not one for each test)."""
    return _session(tmp_path_factory.mktemp("first"), "first")


def test_ci_sessions_draw_other_examples_and_print_their_seed(
        tmp_path: Path, first: tuple[str, list[str]]) -> None:
    """Two CI sessions draw different examples and print their seed at start and end."""
    first_out, first_drawn = first
    second_out, second = _session(tmp_path, "second")
    (seed, again), (other, _) = _seeds(first_out), _seeds(second_out)
    assert seed == again, "the seed is printed at the start and at the end"
    assert seed != other
    assert first_drawn != second, "two CI sessions tried the same examples: derandomized"


@pytest.mark.parametrize("how", ["env", "option"])
def test_a_printed_seed_replays_the_same_examples(tmp_path: Path, how: str,
                                                 first: tuple[str, list[str]]) -> None:
    """A printed seed, by env or option, replays the same examples."""
    out, drawn = first
    (seed, _) = _seeds(out)
    if how == "env":
        replay_out, replayed = _session(tmp_path, "replay", THREADLINE_HYPOTHESIS_SEED=seed)
    else:
        replay_out, replayed = _session(tmp_path, "replay", PYTEST_ADDOPTS=f"--hypothesis-seed={seed}")
    assert _seeds(replay_out) == [seed, seed]
    assert replayed == drawn
