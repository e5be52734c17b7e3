# corral — developer entry points. `make test` is what CI runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test check lint typecheck run clean docs

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

# -n auto: one test process per core (pytest-xdist); each test has its own database, Redis
# namespace, ports and temporary directory, so they run side by side.
test: $(STAMP)
	$(BIN)/pytest -n auto $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

docs: $(STAMP)
	$(BIN)/corral states --mermaid --markdown > docs/lifecycles.md

run: $(STAMP)
	$(BIN)/corral up

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
