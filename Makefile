# The two Quickstart commands: `make demo` (train + sample the GPT) and `make test` (the whole suite).
# Each bootstraps .venv itself, so they work on a fresh machine that has only Python and pip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m models.train

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
