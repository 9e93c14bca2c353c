#!/usr/bin/env bash
# A real (small) cluster on one machine for the integration tier: N network namespaces
# tmtb-node001.. on one bridge, each with its own sshd (and, when Slurm is installable, its
# own slurmd), reached by Ansible over real SSH. No GPU: the GPU tools are stand-ins that say
# so; the pair test is a real two-host allgather (torch.distributed, gloo) between namespaces.
#
#   scripts/testbed.sh up                 create what is missing (idempotent), write
#                                         inventories/testbed/hosts.yml, print exports
#   scripts/testbed.sh down               remove everything `up` made, even after a failed
#                                         `up`: processes in the namespaces, sshd, Slurm,
#                                         veths, bridge, namespaces (their iptables/tc with
#                                         them), the generated inventory; safe to run twice
#   scripts/testbed.sh status             what exists, what answers; exit 1 if not all up
#   scripts/testbed.sh fault NODE KIND    KIND: linkdown (the node's veth down), slow (tc tbf
#                                         rate limit, both directions, 100mbit), unreachable (iptables
#                                         DROP of tcp/22 inside the node), clear (undo all)
#
#   eval "$(scripts/testbed.sh up)"       sets TRAINMEDIC_TESTBED_DIR and, with Slurm, SLURM_CONF
#
# Environment: TRAINMEDIC_TESTBED_NODES (default 4, 2..8), TRAINMEDIC_TESTBED_DIR (state,
# default /var/tmp/trainmedic-testbed), TRAINMEDIC_TESTBED_SUBNET (first three octets of a
# private /24 that exists ONLY on the testbed bridge, default 10.77.0), TRAINMEDIC_TESTBED_SLURM
# (auto: start Slurm when installed or installable; 1: must; 0: never), TRAINMEDIC_TESTBED_RATE
# (the `slow` fault's tbf rate, default 100mbit), TRAINMEDIC_TESTBED_SLURM_PORT (default 16917).
#
# Addresses: the bridge tmtb-br0 is SUBNET.1 (the controller side: Ansible, slurmctld), node i
# is SUBNET.(10+i) on its eth0. Namespaces get no default route, so nothing in them can send
# anywhere but the testbed's own /24. Only stdout carries the export lines; progress goes to
# stderr.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR="${TRAINMEDIC_TESTBED_DIR:-/var/tmp/trainmedic-testbed}"
NODES="${TRAINMEDIC_TESTBED_NODES:-4}"
SUBNET="${TRAINMEDIC_TESTBED_SUBNET:-10.77.0}"
WANT_SLURM="${TRAINMEDIC_TESTBED_SLURM:-auto}"
RATE="${TRAINMEDIC_TESTBED_RATE:-100mbit}"
SLURM_PORT="${TRAINMEDIC_TESTBED_SLURM_PORT:-16917}"
# Ansible logs in as this unprivileged user, as production does, with sudo for the one
# privileged task; root logins are refused by the nodes' sshd.
TB_USER="${TRAINMEDIC_TESTBED_USER:-trainmedic}"
SUDOERS=/etc/sudoers.d/trainmedic-testbed
BRIDGE=tmtb-br0
NS_PREFIX=tmtb-
INVENTORY="$REPO/inventories/testbed/hosts.yml"
SLURM_DIR="$DIR/slurm"
SLURM_CONF_FILE="$SLURM_DIR/slurm.conf"
FAULT_CHAIN=TMTB-FAULT

LOG_TAG=testbed.sh
# shellcheck source=scripts/lib/common.sh
. "$REPO/scripts/lib/common.sh"
# shellcheck source=scripts/lib/slurm.sh
. "$REPO/scripts/lib/slurm.sh"

[[ "$NODES" =~ ^[0-9]+$ && "$NODES" -ge 2 && "$NODES" -le 8 ]] || die "TRAINMEDIC_TESTBED_NODES=$NODES: want 2..8"
[[ "$SUBNET" =~ ^(10\.[0-9]{1,3}\.[0-9]{1,3}|192\.168\.[0-9]{1,3}|172\.(1[6-9]|2[0-9]|3[01])\.[0-9]{1,3})$ ]] ||
    die "TRAINMEDIC_TESTBED_SUBNET=$SUBNET: want the first three octets of a private /24 (e.g. 10.77.0)"
