# The two commands of the README: `make demo` and `make test`. Everything they need is installed here,
# in one $(VENV): `make demo` installs the app and the example project only; `make test` adds what the
# tests, the linters and the benchmarks drive.
VENV ?= .venv
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/postgres

.PHONY: modules-bench engine-cpu-bench demo demo-admin demo-stop test lint type bench bench-check bench-scale bench-machine bench-relay bench-suppression bench-signing bench-evidence-wal crash-bench schema-costs faults soak recovery-soak bench-recovery bench-prune clean package release-check tox lateness-bench wakeup-bench threads-bench fairness-bench call-timeline health-bench

# The demo's: the venv's own pip as the interpreter brings it (recent enough for an editable install), and
# no byte-compiling of every dependency's modules (the demo compiles those it imports, on first use).
$(VENV)/.installed-demo: pyproject.toml notifications_retry/version.py
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --no-compile -e '.[example]'
	touch $@

$(VENV)/.installed: pyproject.toml notifications_retry/version.py
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,example,dev,otel,bench]'
	touch $@ $(VENV)/.installed-demo

# The example project's demo, on an embedded PostgreSQL in .pgdata unless DATABASE_URL is set; the
# embedded server stops when the last command using it exits.
demo: $(VENV)/.installed-demo
	$(PY) manage.py demo

# The admin on the demo data: a demo superuser (a fresh password, printed) and the development server on
# 127.0.0.1:$(DEMO_PORT).
DEMO_PORT ?= 8000
demo-admin: $(VENV)/.installed-demo
	$(PY) manage.py demo_admin --port $(DEMO_PORT)

# Stop an embedded PostgreSQL left running in .pgdata (by a demo that was killed).
demo-stop:
	@if [ -x $(PY) ]; then PGSERVER_DATA_DIR=$(CURDIR)/.pgdata $(PY) -m example_project.embedded_postgres stop; fi

# The test suite against a real PostgreSQL (the local server, started when it is down), in
# $(TEST_WORKERS) pytest-xdist processes, a test module per process at a time (each has its own test
# database; TEST_WORKERS=0 runs in this process alone). NR_TEST_DATABASE_PREFIX=x_ prefixes every database
# the suite creates, for runs that share a server. Three on two cores: the process tests spend
# most of their time waiting for subprocesses and servers, so a third process fills that time.
# checkov gets a venv of its own (scripts/ensure-checkov); its exit 75, the package index unreachable,
# lets the suite run and its test skip, saying why.
TEST_WORKERS ?= 3
test: $(VENV)/.installed
	bash scripts/ensure-postgres
	bash scripts/ensure-chromium
	bash scripts/ensure-prometheus
	bash scripts/ensure-pgbouncer
	bash scripts/ensure-checkov >/dev/null || test $$? -eq 75
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The fault suite's long scenarios (1-million-row backlog, vacuum held back): minutes, not for every run.
soak: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest -q -s tests/process --soak -m "process" $(PYTEST_ARGS)

# A 200,000-row recovery job killed with SIGKILL midway, then resumed (the default suite runs 20,000 rows).
recovery-soak: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest -q -s tests/process/test_recovery_kill.py --soak $(PYTEST_ARGS)

# A 200,000-row recovery job's rows/s, alone and beside a looping worker's drain, and the drain's rows/s
# alone and beside it, in one run (database nr_recovery_bench of the local server).
bench-recovery: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.recovery $(BENCH_ARGS)

# The retention of Sent rows at 1,000,000 rows: rows deleted a second, and a tick's claim (median, p99)
# alone and while the prune runs, in one run (database nr_prune_bench of the local server).
bench-prune: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.prune $(BENCH_ARGS)

# Network faults between the worker and its servers (latency, loss, a 20 s partition; a 110 s partition) in
# network namespaces the tests make on a veth pair: needs root; its own PostgreSQL cluster, so no
# DATABASE_URL is used by the scenarios.
faults: $(VENV)/.installed
	bash scripts/ensure-postgres
	bash scripts/ensure-netns-tools
	NR_FAULTS=1 DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest -q -s tests/faults -m faults $(PYTEST_ARGS)

# Throughput, WAL bytes and commits per notification against the lean ceiling, measured in one run on a
# throwaway PostgreSQL cluster (--server url: the local server instead); BENCH_ARGS="--scale --memory"
# adds the 5 M-row claim and the 1 M-row RSS parts (slow); BENCH_ARGS=--profile profiles a no-op drain.
bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	$(VENV)/bin/pip install -q -e '.[bench]'
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.run $(BENCH_ARGS)

# The benchmark commands' smoke tests (bench.run, bench.schema_costs, bench.crash on tiny sizes, the local
# server): they run bench/ code, so the default suite skips them (tests marked `bench`; --bench-check).
bench-check: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest -q tests/process/test_bench_smoke.py --bench-check -m bench $(PYTEST_ARGS)

# SIGKILL a looping worker 20 times during a webhook drain (database nr_crash_bench of the local server):
# rows lost, duplicate sends per kill, recovery rate of expired leases.
crash-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.crash $(BENCH_ARGS)

# Several looping workers sharing one backlog by partition (database nr_scale_bench of the local server):
# rows/s with 1, 2 and 4 workers against a 50 ms receiver, duplicate sends (and after a SIGKILL), the
# busiest 1-s window of a 200/s channel with 4 workers, and what N partitions cost a claim.
bench-scale: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.scale $(BENCH_ARGS)

