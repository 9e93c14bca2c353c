#!/usr/bin/env bash
# The real-cluster integration tier (what CI calls): bring the one-machine testbed up
# (scripts/testbed.sh: namespaces + sshd + Slurm), run `pytest -m integration tests/integration`,
# and ALWAYS bring it down again. Exits with pytest's status (non-zero on any failure or when the
# testbed cannot come up); exits 0 with a message, running nothing, where this machine cannot
# host a testbed (not root, no `ip netns`). Extra arguments go to pytest.
#
# The venv gets the `testbed` extra (torch, CPU) from scripts/bootstrap.sh, not mid-run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PWD/.venv/bin:$PATH"

skip() {
    echo "integration: skipped: $*"
    exit 0
}
[[ $(id -u) == 0 ]] || skip "not root (network namespaces need root)"
command -v ip >/dev/null 2>&1 || skip "no ip command (iproute2)"
ip netns list >/dev/null 2>&1 || skip "ip netns is not usable on this machine"
probe="tmtb-probe-$$"
if ! ip netns add "$probe" 2>/dev/null; then skip "cannot create a network namespace here"; fi
ip netns del "$probe"
bash scripts/bootstrap.sh test,testbed

t0=$SECONDS
# shellcheck disable=SC2317  # run by the EXIT trap
down() {
    bash scripts/testbed.sh down || echo "integration: testbed down FAILED: clean up by hand" >&2
}
trap down EXIT
up_env=$(bash scripts/testbed.sh up)
eval "$up_env"
echo "integration: testbed up ($((SECONDS - t0)) s)"
# The pair test runs the checkout's scripts/gloo_allgather.py as the testbed's unprivileged
# user: a checkout it cannot read (one under a 0700 `mktemp -d`) fails every allgather with
# Python's exit 2 and no message. Say so once instead.
if ! runuser -u "${TRAINMEDIC_TESTBED_USER:-trainmedic}" -- test -r scripts/gloo_allgather.py; then
    echo "integration: the testbed user cannot read $PWD/scripts (a 0700 parent directory?):" \
        "chmod o+rx the checkout's directories" >&2
    exit 1
fi
rc=0
python -m pytest -m integration -p no:cacheprovider -rs tests/integration "$@" || rc=$?
echo "integration: pytest exit $rc after $((SECONDS - t0)) s"
exit "$rc"
