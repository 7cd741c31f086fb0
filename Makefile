# One command each: make demo, make test, make lint, make bench, make chaos.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint bench demo chaos clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,lint,langgraph]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

# The seeded chaos suite: SEEDS runs (default 200) from seed SEED (default 1); a failed
# run prints `make chaos SEED=s`, which replays that one schedule.
SEED ?=
SEEDS ?= $(if $(SEED),1,200)
chaos: $(STAMP)
	$(BIN)/python -m chaos --seeds $(SEEDS) --seed $(or $(SEED),1)

# A planner, a coder and a reviewer fix a bug through a killed worker and a rollback.
demo: $(STAMP)
	$(BIN)/cairn demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