[[ "$RATE" =~ ^[0-9]+[kmg]?bit$ ]] || die "TRAINMEDIC_TESTBED_RATE=$RATE: want e.g. 20mbit"
[[ "$WANT_SLURM" =~ ^(auto|0|1)$ ]] || die "TRAINMEDIC_TESTBED_SLURM=$WANT_SLURM: want auto, 0 or 1"
[[ "$TB_USER" =~ ^[a-z_][a-z0-9_-]{0,30}$ && "$TB_USER" != root ]] || die "TRAINMEDIC_TESTBED_USER=$TB_USER: want a plain user name, not root"

node_name() { printf 'node%03d' "$1"; }
ns_name() { printf '%snode%03d' "$NS_PREFIX" "$1"; }
node_ip() { printf '%s.%d' "$SUBNET" $((10 + $1)); }
# Host side of node i's veth (15 characters at most for an interface name).
veth_host() { printf 'tmtb-v%d' "$1"; }

need_root() {
    [[ $(id -u) == 0 ]] || die "must run as root (network namespaces, veths, sshd)"
    command -v ip >/dev/null || die "no ip command (iproute2)"
    ip netns list >/dev/null 2>&1 || die "ip netns is not usable here"
}

# The testbed's namespaces that exist now, whatever NODES says (a larger earlier testbed too).
existing_namespaces() {
    ip netns list 2>/dev/null | awk -v p="^${NS_PREFIX}node[0-9]+$" '$1 ~ p {print $1}' | sort
}

# ------------------------------------------------------------------------------ install

# The tools the testbed itself runs on the controller: sshd in every namespace, iptables
# for the `unreachable` fault, tc (iproute2) for `slow`.
install_tools() {
    need_commands "sshd ssh ssh-keygen" openssh-server openssh-client
    need_commands "iptables" iptables
    need_commands "ip tc" iproute2
    need_commands "sudo visudo" sudo
}

# The remote user: created by the testbed (and removed by `down`) unless it already exists;
# its home (Ansible's remote tmp) lives in the state dir. '*' instead of useradd's locked '!'
# password: sshd without PAM refuses key logins to locked accounts.
make_user() {
    if ! id -u "$TB_USER" >/dev/null 2>&1; then
        useradd --home-dir "$DIR/home" --create-home --shell /bin/bash --user-group "$TB_USER"
        touch "$DIR/created-user"
    fi
    usermod -p '*' "$TB_USER"
    mkdir -p "$DIR/home" "$DIR/markers"
    chown "$TB_USER:" "$DIR/home" "$DIR/markers" "$DIR/id_ed25519"
    printf '%s ALL=(root) NOPASSWD: ALL\n' "$TB_USER" >"$SUDOERS.tmp"
    chmod 0440 "$SUDOERS.tmp"
    visudo -cqf "$SUDOERS.tmp" || die "the testbed's sudoers entry does not parse"
    mv -f "$SUDOERS.tmp" "$SUDOERS"
}

# As on Ubuntu (and production GPU nodes): the kernel log is root's unless asked through sudo.
# The sysctl is machine-wide (namespaces share the kernel): the old value is put back by down.
restrict_kernel_log() {
    [[ -e "$DIR/dmesg_restrict.orig" ]] || sysctl -n kernel.dmesg_restrict >"$DIR/dmesg_restrict.orig"
    sysctl -qw kernel.dmesg_restrict=1 || log "could not set kernel.dmesg_restrict=1"
}

unrestrict_kernel_log() {
    if [[ -s "$DIR/dmesg_restrict.orig" ]]; then
        sysctl -qw "kernel.dmesg_restrict=$(cat "$DIR/dmesg_restrict.orig")" || true
    fi
}

remove_user() {
    rm -f "$SUDOERS"
    if [[ -e "$DIR/created-user" ]] && id -u "$TB_USER" >/dev/null 2>&1; then
        pkill -KILL -u "$TB_USER" 2>/dev/null || true
        userdel "$TB_USER" 2>/dev/null || log "could not remove user $TB_USER"
    fi
}

