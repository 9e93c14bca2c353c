#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv).
#
#   scripts/bootstrap.sh [EXTRAS]    EXTRAS: the pyproject extras to install, default "test";
#                                    the test command asks for "test,testbed" (torch, CPU, for
#                                    the real-cluster tier's allgather)
#
# Idempotent: does nothing when pyproject.toml and the extras are what the last run installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "bootstrap: Python >= 3.11 is required (found: $("$python" --version 2>&1))" >&2
    exit 2
fi
extras=${1:-test}
[[ $extras =~ ^[a-z,]+$ ]] || { echo "bootstrap: EXTRAS=$extras: want names like test,testbed" >&2; exit 2; }
stamp=.venv/.trainmedic-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $extras"
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
    exit 0
fi
echo "bootstrap: installing into .venv (first run takes a minute or two) ..." >&2
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]" 2>&1 \
    | grep -v "^WARNING: Location" >&2 || true
check='import trainmedic, prefect, ansible_runner'
[[ ,$extras, == *,testbed,* ]] && check+=', torch'
.venv/bin/python -c "$check" || { echo "bootstrap: installation failed" >&2; exit 1; }
echo "$want" > "$stamp"