# The latency-bound drain at max_concurrency 128 by 1 and 2 workers, on a throwaway cluster: rows/s and
# the CPU a row of the workers, the receiver, PostgreSQL and the whole machine.
bench-machine: $(VENV)/.installed
	bash scripts/ensure-postgres
	$(PY) -m bench.machine_bound $(BENCH_ARGS)

# A webhook signature's cost per request (signing alone, and a whole request), against an unsigned one.
bench-signing: $(VENV)/.installed
	$(PY) -m bench.signing $(BENCH_ARGS)

# WAL bytes per failed attempt before and after evidence per attempt, on a throwaway cluster.
bench-evidence-wal: $(VENV)/.installed
	bash scripts/ensure-postgres
	$(PY) -m bench.evidence_wal $(BENCH_ARGS)

# How late a looping worker on default settings sends scheduled and handed-over rows (p50/p95/p99), and
# the statements a second it runs while nothing is due (pg_stat_statements), on a throwaway cluster.
lateness-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.lateness $(BENCH_ARGS)

# How late a looping worker on default settings sends a row due 5 s after its sessions were terminated
# while it waited between ticks (20 trials, p50 and worst), alone and beside rows in year 12000, on a
# throwaway cluster.
wakeup-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.wakeup_cut $(BENCH_ARGS)

# How late a small tenant's rows are sent while another tenant's 20,000 due rows drain (p50/p99), on a
# throwaway cluster.
fairness-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.fairness $(BENCH_ARGS)

# The threads a looping worker runs during a webhook drain (/proc/<pid>/task), on a throwaway cluster.
threads-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.threads $(BENCH_ARGS)

# Where a call's time goes in the latency-bound drain (c=32, 20 ms receiver): calls in flight, a call's
# time split at the request written and the answer read, the worker's thread outside its send loop.
call-timeline: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.call_timeline $(BENCH_ARGS)

# What the schema costs the raw drain (WAL bytes, rows/s): triggers, admin-only indexes, fillfactor.
schema-costs: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.schema_costs $(BENCH_ARGS)

# The outbox side in one run (database nr_bench_relay): the outbox trigger's cost, relay events/s.
bench-relay: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.relay $(BENCH_ARGS)

# What the suppression check costs a 500-row claim (database nr_bench_suppression): with the list empty
# and holding 100,000 addresses, against the same claim without the check, in one run.
bench-suppression: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.suppression $(BENCH_ARGS)

# How soon a failing endpoint's calls stop (database nr_bench_health of the local server): calls to a
# 410 endpoint with 500 rows due at max_concurrency 8; the simulated time until an endpoint failing 97 %
# of its calls is disabled on default settings (the real worker and receiver, ticks on a simulated clock).
health-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.endpoint_health $(BENCH_ARGS)

# The package modules a one-record `retry_worker --once` (webhook) imports, and those whose code it calls
# (a fresh interpreter, database nr_modules_bench of the local server); BENCH_ARGS=--list names them.
modules-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.modules_run $(BENCH_ARGS)

# The engine's CPU a row (a provider that waits 20 ms on the send loop, no HTTP) at max_concurrency 128,
# this tree against an older commit (AGAINST_REV, a git worktree) in alternating drains of one run;
# BENCH_ARGS=--webhook adds the webhook drain and the bare aiohttp client's CPU a request.
AGAINST_REV ?= dd66c22
engine-cpu-bench: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m bench.against --rev $(AGAINST_REV) --concurrency 128 --rounds 3 $(BENCH_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

type: $(VENV)/.installed
	$(VENV)/bin/mypy

# The wheel a project installs until the package is published (README, "Install the package"): pip only,
# no venv of this checkout's needed.
PYTHON ?= python3
.PHONY: dist
dist:
	rm -rf dist && $(PYTHON) -m pip wheel -q --no-deps --wheel-dir dist .

# A release as a user installs it (scripts/release_check.py): __version__, CHANGELOG.md's top release and
# docs/upgrading.md's release table agree, and its last migration is the newest; the sdist and the wheel
# build into dist/ and pass twine check; a fresh virtualenv with the wheel runs the example project's
# check, migrate and one send on a throwaway database of the local server (DATABASE_URL).
release-check: $(VENV)/.installed
	bash scripts/ensure-postgres
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) scripts/release_check.py $(RELEASE_CHECK_ARGS)

package: release-check

# Every tox environment; the pyenv interpreters (3.12, 3.13), when present, are put on PATH.
PYENV_BINS := $(shell ls -d $$HOME/.pyenv/versions/3.1[123]*/bin 2>/dev/null | tr '\n' ':')
tox: $(VENV)/.installed
	bash scripts/ensure-postgres
	PATH="$(PYENV_BINS)$$PATH" DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(VENV)/bin/tox $(TOX_ARGS)

# Never deletes .pgdata under a running server: it is stopped first, or clean refuses.
clean: demo-stop
	@if [ -f .pgdata/postmaster.pid ] && kill -0 "$$(head -n 1 .pgdata/postmaster.pid)" 2>/dev/null; then \
		echo "a PostgreSQL server still runs in .pgdata: stop it first (make demo-stop)" >&2; exit 1; fi
	rm -rf $(VENV) .pgdata build dist *.egg-info
