#!/usr/bin/env bash
# The Matrix tests' homeserver: matrix-synapse in a venv of its own (var/synapse-venv), from
# requirements-synapse.txt, so its many pins never meet the product's. Idempotent: a venv
# made from the same requirements is kept (a stamp holds their checksum). Prints the
# venv's python. Called by scripts/test.sh (before the suite) and by the tests themselves
# (tests/support/synapse.py) when run alone.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SYNAPSE_VENV:-var/synapse-venv}
want=$(sha256sum requirements-synapse.txt | cut -d' ' -f1)
mkdir -p "$(dirname "$venv")"
# One installer at a time: scripts/test.sh starts one before the suite, and a test
# module that needs Synapse may ask meanwhile (it waits here, then finds the venv made).
exec 9>"$venv.lock"
flock 9
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$want" ]; then
  python=$(command -v python3.11 || command -v python3)
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile -r requirements-synapse.txt >&2
  echo "$want" > "$venv/.installed"
fi
echo "$PWD/$venv/bin/python"
