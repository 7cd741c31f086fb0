# One command each: make demo, make test, make lint, make bench, make chaos.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# What a target needs from the system (redis-server, chromium, ...): found, installed as
# root on Debian/Ubuntu, else one line naming what is missing and how to install it.
SYSTEM_DEPS := scripts/system-deps
# setuptools warns, in a 10-line box on every editable install, that a folder named like the
# package may shadow it: true of any checkout, and nothing a user can act on.
QUIET_EDITABLE := PYTHONWARNINGS='ignore:Editable installation'

.PHONY: install test lint bench demo chaos soak clean system-test system-demo system-bench system-chaos

system-test system-demo system-bench system-chaos:
	@sh $(SYSTEM_DEPS) $(@:system-%=%)

$(STAMP): pyproject.toml constraints.txt
	@PYTHON='$(PYTHON)' sh $(SYSTEM_DEPS) venv
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -c constraints.txt -e '.[test,lint,langgraph,mcp,console]'
	touch $(STAMP)

# The `bench` extra (DBOS, the peer part's contestant) on top, for `make bench` only. If it
# cannot be installed (no network), the bench still runs and the peer part says why.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP)
	@if $(QUIET_EDITABLE) $(BIN)/pip install --quiet -c constraints.txt -e '.[bench]'; then touch $(BENCH_STAMP); \
	else echo "make: the bench extra (DBOS) did not install; the peer part will say why" >&2; fi

# LangGraph's own tests, which tests/test_langgraph_suite.py runs on CairnSaver: PyPI's wheel
# has none, so this unpacks those of the installed langgraph's sdist (pip download, once per
# version) in $(VENV)/langgraph-suite/. Tests never download.
LANGGRAPH_SUITE := $(VENV)/.installed-langgraph-suite
$(LANGGRAPH_SUITE): $(STAMP)
	$(BIN)/python -m tests.langgraph_suite fetch
	touch $(LANGGRAPH_SUITE)

# What tests/test_wheel.py installs offline into a fresh virtualenv beside Cairn's wheel:
# Cairn's dependencies, a setuptools to build it, openai-agents (tests/wheelhouse.py).
WHEELHOUSE := $(VENV)/.installed-wheelhouse
$(WHEELHOUSE): $(STAMP) tests/wheelhouse.py
	$(BIN)/python -m tests.wheelhouse
	touch $(WHEELHOUSE)

install: $(STAMP) $(LANGGRAPH_SUITE) $(WHEELHOUSE)

# The npm MCP servers tests/test_mcp_servers.py runs, at these versions, in $(NPM_MCP): installed
# again only when the pins change; without npm (scripts/system-deps installs it) it says so and
# the tests that need them skip (outside CI).
NPM_MCP := $(VENV)/npm-mcp
NPM_MCP_PACKAGES := @modelcontextprotocol/server-filesystem@2026.8.31 \
	@modelcontextprotocol/server-everything@2026.8.31
.PHONY: npm-mcp
npm-mcp:
	@if ! command -v npm >/dev/null 2>&1; then \
		echo "make: no npm, so no npm MCP servers: their tests in tests/test_mcp_servers.py skip" >&2; \
	elif [ "$$(cat $(NPM_MCP)/.installed 2>/dev/null)" != "$(NPM_MCP_PACKAGES)" ]; then \
		npm install --prefix $(NPM_MCP) --save-exact --no-audit --no-fund --loglevel=error $(NPM_MCP_PACKAGES) \
		&& echo "$(NPM_MCP_PACKAGES)" > $(NPM_MCP)/.installed; fi

# Three processes on two cores: most tests wait on the processes they start, not the CPU.
# Each test file runs whole on one (its module's Redis and workers started once).
test: system-test $(STAMP) npm-mcp $(LANGGRAPH_SUITE) $(WHEELHOUSE)
	$(BIN)/pytest -n 3 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Every part, or PARTS="storage coordinator"; QUICK=1: small sizes (CI), fails only on a
# crash; JSON=1: each target as a JSON line on stdout (and nothing else), tables on stderr.
PARTS ?=
bench: system-bench $(STAMP) $(BENCH_STAMP)
	$(if $(filter 1,$(JSON)),@)$(BIN)/python -m bench $(if $(filter 1,$(QUICK)),--quick) \
		$(if $(filter 1,$(JSON)),--json) $(PARTS)

# The seeded chaos suite: SEEDS runs (default 200) from seed SEED (default 1); a failed
# run prints `make chaos SEED=s`, which replays that one schedule.
SEED ?=
SEEDS ?= $(if $(SEED),1,200)
chaos: system-chaos $(STAMP)
	$(BIN)/python -m chaos --seeds $(SEEDS) --seed $(or $(SEED),1)

# The soak (docs/testing.md): tasks back to back under a fault a minute, a table a minute
# (Redis memory and keys, RSS, descriptors, archive, steps/s); exits 1 on a failed
# criterion. SOAK_MINUTES (default 20) sets how long.
SOAK_MINUTES ?= 20
soak: system-bench $(STAMP)
	$(BIN)/python -m bench.soak --minutes $(SOAK_MINUTES)

# The mutation check (docs/testing.md): each critical check, broken on purpose in a scratch
# copy, must fail a test. MUTANTS="name ..." runs some; not part of `make test` or CI.
.PHONY: mutants
mutants: system-test $(STAMP)
	$(BIN)/python -m tests.mutants $(MUTANTS)

# A planner, a coder and a reviewer fix a bug through a killed worker and a rollback.
demo: system-demo $(STAMP)
	$(BIN)/cairn demo

# docker-compose.yml's secrets, fresh from `secrets`, in .env (mode 0600, never committed):
# the Redis password, the signing key and the console's token. An existing .env is kept
# as it is (set -C: the shell will not write over one), so this is safe to run again.
COMPOSE_SECRETS := CAIRN_REDIS_PASSWORD CAIRN_SIGNING_KEY CAIRN_CONSOLE_TOKEN
SECRET_LINES := import secrets, sys; [print(f"{n}={secrets.token_hex(32)}") for n in sys.argv[1:]]
.PHONY: compose-env
compose-env:
	@if [ -e .env ]; then echo "make: .env exists, left as it is (remove it for new secrets)" >&2; \
	else values=$$($(PYTHON) -c '$(SECRET_LINES)' $(COMPOSE_SECRETS)) \
	&& (umask 077 && set -C && printf '%s\n' \
		"# docker-compose.yml's secrets, made by make compose-env: keep private, never commit" \
		"$$values" > .env) && echo "make: wrote .env (mode 0600) for docker-compose.yml" >&2; fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
