# Two commands do all set-up on a fresh machine:
#   make run   install everything, run the whole stack on the embedded broker
#   make test  install everything, run every test
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install system-deps helm run test frontends console-shots chaos bench bench-peers bench-gateways lint clean

$(STAMP): pyproject.toml infra/kafka/pom.xml infra/registry/pom.xml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -c "from streams.devtools.broker import ensure_jars; print('kafka jars:', ensure_jars())"
	$(PY) -c "from streams.devtools.broker import ensure_class_archive; print('kafka class archive:', ensure_class_archive())"
	$(PY) -c "from streams.devtools.registry_server import ensure_registry; print('schema registry:', ensure_registry())"
	touch $@

# Then the bytecode of our own modules and of the generated Avro code
# (streams/wire/compiled.py), written even where PYTHONDONTWRITEBYTECODE is set (these
# machines set it): without it every process a test or `make run` starts compiles the
# tree anew, 70-240 ms of each role's start. Only what changed is compiled again.
install: $(STAMP)
	@PYTHONDONTWRITEBYTECODE= $(PY) -m compileall -q streams gateway chaos bench > /dev/null
	@PYTHONDONTWRITEBYTECODE= $(PY) -c "import streams.wire"

# Chromium, Prometheus, node and npm from Debian, for the tests that drive real clients
# (installed as root with apt-get; otherwise it says what is missing).
system-deps:
	@bash infra/system-deps.sh

# Helm, built from the Go module proxy once, for the offline check of the Kubernetes
# chart (deploy/helm/threadline; tests/deploy).
helm:
	@bash infra/helm.sh

run: install
	$(VENV)/bin/threadline run

# ruff (docstrings of public names included), mypy --strict on the whole tree, tests
# too, and the import contracts, before a test runs: `make test` fails on any. A private temp folder
# per run: pytest prunes old runs in the shared default folder, which would delete
# a concurrent run's broker data.
# --durations=25: every run (CI too) prints its 25 slowest tests and fixtures.
# TEST_WORKERS pytest-xdist workers, each with its own broker, a whole file at a time
# (a module's stack fixtures stay on one worker): most tests wait on processes and
# the broker, so two on two cores take about half the time. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: install system-deps helm lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 --basetemp="$$(mktemp -d /tmp/threadline-test-XXXXXX)" $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The front-end tests alone: the AI SDK in Node (tests/node, installed with npm ci by
# the tests) and the console in headless Chromium.
frontends: install system-deps
	$(PY) -m pytest -q -p no:cacheprovider --basetemp="$$(mktemp -d /tmp/threadline-test-XXXXXX)" tests/frontends tests/browser $(PYTEST_ARGS)

# The console's screenshots in docs/console/ (docs/clients.md), taken anew by its
# browser tests; a plain test run writes them to a temp folder.
console-shots: install system-deps
	THREADLINE_CONSOLE_SHOTS=$(CURDIR)/docs/console $(PY) -m pytest -q -p no:cacheprovider tests/browser/test_console.py $(PYTEST_ARGS)

# The chaos program at full size (docs/chaos.md): its own broker, every role killed
# with SIGKILL at seeded random moments, the broker restarted, then an audit.
# CHAOS_SEED=n replays a run's kill plan; CHAOS_ARGS="--preset small" is the in-suite size;
# CHAOS_PRESET=gateways runs three grouped gateways behind HAProxy (system-deps has it);
# CHAOS_PRESET=gateways-by-owner the same, HAProxy sending each thread to its owner.
CHAOS_PRESET ?= full
chaos: install $(if $(filter gateways%,$(CHAOS_PRESET)),system-deps)
	$(PY) -m chaos --preset $(CHAOS_PRESET) $(if $(CHAOS_SEED),--seed $(CHAOS_SEED)) $(CHAOS_ARGS)

bench: install
	$(PY) -c 'import matplotlib, pyinstrument, faust' 2>/dev/null || $(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m bench $(BENCH_ARGS)
	$(PY) -m bench.peers $(PEERS_ARGS)
	$(MAKE) bench-gateways

# Gateways as a group behind HAProxy (issue #26): 1, 2 and 3 gateways side by side
# (and 3 with each client sent to its thread's owner: what forwarding costs), one
# killed for good, one joining two over 100k threads, and one gateway's CPU per
# record of a stream nobody watches, read through the broker; they print their
# tables (docs/benchmarks.md holds them).
bench-gateways: install system-deps
	$(PY) -m bench.gateway_group --owner-routed
	$(PY) -m bench.gateway_failover
	$(PY) -m bench.gateway_join
	$(PY) -m bench.feed_broker

# Threadline side by side with Restate, DBOS and the LangGraph dev server (bench/peers/):
# installs the peers (npm, PyPI, Debian's postgresql) under ~/.cache/threadline/peers,
# runs them one at a time, alternating; writes its section of docs/benchmarks.md.
# PEERS_ARGS=--quick is a smoke check that writes nothing.
bench-peers: install
	$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install -q -e '.[dev,bench]'
	$(PY) -m bench.peers $(PEERS_ARGS)

# ruff, mypy --strict, the layers' import contracts (import-linter, pyproject.toml), and
# no private name imported within a package (which ruff's PLC2701 does not see).
lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy streams gateway tests chaos bench
	$(VENV)/bin/lint-imports --no-logo
	$(PY) -m pytest -q -p no:cacheprovider tests/gateway/test_private_names.py

clean:
	rm -rf var .pytest_cache .hypothesis
