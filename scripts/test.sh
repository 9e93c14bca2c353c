#!/usr/bin/env bash
# The test suite, from a fresh machine: installs the venv, starts a real Slurm cluster when this
# machine can run one (root + apt), lints (ruff, ansible-lint production profile), runs pytest.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

slurm_env=$(mktemp)
cleanup() { [[ -n ${SLURM_CONF:-} ]] && bash scripts/slurm.sh down >/dev/null 2>&1 || true; rm -f "$slurm_env"; }
trap cleanup EXIT
if [[ ${TRAINMEDIC_SKIP_SLURM:-0} != 1 && $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    if bash scripts/slurm.sh up >"$slurm_env" 2>slurm-up.log; then
        # shellcheck disable=SC1090
        . "$slurm_env"
        echo "test: real Slurm cluster up (SLURM_CONF=$SLURM_CONF)"
    else
        echo "test: Slurm could not start here; its tests will skip (see slurm-up.log)" >&2
    fi
fi

echo "test: ruff"
ruff check .
echo "test: ansible-lint (production profile)"
ansible-lint -q playbooks/
echo "test: pytest"
python -m pytest -q -p no:cacheprovider "$@"
