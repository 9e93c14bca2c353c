#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv) with everything the demo and the
# tests need. Idempotent: does nothing when pyproject.toml has not changed since the last run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "bootstrap: Python >= 3.11 is required (found: $("$python" --version 2>&1))" >&2
    exit 2
fi
stamp=.venv/.trainmedic-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    exit 0
fi
echo "bootstrap: installing into .venv (first run takes a minute or two) ..." >&2
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]' 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
.venv/bin/python -c 'import trainmedic, prefect, ansible_runner' \
    || { echo "bootstrap: installation failed" >&2; exit 1; }
echo "$want" > "$stamp"
