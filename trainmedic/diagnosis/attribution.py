"""Who wrote a log line, and when: the host its prefix names (NCCL's "host:pid:tid [gpu]",
syslog, a launcher's tag, a JSON field), its rank and GPU, its timestamp; the hosts a
pasted shell session's prompts name. Placing a cause starts here."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from trainmedic.core.validate import log_number
from trainmedic.diagnosis.envelope import RAY_WORKER, named_part

__all__ = [
    "Attribution",
    "attribute",
    "ray_task_scopes",
    "shell_prompts",
    "writer",
]

# Where a line says who wrote it. Tried in order, first match wins per field.
# NCCL's "host:pid:tid [gpu]", at the start or after a launcher's prefix ("[1,12]<stdout>:",
# a date, "[rank0]:", a report's quote mark); a host name may start with a digit (cloud VMs:
# hex ids), not be one.
_NCCL_PREFIX = re.compile(
    r"(?:^|(?<=[\s>:\]\"']))(?!\d{4}-\d\d-\d\dT)(?P<host>(?=[\w.-]*[A-Za-z])[\w.-]{3,}):\d+:\d+"
    r" \[(?P<gpu>\d+)\]"
)
# Structured (JSON) logs name their writer: Ray events, Kubernetes, fluentd ("hostname",
# "host_name"; a Kubernetes health event's "nodeName", often an IP); a node controller's
# "node", the node it acts on, where the value looks like a machine's name (a digit or a dot in
# it: "aks-gpu-1249-vmss0l", not "worker").
_JSON_HOST = re.compile(
    r'"(?i:host_?name|node_?name)"\s*:\s*"(?P<host>[A-Za-z][\w.-]*|\d{1,3}(?:\.\d{1,3}){3})"'
    r'|"node"\s*:\s*"(?P<json_node>[A-Za-z][A-Za-z_-]*[\d.][\w.-]*|\d{1,3}(?:\.\d{1,3}){3})"'
)
# Ray's worker prefix (envelope.RAY_WORKER), also after a "# " where a report quotes it as a
# comment.
RAY_WORKER_LINE = re.compile(r"^(?:#\s*)?" + RAY_WORKER + " ")
# pdsh / DeepSpeed's multi-node runner ("node7: ", "192.168.13.81: "), a fleet health check's
# per-node lines ("node-510 | ERROR: ..."), mpirun/accelerate's tagged output ("[gpu12:5]:"),
# Ray's worker prefix where it carries the worker's address (below). An error code in that place
# (Ascend's "EI0002: ", "E1001: "), GCC's own programs ("collect2: error: ld returned 1") or a
# device the kernel names ("mlx5_0: couldn't register ipoib port 1", "ib0: ", "nvme0n1: ",
# "enp6s0f1: ") is no host.
_LABEL_PREFIX = re.compile(
    r"^(?![A-Z]{1,2}\d{4,}: |(?:collect2|cc1(?:plus)?|f951): "
    r"|(?:mlx\d+_\d+|ib\d+|ibp\d+s\d+\w*|eth\d+|en[ops]\d+\w*|nvme\d+\w*|bond\d+|hfi\d+_\d+"
    r"|bnxt_re\d+|efa_\d+|irdma\d+|nvidia\d+|dm-\d+|md\d+): )"
    r"(?P<host>[A-Za-z][A-Za-z_-]*\d[\w-]*|\d{1,3}(?:\.\d{1,3}){3})"
    r"(?:: | \| )"
    r"|^\[(?P<tag>[A-Za-z][\w.-]*):\d+\]:"
    r"|^(?:#\s*)?(?=\([^)\n]*, ip=)" + RAY_WORKER +
    # srun naming the node a task died on (also when a paste cuts the line after "task"); UCX's
    # "[host:pid:thread:tid]" crash reports (in a container, its id is the host name).
    r"|srun: error: (?P<srun>[A-Za-z][\w.-]*): tasks?(?: \d|$)"
    r"|^(?:\d+: )?\[(?P<ucx>[A-Za-z][\w.-]*|[0-9a-f]{12}):\d+\s*:\d+:\d+\]"
    # Cray MPICH's abort: "MPICH ERROR [Rank 0] [job id 2843791.3] [Tue Feb 14 ...] [nid007564] -"
    r"|^MPICH ERROR \[Rank \d+\] \[job id [^\]]*\] \[[^\]]*\] \[(?P<mpich>[A-Za-z][\w.-]*)\] - "
    # Open MPI's signal handler reporting a rank's crash: "[node7:01501] *** Process received
    # signal ***", "[node7:01501] Signal: Segmentation fault (11)", "[node7:01501] [ 0] ..."; in a
    # container, its id is the host name ("[27c929c21716:87519]").
    r"|^\[(?!(?:rank|gpu|cuda|device)\d)(?P<ompi>[A-Za-z][\w.-]*|[0-9a-f]{12}):\d+\] "
    r"(?=\*\*\* |Signal(?: code)?: |Failing at address|\[ ?\d+\] )"
    # PBS's node list ("x3014c0s19b0n0   offline,resv-exclusive Xid 74 -- GPUs need reseat",
    # "x4013c0s7b0n0,down,EXECJOB_BEGIN: ..."): the node the line is about.
    r"|^(?P<pbs>[A-Za-z][\w-]*\d[\w.-]*)(?:\s+|,)"
    r"(?:offline|down|state-unknown|job-exclusive|resv-exclusive)(?=[\s,])"
    # ESPnet's "[host] 2021-04-13 06:46:09,918 (trainer:273) INFO:" and "[host:0/8] ...", a
    # cloud job's "[pod-name-0] [2026-03-30 19:24:35,967] ..." (a name with a digit: "[INFO]
    # 2021-..." is a level, "[rank0] ..." a rank, no host).
    r"|^\[(?!(?:rank|gpu|cuda|device)\d)(?P<espnet>(?=[\w.-]*\d)[A-Za-z0-9][\w.-]*?)"
    r"(?::\d+/\d+)?\] (?=\[?\d{4}-\d\d-\d\d[ T])"
)
_HOST_GROUPS = (
    "host",
    "json_node",
    "tag",
    "ray",
    "srun",
    "ucx",
    "mpich",
    "ompi",
    "pbs",
    "espnet",
)
# The prefixes that name a line's writer beyond doubt, for telling which hosts a log was
# written on at all: a bare "word7: " could be "epoch1: " and is taken only as an address, a
# node list's row is about its node, written elsewhere.
_WRITER_GROUPS = frozenset(_HOST_GROUPS) - {"host", "pbs"}
_IP = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")
# A shell prompt ("root@node1:~# ", "[user@gpu-03 ~]$ "): the lines after it, up to the next
# prompt, were printed on that host (a session pasted into a bug report, one ssh per node).
# A container's default name (12 hex digits) counts, as in NCCL's prefix, where it is the only
# name the log gives the machine (acting on it needs it in the inventory); never localhost.
# A conda or virtualenv prompt starts with the environment's name: "(base) user@gpu-03:~$ ";
# zsh's ends in "%": "user@cn-234 ~ % ".
# syslogd's wall message ("Message from syslogd@gpu-03 at Apr  3 04:50:06 ...", then the kernel's
# emergency line) reaches the terminals of the machine it names: the session is on that host.
_SHELL_PROMPT = re.compile(
    # (indented or quoted in a report, as a whole block)
    rb"^[ \t]*(?:>[ \t]?)?(?:(?:\([\w.-]+\) )?"
    rb"\[?[A-Za-z_][\w.-]*@(?P<host>[A-Za-z][\w.-]*|[0-9a-f]{12}(?=[: ]))"
    rb"[: ][^\n#$%]{0,160}?\]?[#$%] "
    # "$ ssh gpu-2-5 nvidia-smi": what follows was printed on the host ssh went to; "$ srun ...":
    # on the allocation's nodes, not on the login node whose prompt it is.
    rb"(?:ssh (?:-\S+ )*(?:[\w.-]+@)?(?P<ssh>[A-Za-z][\w.-]*) |(?P<srun>srun [^\n]*))?"
    rb"|Message from syslogd@(?P<wall>[A-Za-z][\w.-]*) at )",
    re.MULTILINE,
)
# srun's node list when it names one node ("-w node001", "--nodelist=node001"): that node
# printed what follows. A list or a range ("-w node[01-04]", "-w a,b") names no one writer.
_SRUN_ONE_NODE = re.compile(rb"(?:^|\s)(?:-w ?|--nodelist[= ])(?P<node>[A-Za-z][\w.-]*)(?=\s|$)")
# A Ray task's error header ("ray::WorkerDict.generate_sequences() (pid=838798, ip=10.138.0.27,
# actor_id=...)"): the traceback after it was raised in that task, on that node.
RAY_TRACEBACK_LINES = 200
# A blank line, or a block that starts with one (where a carried traceback ends at once).
_BLANK_LINE = re.compile(rb"(?:\A|\n)[ \t]*(?=\n)")
# Ray colours the task's name: the escape may be kept, escaped by syslog ("#033"), or lost.
_RAY_TASK_HEADER = re.compile(
    rb"ray::[\w.<>]+\(\)(?:(?:\x1b|#033)?\[\d+m)? "
    rb"\(pid=\d+, ip=(?P<host>\d{1,3}(?:\.\d{1,3}){3})[,)]"
)
# `uname -a` names the machine it ran on: "Linux node-11 5.4.0-65-generic #73-Ubuntu SMP ...";
# nccl-tests' header names each rank's: "#  Rank  0 Group  0 Pid  21284 on gpu-3 device  0";
# LSF's job report, a one-host job's ("Job was executed on host(s) <n-62-23-25>, in queue ...";
# a job on several hosts lists them all, "<4*a>, <4*b>", and names no one machine);
# Kaldi's queue.pl / slurm.pl job log header ("# Running on r7n01", then "# Started at ...");
# TensorFlow's CUDA diagnostics after a failed cuInit ("cuda_diagnostics.cc:176] hostname: x").
_MACHINE_LINE = re.compile(
    r"^Linux (?!version )(?P<host>[A-Za-z][\w.-]*) \d+\.\d+\.\d+-"
    r"|^#\s+Rank\s+\d+ (?:Group\s+\d+ )?Pid\s+\d+ on\s+(?P<rank_host>[A-Za-z][\w.-]*) device\b"
    r"|^Job was executed on host\(s\) <(?:\d+\*)?(?P<job_host>[A-Za-z][\w.-]*)>, in queue\b"
    r"|^# Running on (?P<queue_host>[A-Za-z][\w.-]*)\s*$"
    r"|^.{0,120}?\bcuda_diagnostics\.cc:\d+\] hostname: (?P<tf_host>[A-Za-z][\w.-]*)\s*$"
)
_NOT_A_NODE = "localhost"
_CONTAINER_ID = re.compile(r"^[0-9a-f]{12}$")
# A syslog line ("May 29 10:01:02 host proc[pid]:", journalctl -o short-precise's "10:01:02.880752",
# a Chinese locale's "4月 28 ...", a European one's lowercase "nov 07 ..." or "april 24 ..."),
# at the start or quoted after a report's own words ("Error: May 29 ..."), or after the file
# grep found it in ("/var/log/kern.log:Aug 18 14:30:16 host kernel: ..."). rsyslog templates
# may print the facility and priority between the host and the program ("<kern.warning>", "<4>").
# A host name may start with a digit ("000-000-00000-1-gpu-1") if a letter follows.
_SYSLOG_PREFIX = re.compile(
    r"(?:^|(?<=\s)|(?<=\.log:)|(?<=/messages:)|(?<=/syslog:))"
    r"(?:(?:(?:[A-Z][a-z]{2}|\d{1,2}月)\s+\d+\s+[\d:]+|[a-z]{3,9}\s+\d{1,2}\s+\d\d:\d\d:\d\d)(?:\.\d+)?"
    r"|\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-][\d:]+)?)\s+"
    r"(?!(?:node|host|hostname|localhost|server)\s)"  # a report's stand-in for the name
    r"(?P<host>[A-Za-z][\w.-]*|\d[\w.-]*[A-Za-z][\w.-]*)\s+(?:<(?:[a-z]+\.[a-z]+|\d{1,3})>\s*)?"
    r"(?:kernel|slurmd|slurmstepd|[a-z][\w.-]*\[\d+\]):"
)
_RANK = re.compile(r"(?<![\w-])[Rr]ank[\s:=\[]*(?P<rank>\d+)")
_GPU = re.compile(
    r"\bGPU\s*(?P<gpu>\d{1,2})(?![\d:.])|device ordinal (?P<ordinal>\d+)|cuda:(?P<cuda>\d+)"
)
_PCI = re.compile(r"\b(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
# The kernel names a device by its driver, then its PCI address: a NIC's or a disk's line
# ("mlx5_core 0000:5c:00.0: ...", "cxi_core 0000:c0:00.0: ...") places no GPU.
_OTHER_DEVICE = re.compile(
    r"\b(?:mlx\d_core|cxi_core|bnxt_en|ixgbe|i40e|ice|igb|e1000e|nvme|ahci|efa|irdma|ionic|hfi1)"
    r" [0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:"
)
_ISO_TIME = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))?")


Attribution = tuple[str | None, int | None, str | None, float | None]


def attribute(text: str) -> Attribution:
    host: str | None = None
    gpu: str | None = None
    prefix = _line_prefix(text)
    if prefix is not None:
        match, _, host = prefix
        gpu = match.groupdict().get("gpu")
    rank_match = _RANK.search(text)
    rank = log_number(rank_match.group("rank")) if rank_match else None
    if gpu is None:
        gpu_match = _GPU.search(text)
        if gpu_match:
            gpu = next(v for v in gpu_match.groups() if v is not None)
        elif not _OTHER_DEVICE.search(text):
            pci_match = _PCI.search(text)
            gpu = pci_match.group("pci") if pci_match else None
    return host, rank, gpu, _timestamp(text)


def writer(text: str) -> str | None:
    """The host a line's prefix says wrote it, where the prefix leaves no doubt."""
    prefix = _line_prefix(text)
    if prefix is not None:
        match, group, host = prefix
        if group in _WRITER_GROUPS or match.re is not _LABEL_PREFIX or _IP.fullmatch(host):
            return host
        return None
    machine = _MACHINE_LINE.match(text) or _MACHINE_LINE.match(named_part(text) or "")
    if machine:
        host = next(h for h in machine.groups() if h).lower()
        return None if host == _NOT_A_NODE else host
    return None


