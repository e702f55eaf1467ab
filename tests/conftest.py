"""One real Kafka broker for the whole test session.

`KAFKA_BOOTSTRAP_SERVERS` if set; otherwise a testcontainers Kafka when a Docker
engine answers; otherwise the embedded broker from Maven jars. Each test gets
its own topic prefix and data folder, so tests share the broker, not state.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import core as hypothesis_core
from hypothesis import settings as hsettings

from streams.config import Settings
from streams.testing.stack import broker_bootstrap, fresh_env


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's Kafka bootstrap address (given, Docker or embedded broker), shared by all tests."""
    with broker_bootstrap(tmp_path_factory.mktemp("broker"), docker=True) as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def schema_registry_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real schema registry (Apicurio, in memory) for the session, started only when
    a test asks for it: its Confluent-compatible API, for THREADLINE_SCHEMA_REGISTRY_URL."""
    if os.environ.get("THREADLINE_TEST_SCHEMA_REGISTRY_URL"):
        yield os.environ["THREADLINE_TEST_SCHEMA_REGISTRY_URL"]
        return
    from streams.devtools.registry_server import EmbeddedRegistry

    with EmbeddedRegistry(tmp_path_factory.mktemp("registry") / "registry.log") as registry:
        yield registry.url


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def test_env(kafka_bootstrap: str, tmp_path: Path) -> dict[str, str]:
    """Environment of this test's Threadline processes: the session broker, a
    fresh topic prefix and data folder, and short timeouts."""
    return fresh_env(kafka_bootstrap, tmp_path)


@pytest.fixture
def make_settings(test_env: dict[str, str]) -> SettingsFactory:
    """A factory of Settings from this test's environment, updated with the variables given to it."""
    def make(**env: str) -> Settings:
        test_env.update(env)
        return Settings.from_env(test_env)

    return make


@pytest.fixture
def settings(make_settings: SettingsFactory) -> Settings:
    """Settings of this test's environment, unchanged."""
    return make_settings()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the pure tests first, then those marked `kafka` or `chaos`; skip those
    marked `chaos_sized` unless the run selects `-m chaos`."""
    # Fast, pure tests first: a broken core fails the run before any broker work.
    items.sort(key=lambda i: 1 if i.get_closest_marker("kafka") or i.get_closest_marker("chaos") else 0)
    if "chaos" not in (config.getoption("markexpr") or ""):
        skip = pytest.mark.skip(reason="chaos-sized: runs with -m chaos; docs/chaos.md names "
                                       "the test of make test that stands for it")
        for item in items:
            if item.get_closest_marker("chaos_sized"):
                item.add_marker(skip)


# --- hypothesis: a random seed every session, CI included, printed to replay a failure ---

HYPOTHESIS_SEED_ENV = "THREADLINE_HYPOTHESIS_SEED"
_hypothesis_seed: int | str | None = None

# Hypothesis loads a "ci" profile of its own wherever it sees a CI variable, and
# that one is derandomized: the same examples every run, so CI never finds what a
# new seed would. Ours replaces it: random seeds (one per session, printed below).
# No deadline anywhere: a wall-clock bound fails on a busy shared machine, not on a bug.
hsettings.register_profile("ci", hsettings.get_profile("default"), deadline=None,
                           print_blob=True, derandomize=False)
hsettings.register_profile("threadline", hsettings.get_profile("default"), deadline=None)
hsettings.load_profile("ci" if os.environ.get("CI") or
                       hsettings.get_current_profile_name() == "ci" else "threadline")


def pytest_configure(config: pytest.Config) -> None:
    """Every property test of the session draws from one seed: `--hypothesis-seed`,
    else `THREADLINE_HYPOTHESIS_SEED`, else a fresh random one. It is printed at the
    start and the end of the run, so a failure found by chance can be replayed."""
    global _hypothesis_seed
    given = config.getoption("--hypothesis-seed", None) or os.environ.get(HYPOTHESIS_SEED_ENV)
    if given:
        try:
            _hypothesis_seed = int(given)
        except ValueError:
            _hypothesis_seed = given
    else:
        _hypothesis_seed = secrets.randbits(64)
        # pytest-xdist's workers inherit this process's environment: the same seed.
        os.environ[HYPOTHESIS_SEED_ENV] = str(_hypothesis_seed)
    hypothesis_core.global_force_seed = _hypothesis_seed  # type: ignore[assignment]


def _seed_line() -> str:
    return f"hypothesis seed: {_hypothesis_seed} (replay: {HYPOTHESIS_SEED_ENV}={_hypothesis_seed})"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Print the hypothesis seed at the start of the run."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(_seed_line())


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the hypothesis seed again in the summary at the end of the run."""
    terminalreporter.write_line(_seed_line())
