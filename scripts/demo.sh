#!/usr/bin/env bash
# The demo: install (first run), start a local Prefect server + worker, create a simulated
# 16-node cluster, run a training job, inject an Xid 79 on one node and let the failure event
# trigger the triage runbook. Prints the run's UI link. `scripts/demo.sh --stop` tears down.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
exec .venv/bin/trainmedic demo "$@"
