# Two entry points on a fresh machine: `make run` (the broker on embedded defaults) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean postgres-server

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/stratalog serve --data-dir data --listen 127.0.0.1:9092

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# The tests start PostgreSQL servers of their own on 127.0.0.1, from the binaries of Debian's package.
POSTGRES_SERVER := $(firstword $(wildcard /usr/lib/postgresql/*/bin/postgres))

postgres-server:
ifeq ($(POSTGRES_SERVER),)
	@if [ "$$(id -u)" != 0 ]; then echo "the tests need PostgreSQL's server: apt-get install postgresql (as root)"; exit 1; fi
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql
endif

# Three workers on two cores (much of the suite waits on servers, leases and timers), each module's tests
# on one of them, so its module-scoped servers start once; tests/schedulekit.py says which goes where.
test: lint postgres-server
	$(BIN)/pytest -n 3 --dist loadscope

bench: $(STAMP)
	$(BIN)/stratalog bench wal --json bench-wal.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
