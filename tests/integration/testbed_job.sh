#!/usr/bin/env bash
# The training command of the Slurm-on-testbed scenario (TRAINMEDIC_SLURM_COMMAND): what a
# launcher does on the batch host of a multi-node job, on CPUs. It runs the simulated trainer
# (per-rank logs, heartbeat, checkpoints: what the triage runbook reads and restarts from) and,
# like a launcher watching its workers, checks every node of the job over the testbed's SSH
# every 2 s. A node that stops answering ends the job: the launcher logs which node it lost,
# stops training and exits 1; if Slurm notices first, the job ends NODE_FAIL instead.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=${TRAINMEDIC_TESTBED_PYTHON:-$repo/.venv/bin/python}
testbed=${TRAINMEDIC_TESTBED_DIR:-/var/tmp/trainmedic-testbed}
# The nodes take SSH logins from the testbed's unprivileged user only, as production nodes do.
user=${TRAINMEDIC_TESTBED_USER:-trainmedic}
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

"$python" -m trainmedic.sim.job --job-dir "$TRAINMEDIC_JOB_DIR" \
    --checkpoint-dir "$TRAINMEDIC_CHECKPOINT_DIR" --nodes "$TRAINMEDIC_NODES" &
trainer=$!
trap 'kill -TERM "$trainer" 2>/dev/null; wait "$trainer"; exit 143' TERM INT

IFS=, read -r -a nodes <<<"$TRAINMEDIC_NODES"
while kill -0 "$trainer" 2>/dev/null; do
    for node in "${nodes[@]}"; do
        address=$(awk -v n="$node" '$1 == n {print $2}' "$testbed/hosts")
        if ! out=$(timeout 8 ssh -i "$testbed/id_ed25519" -o BatchMode=yes -o ConnectTimeout=3 \
            -o LogLevel=ERROR -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$testbed/known_hosts" \
            -o ControlMaster=no "$user@$address" true 2>&1); then
            echo "launcher: error: connection to node $node lost ($address: ${out:-no answer})" >&2
            kill -TERM "$trainer" 2>/dev/null
            wait "$trainer"
            exit 1
        fi
    done
    sleep 2 &
    wait $!
done
wait "$trainer"
