# Shared by the scripts in scripts/: logging, daemons by pid file, Debian packages.
# Source it after setting LOG_TAG (the script's name, prefixed to every message on stderr).
# shellcheck shell=bash

log() { printf '%s: %s\n' "${LOG_TAG:-trainmedic}" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# Alive and really the daemon we started: a stale pid file must not make us signal whatever
# process got the pid afterwards. An exited daemon not yet reaped (a zombie) is not alive.
proc_alive() {
    local pid=$1 comm=$2 stat
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$comm"* ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ "${stat:0:1}" != Z ]]
}

pid_alive() {
    local pidfile=$1 comm=$2 pid
    # Daemons remove their own pid file on exit, so it may vanish between test and read.
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    proc_alive "$pid" "$comm"
}

# Stop by pid file, then by that pid (daemons remove their pid file before they are gone):
# SIGTERM, 10 s grace, SIGKILL. Safe to call when nothing runs.
stop_pid() {
    local pidfile=$1 comm=$2 pid i
    if pid_alive "$pidfile" "$comm"; then
        pid=$(cat "$pidfile" 2>/dev/null) || return 0
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do
            proc_alive "$pid" "$comm" || break
            sleep 0.1
        done
        if proc_alive "$pid" "$comm"; then
            log "$comm (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
}

# apt_install PACKAGE...: install Debian packages (root + apt-get), refreshing the package
# lists only when the first try cannot find them. A fresh machine has none of them: every
# package a tier needs is installed here, never by hand. The packages' own services (the
# system sshd, PostgreSQL cluster, slurmctld...) are not started: the scripts start their own.
apt_install() {
    local started=$SECONDS added_policy=0 rc=0
    command -v apt-get >/dev/null 2>&1 || die "need $*, and there is no apt-get to install them"
    [[ $(id -u) == 0 ]] || die "need $*: installing them takes root"
    log "installing $* (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        added_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "$@" >/dev/null; } ||
        rc=$?
    if ((added_policy)); then rm -f /usr/sbin/policy-rc.d; fi
    ((rc == 0)) || die "apt-get install $* failed (rc=$rc)"
    log "installed $* in $((SECONDS - started)) s"
}

# run_command "CMD..." ARGS...: the script's entry point: cmd_<ARGS[0]> with the rest of the
# arguments when it is one of CMD, else a usage line and exit 2.
run_command() {
    local commands=$1 cmd=${2:-}
    shift 2 || shift $#
    if [[ -n $cmd && " $commands " == *" $cmd "* ]]; then
        "cmd_$cmd" "$@"
    else
        echo "usage: $0 ${commands// /|}" >&2
        exit 2
    fi
}

# need_commands "CMD..." PACKAGE...: install the packages unless every command is there.
need_commands() {
    local cmds=$1 cmd
    shift
    for cmd in $cmds; do
        command -v "$cmd" >/dev/null 2>&1 || [[ -x /usr/sbin/$cmd ]] || {
            apt_install "$@"
            return 0
        }
    done
}
