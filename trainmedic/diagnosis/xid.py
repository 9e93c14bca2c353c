"""NVIDIA's Xid catalogue as data (``data/xid_catalogue.csv``, read from NVIDIA's public
catalogue; see ``data/README.md``): what each Xid code means, whether the hardware or the
application is at fault, NVIDIA's immediate resolution, and the trainmedic category.

One table serves every path that sees an Xid: the log signatures generated from it
(:mod:`trainmedic.diagnosis.catalogue`) and the telemetry readings (the DCGM exporter's last
Xid). Application-class Xids (13, 31, 43, 45, 68, 109, ...) are the job's own fault: their
category sends the job to its owner, never a node to a drain.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Protocol, TypeVar

from trainmedic.core.errors import ConfigError
from trainmedic.core.taxonomy import Category
from trainmedic.core.validate import log_number

__all__ = [
    "APPLICATION_XID",
    "NVLINK5_BUCKET",
    "RECOVERY_XID",
    "RecoveryAction",
    "RecoveryChange",
    "SxidEntry",
    "XidEntry",
    "XidLine",
    "codes_for",
    "load_recovery_actions",
    "load_sxid_catalogue",
    "load_xid_catalogue",
    "lookup",
    "parse_recovery_change",
    "parse_xid_line",
    "sxid_signature_tables",
    "xid_signature_tables",
]


class _Coded(Protocol):
    @property
    def code(self) -> int: ...


_Entry = TypeVar("_Entry", bound=_Coded)

# The signature id of application-class Xid lines (the job's own fault).
APPLICATION_XID = "xid-application"

KINDS = frozenset({"hardware", "application", "driver", "informational"})


@dataclass(frozen=True)
class XidEntry:
    code: int
    mnemonic: str
    description: str
    kind: str
    immediate_action: str
    category: Category


def parse_xid_catalogue(text: str, origin: str = "xid_catalogue.csv") -> dict[int, XidEntry]:
    def entry(row: dict[str, str]) -> XidEntry:
        return XidEntry(
            code=int(row["code"]),
            mnemonic=row["mnemonic"],
            description=row["description"],
            kind=row["kind"],
            immediate_action=row["immediate_action"],
            category=Category(row["category"]),
        )

    def unknown_kind(found: XidEntry) -> str | None:
        return None if found.kind in KINDS else f"kind {found.kind!r} not one of {sorted(KINDS)}"

    return _catalogue_rows(text, origin, "Xid", entry, unknown_kind)


def _catalogue_rows(
    text: str,
    origin: str,
    what: str,
    entry: Callable[[dict[str, str]], _Entry],
    problem: Callable[[_Entry], str | None] = lambda _: None,
) -> dict[int, _Entry]:
    """Each CSV row of a code catalogue through ``entry``, by code. A row that does not
    parse, that ``problem`` finds fault with, or whose code came before is a ConfigError
    naming the file and the line."""
    entries: dict[int, _Entry] = {}
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            found = entry(row)
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"{origin}:{number}: bad row: {exc}") from exc
        fault = problem(found)
        if fault is not None:
            raise ConfigError(f"{origin}:{number}: {fault}")
        if found.code in entries:
            raise ConfigError(f"{origin}:{number}: {what} {found.code} listed twice")
        entries[found.code] = found
    return entries


@cache
def load_xid_catalogue() -> dict[int, XidEntry]:
    text = resources.files("trainmedic.diagnosis").joinpath("data", "xid_catalogue.csv")
    return parse_xid_catalogue(text.read_text(encoding="utf-8"))


def lookup(code: int) -> XidEntry | None:
    return load_xid_catalogue().get(code)


@cache
def codes_for(category: Category) -> frozenset[int]:
    """Every Xid code the catalogue files under ``category``."""
    return frozenset(e.code for e in load_xid_catalogue().values() if e.category is category)


# How the driver names the GPU in an Xid line: PCI domain, bus, device ("0000:3b:00"; some
# drivers add the function; with MIG, the GPU instance: "0000:01:00 GPU-I:05"). One pattern for
# the log path (signatures.toml's [xid] regex, its {gpu} hole) and the kernel-line parser.
XID_GPU = r"(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?: GPU-I:\d+)?"
# The driver's kernel line: "NVRM: Xid (PCI:0000:3b:00): 48, pid=..., ...". The NVLink5 Xids
# (144-150, NVIDIA's bucket WORKFLOW_NVLINK5_ERR) print the unit and the severity next:
# "145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x... 0x...)".
_NVLINK5_UNIT = r", (?:pid=\S+, name=[^,]*, )?[A-Z][A-Z0-9_]*(?:/[A-Z][A-Z0-9_]*)? "
_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?" + XID_GPU + r"\): (?P<code>\d+)\b"
    r"(?:" + _NVLINK5_UNIT + r"(?P<severity>Nonfatal|Fatal) XC\d)?"
)
# The bucket of the Xids whose lines carry a severity of their own.
NVLINK5_BUCKET = "WORKFLOW_NVLINK5_ERR"


@dataclass(frozen=True)
class XidLine:
    code: int
    pci_bus_id: str  # as nvidia-smi names the GPU: 00000000:3B:00.0
    severity: str | None = None  # an NVLink5 Xid's own: "Fatal" or "Nonfatal"


def parse_xid_line(line: str) -> XidLine | None:
    """The Xid code and the GPU of a driver's Xid kernel line; None for any other line."""
    match = _XID_LINE.search(line)
    if match is None:
        return None
    code = log_number(match["code"])
    if code is None:
        return None
    address, _, function = match["pci"].partition(".")
    domain, bus, device = address.split(":")
    bus_id = f"{int(domain, 16):08X}:{bus.upper()}:{device.upper()}.{function or '0'}"
    return XidLine(code=code, pci_bus_id=bus_id, severity=match["severity"])