# ------------------------------------------------------------------------------ state

make_keys() {
    mkdir -p "$DIR/run" "$DIR/log" "$DIR/bin"
    chmod 0755 "$DIR"
    [[ -s "$DIR/ssh_host_ed25519_key" ]] || ssh-keygen -q -t ed25519 -N '' -C trainmedic-testbed-host -f "$DIR/ssh_host_ed25519_key"
    [[ -s "$DIR/id_ed25519" ]] || ssh-keygen -q -t ed25519 -N '' -C trainmedic-testbed-client -f "$DIR/id_ed25519"
    chmod 0600 "$DIR/ssh_host_ed25519_key" "$DIR/id_ed25519"
    cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
    mkdir -p /run/sshd # sshd's privilege-separation directory
    cat >"$DIR/sshd_config" <<EOF
# Generated by scripts/testbed.sh: one sshd per namespace, ListenAddress/PidFile on its command line.
Port 22
HostKey $DIR/ssh_host_ed25519_key
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin no
AllowUsers $TB_USER
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The state dir lives under /var/tmp (mode 1777), which StrictModes would refuse.
StrictModes no
UseDNS no
MaxStartups 100:30:200
MaxSessions 100
# A client whose link died is dropped within ~15 s instead of lingering.
ClientAliveInterval 5
ClientAliveCountMax 3
Subsystem sftp internal-sftp
LogLevel ERROR
EOF
}

# Stand-ins for the GPU tools these hosts do not have: they say so and exit non-zero, as a
# node whose driver is missing would, and never print anything a diagnosis signature matches.
write_standins() {
    local tool
    for tool in nvidia-smi dcgmi; do
        cat >"$DIR/bin/$tool" <<EOF
#!/bin/sh
echo "$tool: not installed on this testbed host (no GPU; trainmedic testbed stand-in)" >&2
exit 127
EOF
        chmod 0755 "$DIR/bin/$tool"
    done
}

# The nodes' Python for the allgather: the system one, reachable by the unprivileged user, with
# torch from the project's venv (same minor version, so the same wheels load).
node_python() {
    local venv_python="$REPO/.venv/bin/python"
    NODE_PYTHON=/usr/bin/python3
    [[ -x $NODE_PYTHON ]] || die "no $NODE_PYTHON on this machine for the nodes"
    [[ -x $venv_python ]] || die "no $venv_python: bash scripts/bootstrap.sh test,testbed first"
    local mine theirs
    mine=$("$venv_python" -c 'import sys; print(sys.version_info[:2])')
    theirs=$("$NODE_PYTHON" -c 'import sys; print(sys.version_info[:2])')
    [[ $mine == "$theirs" ]] || die "node Python $theirs differs from the venv's $mine"
    NODE_PYTHONPATH=$("$venv_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
}

write_inventory() {
    node_python
    local i tmp
    mkdir -p "$(dirname "$INVENTORY")"
    tmp="$INVENTORY.tmp.$$"
    {
        echo "# Generated by scripts/testbed.sh up; removed by down. Do not edit, do not commit."
        echo "all:"
        echo "  vars:"
        echo "    trainmedic_testbed_dir: $DIR"
        echo "    ansible_user: $TB_USER"
        echo "    trainmedic_node_python: $NODE_PYTHON"
        echo "    trainmedic_node_pythonpath: $NODE_PYTHONPATH"
        echo "    ansible_ssh_private_key_file: $DIR/id_ed25519"
        echo "  children:"
        echo "    gpu_nodes:"
        echo "      hosts:"
        for ((i = 1; i <= NODES; i++)); do
            echo "        $(node_name "$i"):"
            echo "          ansible_host: $(node_ip "$i")"
        done
    } >"$tmp"
    mv -f "$tmp" "$INVENTORY"
    # name -> address map for the allgather wrapper, and the generated known_hosts.
    : >"$DIR/hosts.tmp"
    : >"$DIR/known_hosts.tmp"
    for ((i = 1; i <= NODES; i++)); do
        echo "$(node_name "$i") $(node_ip "$i")" >>"$DIR/hosts.tmp"
        echo "$(node_ip "$i") $(cut -d' ' -f1,2 "$DIR/ssh_host_ed25519_key.pub")" >>"$DIR/known_hosts.tmp"
    done
    mv -f "$DIR/hosts.tmp" "$DIR/hosts"
    mv -f "$DIR/known_hosts.tmp" "$DIR/known_hosts"
}

# ------------------------------------------------------------------------------ network

check_subnet_free() {
    # The /24 must not be in use anywhere but on our own bridge: it is never to reach a real net.
    local other
    other=$(ip -o -4 addr show 2>/dev/null | awk -v s="$SUBNET." -v b="$BRIDGE" '$2 != b && index($4, s) == 1 {print $2}' | head -1)
    [[ -z "$other" ]] || die "$SUBNET.0/24 is already on interface $other: pick another TRAINMEDIC_TESTBED_SUBNET"
    other=$(ip -4 route show 2>/dev/null | awk -v s="$SUBNET." -v b="$BRIDGE" 'index($1, s) == 1 && $0 !~ ("dev " b " ") {print}' | head -1)
    [[ -z "$other" ]] || die "a route for $SUBNET.x exists outside the testbed: $other"
}

make_bridge() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
}

