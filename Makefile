# Two entry points on a fresh machine: `make run` (the broker on embedded defaults) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test suite lint bench clean debian-packages sanitize beside pure-python

# STRATALOG_BUILD_STRICT: the compiled core's warnings are errors and a failed build stops here, so a tree
# that is run or tested never falls back to the Python twins unnoticed (setup.py).
export STRATALOG_BUILD_STRICT := 1

# Python keeps its compiled bytecode (__pycache__/, ignored by git) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE, as this machine's does): without the cache every process compiles the sources it
# imports again, and the suite starts hundreds (brokers, clients, CLI runs, three workers that each collect
# every test module). Collecting the suite took 18.4 s of CPU without it and 5.9 s with it.
unexport PYTHONDONTWRITEBYTECODE

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 'setuptools>=77'
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

# The compiled core (src/native/), built in place beside the Python package, again whenever its sources
# change; then checked to load.
NATIVE := $(VENV)/.native
$(NATIVE): $(STAMP) setup.py $(wildcard src/native/*.c src/native/*.h)
	$(BIN)/python setup.py --quiet build_ext --inplace
	$(BIN)/python -c "from stratalog.native import core, native_crc; assert native_crc is not None, core()"
	touch $(NATIVE)

run: $(NATIVE)
	$(BIN)/stratalog serve --data-dir data --listen 127.0.0.1:9092 --metrics-listen 127.0.0.1:0 \
		--console 127.0.0.1:0

lint: $(NATIVE)
	$(BIN)/ruff check src tests
	$(BIN)/mypy

# Debian packages the tests need: PostgreSQL's server (the tests start servers of their own on 127.0.0.1
# from its binaries) and chromium with its driver (the web console's tests drive it headless).
POSTGRES_SERVER := $(firstword $(wildcard /usr/lib/postgresql/*/bin/postgres))
DEBIAN_NEEDED := $(strip $(if $(POSTGRES_SERVER),,postgresql) $(if $(wildcard /usr/bin/chromium),,chromium) \
	$(if $(wildcard /usr/bin/chromedriver),,chromium-driver))

debian-packages:
ifneq ($(DEBIAN_NEEDED),)
	@if [ "$$(id -u)" != 0 ]; then echo "the tests need Debian's $(DEBIAN_NEEDED): apt-get install them (as root)"; exit 1; fi
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(DEBIAN_NEEDED)
endif

# The suite, and beside it the sanitizer run then the parsers' and queue store's tests on the Python twins:
# the sanitizer's tests keep one core busy for minutes, and the suite's workers wait on servers, leases and
# timers much of the time, so together they end sooner than one after the other. What runs beside goes to
# build/beside.log, shown when it ends (whole if it failed); either lane failing fails the target.
test: lint debian-packages
	$(MAKE) --no-print-directory -j2 beside suite

beside: $(STAMP)
	@mkdir -p build
	@if { $(MAKE) --no-print-directory sanitize && $(MAKE) --no-print-directory pure-python; } \
	  > build/beside.log 2>&1; then \
	  echo "sanitize and pure-python passed (build/beside.log):"; tail -n 12 build/beside.log; \
	else cat build/beside.log; echo "sanitize or pure-python FAILED (build/beside.log)"; exit 1; fi

# WORKERS on two cores (much of the suite waits on servers, leases and timers), each module's tests on one
# of them, so its module-scoped servers start once; tests/schedulekit.py says which goes where.
WORKERS ?= 3
suite: $(NATIVE)
	$(BIN)/pytest -n $(WORKERS) --dist loadscope

pure-python: $(STAMP)
	STRATALOG_PURE_PYTHON=1 $(BIN)/pytest -q -p no:randomly -p no:cacheprovider $(PARSER_TESTS) $(QUEUE_STORE_TESTS)

# The parsers' tests on the Python twins too (STRATALOG_PURE_PYTHON), as a machine without a compiler runs.
PARSER_TESTS := tests/test_kafka_record_check.py tests/test_kafka_records.py tests/test_kafka_fetch_response.py \
	tests/test_kafka_produce_response.py tests/test_record_index.py tests/test_kafka_array_bounds.py \
	tests/test_kafka_produce_request.py
# ... and the queue store's, whose puts, drains, uploads, merges and reads each have a compiled core: the
# store against its model, crash and recovery sequences, kill -9, faults and bounds, on the twins alone.
QUEUE_STORE_TESTS := tests/test_queue_store.py tests/test_queue_stateful.py tests/test_queue_recovery.py \
	tests/test_queue_kill9.py tests/test_queue_faults.py tests/test_queue_limits.py tests/test_queue_full_disk.py

# The compiled core under AddressSanitizer and UndefinedBehaviorSanitizer: built apart (build/sanitize) and
# loaded by the interpreter with gcc's sanitizer runtimes preloaded and Python's own allocator off
# (PYTHONMALLOC=malloc, so every buffer a test hands the core has ASan's red zones around it); then the
# twin tests (a quarter of each property's examples: tests/examples.py says why) and the fuzz targets
# that reach native code. Any report stops the run. (gcc's runtime takes
# over libFuzzer's coverage hooks, so here the fuzz targets mutate their seeds unguided; test_fuzz.py runs
# the same targets coverage-guided on the unsanitized build.)
SANITIZED := build/sanitize
sanitize: $(STAMP)
	rm -rf $(SANITIZED) && mkdir -p $(SANITIZED)
	cp -r setup.py pyproject.toml README.md src $(SANITIZED)/
	find $(SANITIZED)/src -name '*.so' -delete
	cd $(SANITIZED) && STRATALOG_SANITIZE=1 $(abspath $(BIN))/python setup.py --quiet build_ext --inplace
	export LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
	  PYTHONMALLOC=malloc STRATALOG_TEST_EXAMPLES_SHARE=0.25 ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  PYTHONPATH=$(SANITIZED)/src; \
	$(BIN)/python -c "from stratalog.native import native; assert native is not None and native.__file__.startswith('$(abspath $(SANITIZED))'), native" && \
	$(BIN)/pytest -q -p no:randomly -p no:cacheprovider tests/test_native_twins.py tests/test_kafka_record_check.py tests/test_record_index.py \
	  tests/test_block_io.py tests/test_queue_putter.py tests/test_queue_cached_reads.py tests/test_kafka_produce_request.py \
	  tests/test_queue_names.py tests/test_record_sort.py tests/test_queue_format.py tests/test_queue_index.py \
	  tests/test_wal_place_record.py \
	  tests/test_queue_compaction.py::test_the_compiled_join_merges_as_its_twin \
	  tests/test_queue_compaction.py::test_the_compiled_join_refuses_runs_that_do_not_fit \
	  tests/test_queue_compaction.py::test_the_compiled_join_fills_exactly_the_room_it_is_given \
	  tests/test_queue_compaction.py::test_the_compiled_join_joins_each_streams_runs_in_source_order \
	  tests/test_queue_compaction.py::test_the_compiled_join_leaves_a_run_whose_last_end_is_not_its_length_to_the_caller && \
	$(BIN)/stratalog chaos fuzz --seconds 15 --runs 100000 --target native_record_walk --target kafka_record_check \
	  --target native_record_index --target native_array_counts --target native_run_read \
	  --target native_produce_request \
	  --findings-dir $(SANITIZED)/findings

bench: $(STAMP)
	$(BIN)/stratalog bench wal --json bench-wal.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis build src/stratalog/*.so
