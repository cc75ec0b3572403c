# `make demo` and `make test` both start by building .venv, so either works on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kiln-installed
# Python's bytecode cache stays on for kiln's own commands even where the environment turns it off
# (PYTHONDONTWRITEBYTECODE): without it every process the suite starts compiles kiln's modules again,
# and every pytest worker rewrites every test module again.
RUN := env -u PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test test-fast clean

setup: $(STAMP)

# torch 2.13.0 (CPU) is installed first where torch is missing: the project's range admits it,
# so the editable install below pulls no other torch build. --no-compile: the modules kiln imports are
# compiled on first import instead (RUN below), not the tens of thousands it never does (half the setup time).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet --no-compile torch==2.13.0
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(RUN) $(BIN)/kiln demo --recipe demo

# One pytest worker per core; tests/conftest.py says how they share the machine.
test: $(STAMP)
	$(RUN) $(BIN)/python -m pytest -q -n auto --dist loadgroup --durations=15 tests

# The edit loop: everything but the tests marked slow (end-to-end runs, launched processes, Ray).
test-fast: $(STAMP)
	$(RUN) $(BIN)/python -m pytest -q -n auto --dist loadgroup -m "not slow" tests

clean:
	rm -rf runs $(VENV)