make_node() {
    local i=$1 ns veth ip
    ns=$(ns_name "$i")
    veth=$(veth_host "$i")
    ip=$(node_ip "$i")
    ip netns list | awk '{print $1}' | grep -qx "$ns" || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
        # A leftover eth0 from a half-made node would block the rename below.
        ip netns exec "$ns" ip link del eth0 2>/dev/null || true
        ip link add "$veth" type veth peer name "tmtb-p$i"
        ip link set "tmtb-p$i" netns "$ns"
        ip netns exec "$ns" ip link set "tmtb-p$i" name eth0
    fi
    ip link set "$veth" master "$BRIDGE"
    ip link set "$veth" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr replace "$ip/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
}

start_sshd() {
    local i=$1 ns name pidfile
    ns=$(ns_name "$i")
    name=$(node_name "$i")
    pidfile="$DIR/run/sshd-$name.pid"
    pid_alive "$pidfile" sshd && return 0
    ip netns exec "$ns" /usr/sbin/sshd -f "$DIR/sshd_config" -o "ListenAddress=$(node_ip "$i")" \
        -o "PidFile=$pidfile" -E "$DIR/log/sshd-$name.log" || die "sshd in $ns did not start; see $DIR/log/sshd-$name.log"
}

ssh_node() {
    local ip=$1
    shift
    ssh -q -i "$DIR/id_ed25519" -o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=yes \
        -o UserKnownHostsFile="$DIR/known_hosts" -o ControlMaster=no "$TB_USER@$ip" "$@"
}

wait_ssh() {
    local i deadline=$((SECONDS + 30))
    for ((i = 1; i <= NODES; i++)); do
        until ssh_node "$(node_ip "$i")" true 2>/dev/null; do
            ((SECONDS < deadline)) || die "$(node_name "$i") ($(node_ip "$i")) does not answer on SSH"
            sleep 0.3
        done
    done
}

# ------------------------------------------------------------------------------ slurm

