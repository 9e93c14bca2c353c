#!/usr/bin/env bash
# Slurm PrologSlurmctld: a pre-flight check of a job's nodes before it starts.
#
#   slurm.conf:  PrologSlurmctld=/opt/trainmedic/scripts/slurm/prolog_slurmctld.sh
#
# Exit 0 lets the job start. Unfit nodes (a lost GPU, uncorrectable ECC, a hot or throttled
# GPU, a hardware Xid in the last day) are drained by the preflight runbook under the site's
# policy and the prolog fails, so Slurm requeues the job onto other nodes. The check has a
# time budget: when trainmedic itself is slow or away (timeout, server down) the job starts
# anyway, with a line in slurmctld's log: a health check must never stop the whole cluster.
set -uo pipefail
budget=${TRAINMEDIC_PREFLIGHT_BUDGET_S:-30}
trainmedic=${TRAINMEDIC_BIN:-$(dirname "${BASH_SOURCE[0]}")/../../.venv/bin/trainmedic}
nodes=${SLURM_JOB_NODELIST:-}
if [[ -z $nodes ]]; then
    echo "trainmedic prolog: no SLURM_JOB_NODELIST; nothing checked" >&2
    exit 0
fi
extra=()
[[ ${TRAINMEDIC_PREFLIGHT_PAIR_TEST:-0} == 1 ]] && extra+=(--pair-test)
timeout --kill-after=5 "$budget" "$trainmedic" preflight --drain "${extra[@]}" "$nodes"
rc=$?
case $rc in
0) exit 0 ;;
4)
    echo "trainmedic prolog: job ${SLURM_JOB_ID:-?}: unfit nodes in $nodes; requeue" >&2
    exit 1
    ;;
124 | 137)
    echo "trainmedic prolog: job ${SLURM_JOB_ID:-?}: check over its ${budget} s budget; starting" >&2
    exit 0
    ;;
*)
    echo "trainmedic prolog: job ${SLURM_JOB_ID:-?}: check failed (exit $rc); starting" >&2
    exit 0
    ;;
esac
