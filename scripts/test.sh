#!/usr/bin/env bash
# The test suite, from a fresh machine: installs the venv, starts a real Slurm cluster and a
# PostgreSQL server (the e2e stack's second backend) and installs Chromium (the UI tests) when
# this machine can (root + apt), lints (ruff, ansible-lint production profile), runs pytest,
# then the real-cluster integration tier (scripts/integration.sh; skips where it cannot run).
# Exits non-zero on any failure. TRAINMEDIC_SKIP_SLURM / _SKIP_POSTGRES / _SKIP_UI=1 opt out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh test,testbed
export PATH="$PWD/.venv/bin:$PATH"

slurm_env=$(mktemp)
pg_env=$(mktemp)
# This run's own pytest temp root: pytest keeps a user's 3 newest runs under one root and
# deletes older ones, so another pytest of the same user (a developer's, a second CI) would
# delete this run's live directories.
export PYTEST_DEBUG_TEMPROOT
PYTEST_DEBUG_TEMPROOT=$(mktemp -d)
pg_started=0
logs="${TMPDIR:-/tmp}"
cleanup() {
    if [[ -n ${SLURM_CONF:-} ]]; then bash scripts/slurm.sh down >/dev/null 2>&1 || true; fi
    # Only a server this run started: one a developer had running stays up.
    if [[ $pg_started == 1 ]]; then bash scripts/postgres.sh down >/dev/null 2>&1 || true; fi
    rm -f "$slurm_env" "$pg_env"
    rm -rf "$PYTEST_DEBUG_TEMPROOT"
}
trap cleanup EXIT
can_install=0
[[ $(id -u) == 0 ]] && command -v apt-get >/dev/null && can_install=1
if [[ ${TRAINMEDIC_SKIP_SLURM:-0} != 1 && $can_install == 1 ]]; then
    if bash scripts/slurm.sh up >"$slurm_env" 2>slurm-up.log; then
        # shellcheck disable=SC1090
        . "$slurm_env"
        echo "test: real Slurm cluster up (SLURM_CONF=$SLURM_CONF)"
    else
        echo "test: Slurm could not start here; its tests will skip (see slurm-up.log)" >&2
    fi
fi

# A TRAINMEDIC_TEST_DATABASE_URL from outside (a developer's own server) is used as it is.
if [[ -z ${TRAINMEDIC_TEST_DATABASE_URL:-} && ${TRAINMEDIC_SKIP_POSTGRES:-0} != 1 && $can_install == 1 ]]; then
    bash scripts/postgres.sh status >/dev/null 2>&1 || pg_started=1
    if bash scripts/postgres.sh up >"$pg_env" 2>"$logs/trainmedic-postgres-up.log"; then
        # shellcheck disable=SC1090
        . "$pg_env"
        echo "test: PostgreSQL up ($TRAINMEDIC_TEST_DATABASE_URL)"
    else
        echo "test: PostgreSQL could not start here; its e2e tests will skip" \
            "(see $logs/trainmedic-postgres-up.log)" >&2
    fi
fi

if [[ ! -x /usr/bin/chromium && ${TRAINMEDIC_SKIP_UI:-0} != 1 && $can_install == 1 ]]; then
    # --no-install-recommends: ~10 s here instead of pulling fonts and desktop integration.
    install_chromium() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium; }
    if install_chromium >"$logs/trainmedic-chromium.log" 2>&1 ||
        { apt-get update -q && install_chromium; } >>"$logs/trainmedic-chromium.log" 2>&1; then
        echo "test: installed chromium for the UI tests"
    else
        echo "test: chromium could not be installed; the UI tests will skip" \
            "(see $logs/trainmedic-chromium.log)" >&2
    fi
fi

echo "test: ruff"
ruff check .
echo "test: ansible-lint (production profile)"
ansible-lint -q playbooks/
status=0
if [[ $# -gt 0 ]]; then
    echo "test: pytest $*"
    python -m pytest -q -p no:cacheprovider --durations=20 "$@" || status=$?
else
    # The whole suite as two pytest processes at once, one per core: most of its time is
    # spent waiting (simulated jobs, pair tests, servers), and one process after the other no
    # longer fits CI's 30 minutes on 2 cores. The halves share nothing: the real Slurm and
    # PostgreSQL serve only the second; each has its own Prefect servers and temp root. The
    # flow tier is the longest: unit+adapters+flows took 18 min beside e2e+slurm+ui's 9.
    run_half() {
        local name=$1
        shift
        python -m pytest -q -p no:cacheprovider --durations=15 \
            --basetemp="$PYTEST_DEBUG_TEMPROOT/$name" "$@" >"$PYTEST_DEBUG_TEMPROOT/pytest-$name.log" 2>&1
    }
    echo "test: pytest, two halves at once: unit+flows | adapters+e2e+slurm+ui"
    started=$SECONDS
    run_half core tests/unit tests/flows &
    core=$!
    run_half stack tests/adapters tests/e2e tests/slurm tests/ui &
    stack=$!
    core_status=0 stack_status=0
    wait "$core" || core_status=$?
    wait "$stack" || stack_status=$?
    for half in core stack; do
        echo "test: pytest, $half half:"
        cat "$PYTEST_DEBUG_TEMPROOT/pytest-$half.log"
    done
    echo "test: pytest exit core=$core_status stack=$stack_status after $((SECONDS - started)) s"
    if [[ $core_status != 0 || $stack_status != 0 ]]; then status=1; fi
fi

# The real-cluster tier brings up its own Slurm on the testbed: the first one goes first.
if [[ -n ${SLURM_CONF:-} ]]; then
    bash scripts/slurm.sh down >/dev/null 2>&1 || true
    unset SLURM_CONF
fi
if [[ ${TRAINMEDIC_SKIP_INTEGRATION:-0} != 1 ]]; then
    echo "test: integration tier (network namespaces, sshd, Slurm, gloo allgather)"
    bash scripts/integration.sh || status=$?
fi
exit "$status"