write_slurm_conf() {
    local i
    slurm_write_conf "$SLURM_DIR" trainmedic-testbed "localhost($SUBNET.1)" "$SLURM_PORT" < <(
        echo "SlurmdPort=$((SLURM_PORT + 1))"
        # A node whose link is down is NOT_RESPONDING after a missed ping and DOWN after 10 s;
        # its jobs end NODE_FAIL (not requeued: the runbook decides what runs again, and where).
        echo "SlurmdTimeout=10"
        echo "MessageTimeout=5"
        echo "JobRequeue=0"
        echo "MinJobAge=600"
        for ((i = 1; i <= NODES; i++)); do
            echo "NodeName=$(node_name "$i") NodeAddr=$(node_ip "$i") NodeHostname=localhost CPUs=1 RealMemory=1000 State=UNKNOWN"
        done
        echo "PartitionName=testbed Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    )
    for ((i = 1; i <= NODES; i++)); do mkdir -p "$SLURM_DIR/spool/$(node_name "$i")"; done
}

start_slurm() {
    local i name
    export SLURM_CONF="$SLURM_CONF_FILE"
    if ! slurm_ctld_running "$SLURM_DIR"; then
        rm -rf "$SLURM_DIR/state" "$SLURM_DIR/spool" "$SLURM_DIR/db/data"
        write_slurm_conf
    fi
    slurm_start_munge "$SLURM_DIR"
    slurm_start_accounting "$SLURM_DIR" trainmedic-testbed "$SLURM_PORT"
    slurm_start_ctld "$SLURM_DIR"
    for ((i = 1; i <= NODES; i++)); do
        name=$(node_name "$i")
        pid_alive "$SLURM_DIR/run/slurmd-$name.pid" slurmd && continue
        # nsenter, not `ip netns exec`: that one mounts a fresh /sys for the namespace, without
        # the /sys/fs/cgroup slurmd needs. The munge socket is a path: reachable from any netns.
        nsenter --net="/run/netns/$(ns_name "$i")" slurmd -N "$name" -f "$SLURM_CONF_FILE" ||
            die "slurmd $name did not start; see $SLURM_DIR/log/slurmd-$name.log"
    done
    slurm_wait_idle "$SLURM_DIR" "$NODES" 60
    log "slurm up: $NODES slurmd in the namespaces, idle"
}

# ------------------------------------------------------------------------------ commands

cmd_up() {
    local t0=$SECONDS i slurm=0
    need_root
    install_tools
    check_subnet_free
    make_keys
    make_user
    restrict_kernel_log
    write_standins
    make_bridge
    for ((i = 1; i <= NODES; i++)); do
        make_node "$i"
        start_sshd "$i"
    done
    write_inventory
    wait_ssh
    log "$NODES nodes up on $BRIDGE ($SUBNET.0/24), sshd answering ($((SECONDS - t0)) s)"
    if [[ "$WANT_SLURM" != 0 ]]; then
        # Auto: a machine where Slurm cannot be installed runs the testbed without it.
        if (slurm_install); then
            start_slurm
            slurm=1
        elif [[ "$WANT_SLURM" == 1 ]]; then
            die "Slurm is not installed and cannot be installed here"
        else
            log "Slurm not installable here: the testbed runs without it"
        fi
    fi
    echo "export TRAINMEDIC_TESTBED_DIR=$DIR"
    if ((slurm)); then echo "export SLURM_CONF=$SLURM_CONF_FILE"; fi
    log "up in $((SECONDS - t0)) s"
}

cmd_down() {
    local ns pid pids link i
    need_root
    slurm_stop "$SLURM_DIR"
    for pidfile in "$DIR"/run/sshd-*.pid; do
        [[ -e "$pidfile" ]] && stop_pid "$pidfile" sshd
    done
    # Whatever still runs inside a testbed namespace was started there by the testbed or a
    # test (SSH sessions, allgather ranks, job steps): end those processes by id.
    for ns in $(existing_namespaces); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [[ -n "$pids" ]] || continue
        # shellcheck disable=SC2086  # pids: digits only
        kill -TERM $pids 2>/dev/null || true
    done
    for ((i = 0; i < 30; i++)); do
        pids=""
        for ns in $(existing_namespaces); do pids+=$(ip netns pids "$ns" 2>/dev/null || true); done
        [[ -z "$pids" ]] && break
        sleep 0.1
    done
    for ns in $(existing_namespaces); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        # shellcheck disable=SC2086
        if [[ -n "$pids" ]]; then kill -KILL $pids 2>/dev/null || true; fi
    done
    # Host-side veths (their tc qdiscs go with them), then the namespaces (their iptables,
    # eth0 and its qdiscs go with them), then the bridge.
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^tmtb-[vp][0-9]+$' || true); do
        ip link del "$link" 2>/dev/null || true
    done
    for ns in $(existing_namespaces); do
        ip netns del "$ns" 2>/dev/null || log "could not delete namespace $ns"
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
    rm -f "$INVENTORY"
    remove_user
    unrestrict_kernel_log
    rm -rf "$DIR"
    if [[ -n "$(existing_namespaces)" ]]; then die "namespaces left: $(existing_namespaces | xargs)"; fi
    log "down"
}

cmd_status() {
    local i rc=0 name ns state
    need_root
    if ip link show "$BRIDGE" >/dev/null 2>&1; then echo "bridge $BRIDGE: $(ip -o -4 addr show dev "$BRIDGE" | awk '{print $4}')"; else
        echo "bridge $BRIDGE: absent"
        rc=1
    fi
    for ((i = 1; i <= NODES; i++)); do
        name=$(node_name "$i")
        ns=$(ns_name "$i")
        if ! existing_namespaces | grep -qx "$ns"; then
            echo "$name: no namespace"
            rc=1
            continue
        fi
        state="ns $ns, $(node_ip "$i")"
        if pid_alive "$DIR/run/sshd-$name.pid" sshd; then state+=", sshd running"; else
            state+=", sshd stopped"
            rc=1
        fi
        if ssh_node "$(node_ip "$i")" true 2>/dev/null; then state+=", ssh ok"; else state+=", ssh FAILS"; fi
        state+=", faults: $(node_faults "$i")"
        echo "$name: $state"
    done
    if [[ -f "$SLURM_CONF_FILE" ]] && pid_alive "$SLURM_DIR/run/slurmctld.pid" slurmctld; then
        SLURM_CONF="$SLURM_CONF_FILE" timeout 10 sinfo -N -o '%N %T %E' || rc=1
    else
        echo "slurm: not running"
    fi
    return "$rc"
}

node_faults() {
    local i=$1 ns veth faults=()
    ns=$(ns_name "$i")
    veth=$(veth_host "$i")
    if ! ip -o link show "$veth" 2>/dev/null | grep -q '[<,]UP[,>]'; then faults+=(linkdown); fi
    if ip netns exec "$ns" tc qdisc show dev eth0 2>/dev/null | grep -q tbf; then faults+=(slow); fi
    if ip netns exec "$ns" iptables -S "$FAULT_CHAIN" 2>/dev/null | grep -q DROP; then faults+=(unreachable); fi
    ((${#faults[@]})) && echo "${faults[*]}" || echo none
}

cmd_fault() {
    local node=${1:-} kind=${2:-} i ns veth
    need_root
    [[ "$node" =~ ^node([0-9]{3})$ ]] || die "fault: NODE must be node001..node00$NODES, got '$node'"
    i=$((10#${BASH_REMATCH[1]}))
    ((i >= 1 && i <= 8)) || die "fault: no such node $node"
    ns=$(ns_name "$i")
    veth=$(veth_host "$i")
    existing_namespaces | grep -qx "$ns" || die "fault: $node is not up (scripts/testbed.sh up)"
    case "$kind" in
    linkdown)
        ip link set "$veth" down
        ;;
    slow)
        # Both directions: the node's own egress (eth0 in the namespace) and its ingress (the
        # host side of its veth, whose egress is towards the node).
        ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$RATE" burst 32kbit latency 400ms
        tc qdisc replace dev "$veth" root tbf rate "$RATE" burst 32kbit latency 400ms
        ;;
    unreachable)
        ip netns exec "$ns" iptables -N "$FAULT_CHAIN" 2>/dev/null || true
        ip netns exec "$ns" iptables -C INPUT -j "$FAULT_CHAIN" 2>/dev/null ||
            ip netns exec "$ns" iptables -I INPUT -j "$FAULT_CHAIN"
        ip netns exec "$ns" iptables -F "$FAULT_CHAIN"
        ip netns exec "$ns" iptables -A "$FAULT_CHAIN" -p tcp --dport 22 -j DROP
        ;;
    clear)
        ip link set "$veth" up
        ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        tc qdisc del dev "$veth" root 2>/dev/null || true
        ip netns exec "$ns" iptables -F "$FAULT_CHAIN" 2>/dev/null || true
        ;;
    *) die "fault: KIND must be linkdown, slow, unreachable or clear, got '$kind'" ;;
    esac
    log "$node: $kind"
}

run_command "up down status fault" "$@"
