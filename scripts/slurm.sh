#!/usr/bin/env bash
# A throw-away single-machine Slurm cluster for the adapter's integration tests.
#
#   scripts/slurm.sh up       install slurm-wlm + munge if needed, start munged, slurmctld and
#                             one `slurmd -N nodeXXX` per node, wait for idle, print exports
#   scripts/slurm.sh down     stop what `up` started (by pid file); safe to run twice
#   scripts/slurm.sh status   what is running, and sinfo
#
#   eval "$(scripts/slurm.sh up)"      # sets SLURM_CONF for the Slurm CLIs and the tests
#
# Environment: TRAINMEDIC_SLURM_DIR (state dir, default /var/tmp/trainmedic-slurm),
# TRAINMEDIC_SLURM_NODES (default 4), TRAINMEDIC_SLURM_PORT (slurmctld port, default 16817;
# node i listens on PORT+i), TRAINMEDIC_SLURM_WAIT_S (default 60).
#
# Everything lives under the state dir, munge included (own key and socket), so nothing
# system-wide is touched and several state dirs on distinct ports can coexist. Only stdout
# carries the export lines; progress goes to stderr so `eval "$(... up)"` is safe.
set -euo pipefail

DIR="${TRAINMEDIC_SLURM_DIR:-/var/tmp/trainmedic-slurm}"
NODES="${TRAINMEDIC_SLURM_NODES:-4}"
PORT="${TRAINMEDIC_SLURM_PORT:-16817}"
WAIT_S="${TRAINMEDIC_SLURM_WAIT_S:-60}"
CONF="$DIR/slurm.conf"
export SLURM_CONF="$CONF"

LOG_TAG=slurm.sh
# shellcheck source=scripts/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=scripts/lib/slurm.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/slurm.sh"

[[ "$NODES" =~ ^[0-9]+$ && "$NODES" -ge 1 && "$NODES" -le 999 ]] || die "TRAINMEDIC_SLURM_NODES=$NODES: want 1..999"
[[ "$PORT" =~ ^[0-9]+$ && "$PORT" -ge 1024 && $((PORT + NODES)) -le 65535 ]] || die "TRAINMEDIC_SLURM_PORT=$PORT: out of range"
[[ "$WAIT_S" =~ ^[0-9]+$ ]] || die "TRAINMEDIC_SLURM_WAIT_S=$WAIT_S: want seconds"

node_names() {
    local i
    for ((i = 1; i <= NODES; i++)); do printf 'node%03d\n' "$i"; done
}

# Every node is a `slurmd -N` on this host, each on its own port.
write_conf() {
    local i=0 name
    slurm_write_conf "$DIR" trainmedic localhost "$PORT" < <(
        echo "MessageTimeout=10"
        echo "SlurmdTimeout=300"
        echo "MinJobAge=300"
        while read -r name; do
            i=$((i + 1))
            echo "NodeName=$name NodeHostname=localhost Port=$((PORT + i)) CPUs=1 RealMemory=1000 State=UNKNOWN"
        done < <(node_names)
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    )
    while read -r name; do mkdir -p "$DIR/spool/$name"; done < <(node_names)
}

cmd_up() {
    local t0=$SECONDS name
    slurm_install
    if ! slurm_ctld_running "$DIR"; then
        # A fresh controller gets fresh state: job ids restart at 1, so old node drains,
        # spool files and job-completion records would otherwise alias new jobs.
        rm -rf "$DIR/state" "$DIR/spool" "$DIR/db/data"
        write_conf
    fi
    slurm_start_munge "$DIR"
    slurm_start_accounting "$DIR" trainmedic "$PORT"
    slurm_start_ctld "$DIR"
    while read -r name; do
        pid_alive "$DIR/run/slurmd-$name.pid" slurmd && continue
        slurmd -N "$name" -f "$CONF" || die "slurmd -N $name did not start; see $DIR/log/slurmd-$name.log"
        log "started slurmd $name"
    done < <(node_names)
    slurm_wait_idle "$DIR" "$NODES" "$WAIT_S"
    log "cluster up: $NODES nodes idle ($((SECONDS - t0)) s)"
    echo "export SLURM_CONF=$CONF"
    echo "export TRAINMEDIC_SLURM_DIR=$DIR"
}

cmd_down() {
    slurm_stop "$DIR"
    log "down"
}

cmd_status() {
    local name rc=0
    report() {
        if pid_alive "$1" "$2"; then echo "$3: running (pid $(cat "$1" 2>/dev/null))"; else
            echo "$3: stopped"
            rc=1
        fi
    }
    report "$DIR/run/munged.pid" munged munged
    report "$DIR/run/mariadbd.pid" mariadbd mariadbd
    report "$DIR/run/slurmdbd.pid" slurmdbd slurmdbd
    report "$DIR/run/slurmctld.pid" slurmctld slurmctld
    while read -r name; do report "$DIR/run/slurmd-$name.pid" slurmd "slurmd $name"; done < <(node_names)
    if ((rc == 0)); then sinfo -N -o '%N %T %E' || rc=1; fi
    return "$rc"
}

run_command "up down status" "$@"
