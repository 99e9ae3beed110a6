# The README's commands. Each creates .venv if it is missing and installs what this platform
# needs: plain mlx on macOS, MLX's CPU build elsewhere (set MLX_EXTRA=cuda for CUDA). `make test`
# also provides PostgreSQL, Redis and Chromium (.ci/services: started, or installed as root with
# apt-get, or one line saying what to provide).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UNAME := $(shell uname -s)
ifeq ($(UNAME),Darwin)
MLX_EXTRA ?=
else
MLX_EXTRA ?= cpu
endif
comma := ,
EXTRAS := worker,server,test$(if $(MLX_EXTRA),$(comma)$(MLX_EXTRA),)

.PHONY: demo test timing install lint services clean

# uv resolves and installs the project's ~150 distributions in seconds where pip takes minutes;
# it is installed into the venv itself, so nothing outside .venv changes. Bytecode is compiled
# at install (the dependencies by uv, the project's own packages by compileall): where
# PYTHONDONTWRITEBYTECODE is set Python never writes it, and every process (a server, a Celery
# worker, an agent, each variant process) would compile transformers, mlx-lm and the rest again
# as it starts.
$(BIN)/coldbench: pyproject.toml Makefile
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "uv>=0.5"
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e ".[$(EXTRAS)]"
	$(BIN)/python -m compileall -q -j 0 -x '/[.]|/tests/|/benchmarks/' .
	touch $(BIN)/coldbench

install: $(BIN)/coldbench

demo: install
	$(BIN)/coldbench demo

services:
	.ci/services

# Four pytest workers (pytest-xdist) on a 2-core machine: most of the suite's time is real
# processes starting and waiting (servers, Celery, agents, variant processes loading mlx-lm), so
# more workers than cores fill the time that fewer leave idle (docs/TESTING.md, "How long it
# takes"). Each worker starts on its share of the tests in order and then takes from the others'
# rest. Each worker's session has its own databases, Redis key prefixes, ports, temporary
# folders and host lock (tests/conftest.py).
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 4

test: install services
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not timing"

# Tests marked `timing` assert a speed difference of this CPU's own arithmetic (1-token
# chunks against one 128-token chunk, in an A/B and in `coldbench calibrate`): another
# process's load can drown it, so they are not part of `make test`. Run them alone, on a
# machine with nothing else to do. (Planted waits, which load cannot drown, are in `make test`.)
timing: install services
	$(BIN)/python -m pytest -q -n 0 -m timing

# Style, the import rules of the package docstrings (pyproject.toml's import-linter contracts)
# and types of evidence/ and engine/.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .coldbench
