# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv, install torch (the CPU wheel, first and explicitly), then the
# project with pinned dependencies (constraints.txt), then run.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sparta-installed

.PHONY: demo test test-slow lint clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sparta-explore demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
