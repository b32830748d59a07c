# agentloop — the two commands: `make run` and `make test` (plus `make bench`, `make docs`).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000
export HOST PORT

.PHONY: run test bench docs test-sqlite test-postgres clean

$(VENV)/.installed: requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $@

# The test tools, with the product's packages when `make run` has not installed them yet:
# one pip run for both files, and no bytecode (pip compiles one file after another, 20 s
# of a fresh clone's setup; scripts/test.sh and scripts/bench.sh compile the venv on both
# cores, the tests beside their static checks).
$(VENV)/.installed-dev: requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -r requirements.txt -r requirements-dev.txt
	@touch $(VENV)/.installed $@

## make run: set everything up and run the product on SQLite (or DATABASE_URL).
## Production-shaped: DEBUG only when asked for (DEBUG=true make run).
run: $(VENV)/.installed
	AGENTLOOP_LOCAL_SECRET_KEY=true $(PY) manage.py bootstrap
	AGENTLOOP_LOCAL_SECRET_KEY=true exec $(PY) manage.py runall --host $(HOST) --port $(PORT)

## make test: ruff, import-linter, then the whole suite on SQLite and on PostgreSQL (a throwaway
## cluster when DATABASE_URL is not given): both passes at once, then the tests that
## time themselves (marked serial) alone.
test: $(VENV)/.installed-dev
	scripts/test.sh

## make bench: the benchmarks, each figure beside its same-run reference.
bench: $(VENV)/.installed-dev
	scripts/bench.sh

## make docs: the manual (docs/, mkdocs.yml) served at http://$(HOST):8001/, rebuilt on
## every edit. `make test` builds it strictly (scripts/docs.sh).
DOCS_PORT ?= 8001
docs: $(VENV)/.installed-dev
	$(PY) -m mkdocs serve -a $(HOST):$(DOCS_PORT)

clean:
	rm -rf var/test_* var/pg-*