def _line_prefix(text: str) -> tuple[re.Match[str], str, str] | None:
    """The first prefix naming the host that wrote a line: (match, group, host in lower case).
    A launcher's label may come after a timestamp, a level or a tag (``envelope.named_part``)."""
    for prefix in (_NCCL_PREFIX, _SYSLOG_PREFIX, _LABEL_PREFIX, _JSON_HOST):
        match = prefix.search(text)
        if match:
            group, host = next(
                (k, v) for k, v in match.groupdict().items() if k in _HOST_GROUPS and v
            )
            return match, group, host.lower()
    inner = named_part(text)
    return _line_prefix(inner) if inner else None


def shell_prompts(body: bytes, *, containers: bool = True) -> list[tuple[int, str | None]]:
    """(line offset in ``body``, host) of every shell prompt naming a node; ``containers=False``
    skips a container's default name, for a log whose node is known otherwise (its file's).
    The host is None after a prompt that ran srun on nodes it does not name one by one: the
    lines that follow were printed somewhere in the allocation, not on the prompt's host."""
    found: list[tuple[int, str | None]] = []
    lines = _LineCounter(body)
    for match in _SHELL_PROMPT.finditer(body):
        srun = match.group("srun")
        if srun is not None:
            one = _SRUN_ONE_NODE.search(srun)
            named = one.group("node") if one else None
        else:
            named = match.group("ssh") or match.group("host") or match.group("wall")
        if named is None:
            found.append((lines.at(match.start()), None))
            continue
        host = named.decode("ascii", "replace").lower().rstrip(".")
        if host == _NOT_A_NODE or (not containers and _CONTAINER_ID.match(host)):
            continue
        found.append((lines.at(match.start()), host))
    return found


