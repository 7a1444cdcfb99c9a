# The two commands of the README: `make demo` and `make test`.
.PHONY: install dev demo test lint

install:
	scripts/install.sh

dev:
	scripts/install.sh --dev

demo: install
	.venv/bin/servehall db upgrade
	.venv/bin/servehall serve --demo

test: dev lint
	.ci/services.sh
	.venv/bin/python -m pytest -q

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy core/src plugins/*/src examples/*/src
