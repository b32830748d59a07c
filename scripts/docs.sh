#!/usr/bin/env bash
# The manual (docs/, mkdocs.yml) built strictly: any warning — a broken link or anchor,
# a page missing from the nav, a nav entry without its page — fails. Built into a
# temporary folder (removed after), so the check leaves nothing behind; `make docs`
# serves the site while you edit it. (Not --quiet: it hides the warnings from --strict.)
set -euo pipefail
cd "$(dirname "$0")/.."
# The configuration page is generated (agentloop/config_table.py): stale is a failure too.
.venv/bin/python scripts/config_docs.py --check
out=$(mktemp -d /tmp/agentloop-docs-XXXXXX)
trap 'rm -rf "$out"' EXIT
.venv/bin/python -m mkdocs build --strict --site-dir "$out" 2>&1 | { grep -v '^INFO ' || true; }

# README.md is not part of the site, but it is the front door: its relative links
# (into docs/, the screenshots) must point at files that exist.
.venv/bin/python - <<'PY'
import re, sys
from pathlib import Path
broken = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", Path("README.md").read_text())
          if "://" not in t and not Path(t).exists()]
if broken:
    sys.exit(f"README.md links to missing files: {', '.join(broken)}")
PY