# Xid 154: the driver tells what the GPU now needs before it can be used again (NVML's
# recovery action), as "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset
# Required)". Informational about the Xid that caused it, which is logged beside it.
RECOVERY_XID = 154
_RECOVERY_CHANGE = re.compile(
    r"GPU recovery action changed from 0x[0-9a-fA-F]+\b.*?"
    r" to 0x(?P<after>[0-9a-fA-F]+)\b(?: \((?P<said>[^)]*)\))?"
)


@dataclass(frozen=True)
class RecoveryAction:
    """A recovery action NVML (and Xid 154) can report (``data/xid154_recovery_actions.csv``)."""

    code: int
    action: str  # NVML's name: NONE, GPU_RESET, NODE_REBOOT, DRAIN_P2P, ...
    meaning: str


def parse_recovery_actions(
    text: str, origin: str = "xid154_recovery_actions.csv"
) -> dict[int, RecoveryAction]:
    def entry(row: dict[str, str]) -> RecoveryAction:
        return RecoveryAction(code=int(row["code"]), action=row["action"], meaning=row["meaning"])

    return _catalogue_rows(text, origin, "recovery action", entry)


@cache
def load_recovery_actions() -> dict[int, RecoveryAction]:
    text = resources.files("trainmedic.diagnosis").joinpath("data", "xid154_recovery_actions.csv")
    return parse_recovery_actions(text.read_text(encoding="utf-8"))


@dataclass(frozen=True)
class RecoveryChange:
    """An Xid 154 line read: the recovery action the GPU needs now (None where the driver
    reported a code the table does not know) and the words the driver used for it."""

    code: int
    action: RecoveryAction | None
    said: str


def parse_recovery_change(line: str) -> RecoveryChange | None:
    """The new recovery action of a driver's Xid 154 line; None for any other line."""
    xid = parse_xid_line(line)
    match = _RECOVERY_CHANGE.search(line) if xid and xid.code == RECOVERY_XID else None
    if match is None:
        return None
    code = int(match["after"], 16)
    return RecoveryChange(
        code=code, action=load_recovery_actions().get(code), said=match["said"] or f"0x{code:x}"
    )


@dataclass(frozen=True)
class SxidEntry:
    """An NVSwitch SXid of the Fabric Manager user guide (``data/sxid_catalogue.csv``)."""

    code: int
    fatal: bool
    category: Category


def parse_sxid_catalogue(text: str, origin: str = "sxid_catalogue.csv") -> dict[int, SxidEntry]:
    def entry(row: dict[str, str]) -> SxidEntry:
        return SxidEntry(
            code=int(row["code"]),
            fatal={"true": True, "false": False}[row["fatal"]],
            category=Category(row["category"]),
        )

    return _catalogue_rows(text, origin, "SXid", entry)


@cache
def load_sxid_catalogue() -> dict[int, SxidEntry]:
    text = resources.files("trainmedic.diagnosis").joinpath("data", "sxid_catalogue.csv")
    return parse_sxid_catalogue(text.read_text(encoding="utf-8"))


# ------------------------------------------------------------------ generated signatures
#
# signatures.toml's [xid] and [sxid] tables: a regex template with a {codes} hole, a weight per
# category, one more weight (application Xids / non-fatal SXids) and examples. Each becomes
# signature tables (dicts, as [[signature]] entries are), one per group of codes.

_XID_CODE_RE = re.compile(r"Xid \([^)]*\):? *(\d+)\b")
# signature id, category, weight, codes, and the codes as the regex names them (None: "a|b")
_Group = tuple[str, Category, float, list[int], str | None]


def _code_table(
    table: dict[str, object], origin: str, name: str, other_weight: str
) -> tuple[str, dict[Category, float], float, list[str]]:
    try:
        template = str(table["regex"])
        weights = {Category(str(k)): float(v) for k, v in dict(table["weights"]).items()}  # type: ignore[call-overload]
        other = float(table[other_weight])  # type: ignore[arg-type]
        examples = [str(e) for e in table.get("examples", [])]  # type: ignore[attr-defined]
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{origin}: bad [{name}] table: {exc}") from exc
    return template, weights, other, examples


