#!/usr/bin/env bash
# mypy (django-stubs) over the modules listed in mypy.ini's `files`: the bottom package,
# the pure core, the platform base class. Its cache is var/mypy-cache (mypy.ini; a cold
# run takes about 15 s of CPU, a warm one 2-3 s). Arguments go to mypy.
set -uo pipefail
cd "$(dirname "$0")/.."
# The django-stubs plugin imports the settings, which refuse to start without SECRET_KEY
# outside make run, DEBUG and the tests (a fresh clone has no var/secret_key yet). Type
# checking signs nothing, so a placeholder is enough; it never reaches a running process.
SECRET_KEY=${SECRET_KEY:-type-checking-only} exec .venv/bin/python -m mypy --config-file mypy.ini "$@"
