"""A real multi-host allgather test with nccl-tests' command line and output, on CPUs (gloo).

The testbed's stand-in for ``all_gather_perf``: playbooks/nccl_pair_test.yml runs it on the
first host of a group exactly as it runs nccl-tests there::

    python scripts/gloo_allgather.py -b 16M -e 16M -g 1 --hosts node001,node002 \
        --testbed-dir /var/tmp/trainmedic-testbed [--timeout 60]

and parses its ``# Avg bus bandwidth    : X`` line (GB/s). The first host is rank 0: it
hosts the rendezvous (a torch TCPStore on its own address) and starts every other rank over
SSH with the testbed's key, as the same user (``ssh <user>@<peer> python this-file --rank R
...``: the namespaces share the filesystem, so this interpreter and this file are there too).
Each rank binds gloo to the interface that holds its testbed address.

Sizes follow nccl-tests: ``-b``/``-e`` are the total gathered bytes (``1G``, ``64M``, ``512K``),
each rank contributes size/ranks; algbw = size / time, busbw = algbw * (ranks - 1) / ranks.

Failures are bounded and loud, never a hang: a peer that cannot be started (link down, SSH
dropped) ends the test as soon as its ssh exits (ssh ConnectTimeout 5 s); a peer that never
joins or a collective that stalls ends at ``--timeout`` (exit 124, what coreutils timeout
exits with, so the runbook reads it the same); any other error exits 1. Each prints one
``# Test failure: ...`` line naming the host and what happened.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import getpass
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

DEFAULT_TESTBED_DIR = "/var/tmp/trainmedic-testbed"  # noqa: S108 - made by testbed.sh (root)
SIOCGIFADDR = 0x8915
_SIZE_RE = re.compile(r"^(\d+)([KMG]?)B?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_HOST_RE = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
_lock = threading.Lock()


def size(text: str) -> int:
    match = _SIZE_RE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: want bytes like 1048576, 512K, 64M or 1G")
    return int(match[1]) * _UNITS[match[2].upper()]


def say(line: str) -> None:
    with _lock:
        print(line, flush=True)


def die(message: str, rc: int = 1) -> None:
    """Report one failure line and end the process now, whatever other threads are doing."""
    with _lock:
        print(f"# Test failure: {message}", flush=True)
        print(f"gloo_allgather: error: {message}", file=sys.stderr, flush=True)
    os._exit(rc)


def local_ifname(address: str) -> str | None:
    """The interface holding ``address`` (gloo must bind there, not to the hostname's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(
                    sock.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def read_hosts(testbed_dir: Path) -> dict[str, str]:
    path = testbed_dir / "hosts"
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        die(f"cannot read the testbed's address map {path}: {exc} (scripts/testbed.sh up?)")
    pairs = (line.split() for line in lines if line.strip() and not line.startswith("#"))
    return {p[0]: p[1] for p in pairs if len(p) == 2}


def start_watchdog(timeout_s: float, what: str) -> None:
    def fire() -> None:
        time.sleep(timeout_s)
        die(f"timed out after {timeout_s:.0f} s {what()}", rc=124)

    threading.Thread(target=fire, daemon=True, name="watchdog").start()


@dataclass(frozen=True)
class Rendezvous:
    rank: int
    world: int
    store_host: str  # rank 0's address: the TCPStore
    port: int
    address: str  # this rank's own testbed address

    @property
    def is_master(self) -> bool:
        return self.rank == 0


def run_allgather(
    args: argparse.Namespace, rv: Rendezvous, state: dict[str, str]
) -> list[tuple[int, float]]:
    rank, world = rv.rank, rv.world
    ifname = local_ifname(rv.address)
    if ifname is None:
        die(f"rank {rank}: no local interface holds {rv.address}: not running on that host")
    os.environ["GLOO_SOCKET_IFNAME"] = ifname
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # c10d's hostname-lookup chatter
    warnings.filterwarnings("ignore")  # torch's NumPy/deprecation notices: not test output
    state["phase"] = "importing torch"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    state["phase"] = (
        f"waiting for {world} ranks to join the rendezvous at {rv.store_host}:{rv.port}"
    )
    store = dist.TCPStore(
        rv.store_host,
        rv.port,
        world_size=world,
        is_master=rv.is_master,
        timeout=timedelta(seconds=args.timeout),
        wait_for_workers=True,
    )
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=args.timeout)
    )
    results: list[tuple[int, float]] = []
    nbytes = args.min_bytes
    while True:
        count = max(1, nbytes // 4 // world)  # float32 elements per rank
        send = torch.full((count,), float(rank + 1), dtype=torch.float32)
        recv = torch.empty((count * world,), dtype=torch.float32)
        state["phase"] = f"in allgather of {count * world * 4} bytes"
        for _ in range(args.warmup_iters):
            dist.all_gather_into_tensor(recv, send)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_gather_into_tensor(recv, send)
        elapsed = (time.perf_counter() - start) / args.iters
        expected = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(count)
        wrong = int((recv != expected).sum())
        if wrong:
            die(f"rank {rank}: {wrong} wrong values after allgather")
        results.append((count * world * 4, elapsed))
        if nbytes >= args.max_bytes:
            break
        nbytes = min(args.max_bytes, nbytes * args.step_factor)
    state["phase"] = "finishing"
    dist.barrier()
    dist.destroy_process_group()
    return results


def start_peers(
    args: argparse.Namespace,
    hosts: list[str],
    addresses: dict[str, str],
    testbed: Path,
    master: str,
) -> list[tuple[int, str, subprocess.Popen[str]]]:
    """Start ranks 1.. on their hosts over SSH (the namespaces share this filesystem)."""
    passthrough = [
        *("-b", str(args.min_bytes), "-e", str(args.max_bytes), "-f", str(args.step_factor)),
        *("-n", str(args.iters), "-w", str(args.warmup_iters), "--timeout", str(args.timeout)),
    ]
    ssh_options = [
        *("-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"),
        *("-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3", "-o", "ControlMaster=no"),
        *("-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={testbed / 'known_hosts'}"),
        *("-i", str(testbed / "id_ed25519")),
    ]
    peers = []
    for rank, host in enumerate(hosts[1:], start=1):
        command = [
            *(sys.executable, str(Path(__file__).resolve()), "--rank", str(rank)),
            *("--world", str(len(hosts)), "--master", master, "--address", addresses[host]),
            *passthrough,
        ]
        # Remote side bounded too, even if this process is killed without a word.
        # The same import path on the peer (the node's torch may live outside its Python).
        pythonpath = (
            [f"PYTHONPATH={os.environ['PYTHONPATH']}"] if "PYTHONPATH" in os.environ else []
        )
        remote = ["timeout", "--kill-after=5", str(args.timeout + 10), "env", *pythonpath, *command]
        proc = subprocess.Popen(
            ["ssh", *ssh_options, f"{getpass.getuser()}@{addresses[host]}", *remote],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        peers.append((rank, host, proc))
    return peers


def report(
    args: argparse.Namespace,
    hosts: list[str],
    addresses: dict[str, str],
    results: list[tuple[int, float]],
) -> None:
    """nccl-tests' output: header, one row per size, the average bus bandwidth."""
    world = len(hosts)
    say(f"# nThread 1 nGpus 1 minBytes {args.min_bytes} maxBytes {args.max_bytes} step: "
        f"{args.step_factor}(factor) warmup iters: {args.warmup_iters} iters: {args.iters} "
        "validation: 1 backend: gloo (CPU)")  # fmt: skip
    say("#")
    say("# Using devices")
    for rank, host in enumerate(hosts):
        say(f"#  Rank {rank:2d} on {host:>10s} address {addresses[host]} device  0 [gloo] CPU")
    say("#")
    say("#                                             out-of-place")
    say("#       size         count      type   redop    root     time   algbw   busbw #wrong")
    say("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")
    busbws = []
    for nbytes, elapsed in results:
        algbw = nbytes / elapsed / 1e9
        busbw = algbw * (world - 1) / world
        busbws.append(busbw)
        say(f"{nbytes:12d}  {nbytes // 4:12d}     float    none      -1 {elapsed * 1e6:8.1f} "
            f"{algbw:7.3f} {busbw:7.3f}      0")  # fmt: skip
    say("# Out of bounds values : 0 OK")
    say(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f} ")
    say("#")


def leader(args: argparse.Namespace) -> int:
    hosts = [h for h in args.hosts.split(",") if h]
    if not 2 <= len(hosts) <= 8 or len(set(hosts)) != len(hosts):
        die(f"--hosts {args.hosts!r}: want 2..8 distinct hosts")
    for host in hosts:
        if not _HOST_RE.match(host):
            die(f"--hosts: {host!r} is not a host name")
    testbed = Path(args.testbed_dir)
    addresses = read_hosts(testbed)
    unknown = [h for h in hosts if h not in addresses]
    if unknown:
        die(f"hosts not in the testbed's address map {testbed / 'hosts'}: {', '.join(unknown)}")
    world = len(hosts)
    me = addresses[hosts[0]]
    state = {"phase": "starting peers"}
    start_watchdog(args.timeout + 5, lambda: state["phase"])

    # The rendezvous port, picked now so the peers can start while torch is imported here.
    with socket.socket() as probe:
        try:
            probe.bind((me, 0))
        except OSError as exc:
            die(f"{hosts[0]}: cannot bind {me}: {exc}: not running on {hosts[0]}")
        port = probe.getsockname()[1]

    peers = start_peers(args, hosts, addresses, testbed, f"{me}:{port}")

    done = threading.Event()

    def watch(rank: int, host: str, proc: subprocess.Popen[str]) -> None:
        output = proc.communicate()[0] or ""
        if proc.returncode != 0 and not done.is_set():
            tail = [line for line in output.splitlines() if line.strip()][-3:]
            detail = " | ".join(tail) or "no output"
            started = f"rank {rank} started" in output
            if proc.returncode == 255:
                what = "lost its SSH connection" if started else "could not be reached over SSH"
            else:
                what = "failed"
            die(
                f"rank {rank} on {host} ({addresses[host]}) {what} (rc={proc.returncode}): {detail}"
            )

    for rank, host, proc in peers:
        threading.Thread(target=watch, args=(rank, host, proc), daemon=True).start()

    try:
        results = run_allgather(args, Rendezvous(0, world, me, port, me), state)
    except Exception as exc:  # gloo/c10d errors: a peer died, a connection was reset
        die(f"allgather across {','.join(hosts)} failed while {state['phase']}: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")  # fmt: skip
    done.set()
    for _, _, proc in peers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    report(args, hosts, addresses, results)
    return 0


def peer(args: argparse.Namespace) -> int:
    host, _, port = args.master.rpartition(":")
    state = {"phase": "starting"}
    say(f"gloo_allgather: rank {args.rank} started on {args.address}")
    start_watchdog(args.timeout + 5, lambda: state["phase"])
    try:
        rendezvous = Rendezvous(args.rank, args.world, host, int(port), args.address)
        run_allgather(args, rendezvous, state)
    except Exception as exc:
        die(f"rank {args.rank} ({args.address}) failed while {state['phase']}: "
            f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-b", "--minbytes", dest="min_bytes", type=size, default=size("16M"))
    parser.add_argument("-e", "--maxbytes", dest="max_bytes", type=size, default=size("16M"))
    parser.add_argument("-f", "--stepfactor", dest="step_factor", type=int, default=2)
    parser.add_argument("-g", "--ngpus", type=int, default=1, help="accepted; gloo uses 1 CPU rank")
    parser.add_argument("-n", "--iters", type=int, default=5)
    parser.add_argument("-w", "--warmup_iters", type=int, default=1)
    parser.add_argument("--hosts", help="the group, first = this host (leader mode)")
    parser.add_argument(
        "--testbed-dir", default=os.environ.get("TRAINMEDIC_TESTBED_DIR", DEFAULT_TESTBED_DIR)
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds; then exit 124")
    # Internal: how the leader starts the other ranks.
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (
        args.min_bytes > args.max_bytes
        or args.step_factor < 2
        or args.iters < 1
        or args.timeout <= 0
    ):
        parser.error("want -b <= -e, -f >= 2, -n >= 1, --timeout > 0")
    if args.rank is not None:
        return peer(args)
    if not args.hosts:
        parser.error("--hosts is required")
    return leader(args)


if __name__ == "__main__":
    sys.exit(main())