def _code_signature_tables(
    template: str, groups: list[_Group], examples: Callable[[list[int], str], list[str]]
) -> list[dict[str, object]]:
    """A signature table per group with codes; ``examples(codes, regex)``: the group's."""
    tables: list[dict[str, object]] = []
    for sig_id, category, weight, codes, pattern in groups:
        if not codes:
            continue
        regex = template.replace("{codes}", pattern or "|".join(map(str, codes)))
        tables.append(
            {
                "id": sig_id,
                "category": category.value,
                "weight": weight,
                "regex": regex,
                "examples": examples(codes, regex),
            }
        )
    return tables


def xid_signature_tables(
    table: dict[str, object], origin: str, xid: Mapping[int, XidEntry]
) -> list[dict[str, object]]:
    """One signature per category of NVIDIA's Xid catalogue (data/xid_catalogue.csv) that the
    ``[xid]`` table weighs; each example goes to the signature of its code."""
    template, weights, application_weight, examples = _code_table(
        table, origin, "xid", "application_weight"
    )
    # The template's {gpu} hole is how the driver names the GPU, as the kernel-line parser reads it.
    template = template.replace("{gpu}", XID_GPU)
    by_code: dict[int, list[str]] = {}
    for example in examples:
        found = _XID_CODE_RE.search(example)
        if found is None:
            raise ConfigError(f"{origin}: [xid] example without an Xid code: {example!r}")
        by_code.setdefault(int(found[1]), []).append(example)
    try:
        nonfatal_weight = float(table["nvlink5_nonfatal_weight"])  # type: ignore[arg-type]
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{origin}: bad [xid] table: {exc}") from exc
    # NVLink5 Xids name their severity. NVIDIA's decode sheet ("Xid 144-150 Decode") resolves the
    # non-fatal ones as IGNORE or as the Xid 154 beside them says, the fatal ones as RESET_GPU:
    # a non-fatal one is a signature of its own, weighed apart.
    five = sorted(c for c, e in xid.items() if e.immediate_action == NVLINK5_BUCKET)
    five_codes = "(?:" + "|".join(map(str, five)) + ")"
    nonfatal = five_codes + _NVLINK5_UNIT + r"Nonfatal\b"
    not_nonfatal = five_codes + "(?!" + _NVLINK5_UNIT + r"Nonfatal\b)"
    groups: list[_Group] = []
    for category, weight in weights.items():
        codes = sorted(c for c, e in xid.items() if e.category is category)
        codes = [c for c in codes if xid[c].kind != "application"]
        if not five or not set(five) <= set(codes):
            groups.append((f"xid-{category.value}", category, weight, codes, None))
            continue
        pattern = "|".join([*(str(c) for c in codes if c not in five), not_nonfatal])
        groups.append((f"xid-{category.value}", category, weight, codes, pattern))
        groups.append((f"xid-{category.value}-nonfatal", category, nonfatal_weight, five, nonfatal))
    # Application-class Xids: the job's own fault, told apart by their signature id so that
    # the remediation plan sends them to the owner and never to a drain.
    application = sorted(c for c, e in xid.items() if e.kind == "application")
    groups.append((APPLICATION_XID, Category.CUDAError, application_weight, application, None))

    def group_examples(codes: list[int], regex: str) -> list[str]:
        return [e for c in codes for e in by_code.get(c, []) if re.search(regex, e)]

    tables = _code_signature_tables(template, groups, group_examples)
    placed = {e for t in tables for e in t["examples"]}  # type: ignore[attr-defined]
    if lost := [e for e in examples if e not in placed]:
        raise ConfigError(f"{origin}: [xid] example no Xid signature matches: {lost[0]!r}")
    return tables


def sxid_signature_tables(table: dict[str, object], origin: str) -> list[dict[str, object]]:
    """The ``[sxid]`` table: per category of the SXid catalogue, one signature for its fatal
    codes (``weights``) and one for the others (``nonfatal_weight``). The switch's PCI address
    is not a GPU's: nothing is captured."""
    template, weights, nonfatal_weight, examples = _code_table(
        table, origin, "sxid", "nonfatal_weight"
    )
    sxid = load_sxid_catalogue()
    groups: list[_Group] = [
        (
            f"sxid-{category.value}{suffix}",
            category,
            w,
            sorted(c for c, e in sxid.items() if e.category is category and e.fatal is fatal),
            None,
        )
        for category, weight in weights.items()
        for fatal, suffix, w in ((True, "", weight), (False, "-nonfatal", nonfatal_weight))
    ]
    return _code_signature_tables(
        template, groups, lambda _, regex: [e for e in examples if re.search(regex, e)]
    )
