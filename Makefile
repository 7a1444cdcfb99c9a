# The two commands of the README: `make demo` and `make test`.
# `make test` runs the suite in SERVEHALL_TEST_WORKERS parallel pytest processes (default 2;
# most end-to-end tests wait on servers more than they compute). --dist loadfile keeps a
# module's tests in one process, so its shared servers start once. Tests marked `serial`
# (they saturate the CPU or judge heartbeats in tenths of a second) run afterwards, alone.
.PHONY: install dev demo test lint services-stop

install:
	scripts/install.sh

dev:
	scripts/install.sh --dev

demo: install
	.venv/bin/servehall db upgrade
	.venv/bin/servehall serve --demo

test: dev lint
	.ci/services.sh
	@echo "PostgreSQL for the tests runs on 127.0.0.1:$${SERVEHALL_PG_PORT:-55432} and stays up after the tests (the next make test reuses it); stop it with: make services-stop"
	cache=$$(mktemp -d -t servehall-test-cache-XXXXXX); export SERVEHALL_TEST_CACHE_DIR=$$cache; \
	.venv/bin/python -m pytest -q -n $${SERVEHALL_TEST_WORKERS:-2} --dist loadfile -m "not serial"; \
	rc=$$?; .venv/bin/python -m pytest -q -m serial || rc=1; rm -rf "$$cache"; exit $$rc

# Stop what `make test` started (PostgreSQL); data is kept for the next run.
services-stop:
	.ci/services-stop.sh

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy core/src plugins/*/src examples/*/src