def ray_task_scopes(
    body: bytes, carried: tuple[str, int] | None = None, *, headers: bool = True
) -> tuple[list[tuple[int, str, int]], tuple[str, int] | None]:
    """(line offset in ``body``, node, line offset where its traceback ends) of every Ray task
    error header, and the (node, lines left) of a traceback still open at the end of ``body``,
    for the next block. A traceback ends at the first blank line after its header, or at the
    next header, or RAY_TRACEBACK_LINES lines on: so scopes never overlap, and each byte of
    ``body`` is searched once however many headers it holds. ``carried`` is (node, lines left)
    of a traceback the block before ended inside of, placed from this block's first line on.
    ``headers=False``: the caller knows ``body`` holds none (its templates hold no "ray::"),
    so only the carried one is placed."""
    lines = _LineCounter(body)
    matches = list(_RAY_TASK_HEADER.finditer(body)) if headers else []
    # (byte offset its traceback starts at, first line, node, most lines it may span)
    heads = [
        (
            match.end(),
            lines.at(match.start()),
            match.group("host").decode("ascii"),
            RAY_TRACEBACK_LINES,
        )
        for match in matches
    ]
    if carried is not None:
        heads.insert(0, (0, 0, carried[0], carried[1]))
    found: list[tuple[int, str, int]] = []
    still_open: tuple[str, int] | None = None
    for number, (begin, start, node, budget) in enumerate(heads, 1):
        last = number == len(heads)
        limit = len(body) if last else heads[number][0]
        blank = _BLANK_LINE.search(body, begin, limit)
        stop = blank.start() if blank else limit
        spanned = body.count(b"\n", begin, stop)
        end = start + min(spanned, budget) + 1
        if not last:
            end = min(end, heads[number][1])
        elif blank is None and spanned < budget:
            still_open = (node, budget - spanned)
        found.append((start, node, end))
    return found, still_open


class _LineCounter:
    """Line numbers of ascending offsets in one body, each newline counted once (a block
    with many matches would otherwise be counted from its start for every one)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.offset = 0
        self.line = 0

    def at(self, offset: int) -> int:
        self.line += self.body.count(b"\n", self.offset, offset)
        self.offset = offset
        return self.line


def _timestamp(text: str) -> float | None:
    match = _ISO_TIME.search(text, 0, 80)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction = match.group(7)
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None
    return moment.timestamp() + (float(f"0.{fraction}") if fraction else 0.0)
