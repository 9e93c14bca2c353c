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
from dataclasses import dataclass
from functools import cache
from importlib import resources

from trainmedic.core.errors import ConfigError
from trainmedic.core.taxonomy import Category

__all__ = [
    "APPLICATION_XID",
    "SxidEntry",
    "XidEntry",
    "XidLine",
    "codes_for",
    "load_sxid_catalogue",
    "load_xid_catalogue",
    "lookup",
    "parse_xid_line",
    "sxid_signature_tables",
]

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
    entries: dict[int, XidEntry] = {}
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            entry = XidEntry(
                code=int(row["code"]),
                mnemonic=row["mnemonic"],
                description=row["description"],
                kind=row["kind"],
                immediate_action=row["immediate_action"],
                category=Category(row["category"]),
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"{origin}:{number}: bad row: {exc}") from exc
        if entry.kind not in KINDS:
            raise ConfigError(f"{origin}:{number}: kind {entry.kind!r} not one of {sorted(KINDS)}")
        if entry.code in entries:
            raise ConfigError(f"{origin}:{number}: Xid {entry.code} listed twice")
        entries[entry.code] = entry
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


# The driver's kernel line: "NVRM: Xid (PCI:0000:3b:00): 48, pid=..., ..." (PCI domain, bus,
# device of the GPU; some drivers add the function).
_XID_LINE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<device>[0-9a-fA-F]{2})(?:\.(?P<function>[0-7]))?\): (?P<code>\d+)\b"
)


@dataclass(frozen=True)
class XidLine:
    code: int
    pci_bus_id: str  # as nvidia-smi names the GPU: 00000000:3B:00.0


def parse_xid_line(line: str) -> XidLine | None:
    """The Xid code and the GPU of a driver's Xid kernel line; None for any other line."""
    match = _XID_LINE.search(line)
    if match is None:
        return None
    bus_id = (
        f"{int(match['domain'], 16):08X}:{match['bus'].upper()}:{match['device'].upper()}"
        f".{match['function'] or '0'}"
    )
    return XidLine(code=int(match["code"]), pci_bus_id=bus_id)


@dataclass(frozen=True)
class SxidEntry:
    """An NVSwitch SXid of the Fabric Manager user guide (``data/sxid_catalogue.csv``)."""

    code: int
    fatal: bool
    category: Category


def parse_sxid_catalogue(text: str, origin: str = "sxid_catalogue.csv") -> dict[int, SxidEntry]:
    entries: dict[int, SxidEntry] = {}
    for number, row in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        try:
            entry = SxidEntry(
                code=int(row["code"]),
                fatal={"true": True, "false": False}[row["fatal"]],
                category=Category(row["category"]),
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"{origin}:{number}: bad row: {exc}") from exc
        if entry.code in entries:
            raise ConfigError(f"{origin}:{number}: SXid {entry.code} listed twice")
        entries[entry.code] = entry
    return entries


@cache
def load_sxid_catalogue() -> dict[int, SxidEntry]:
    text = resources.files("trainmedic.diagnosis").joinpath("data", "sxid_catalogue.csv")
    return parse_sxid_catalogue(text.read_text(encoding="utf-8"))


def sxid_signature_tables(table: dict[str, object], origin: str) -> list[dict[str, object]]:
    """The ``[sxid]`` table of signatures.toml as signature tables: per category of the SXid
    catalogue, one for its fatal codes (``weights``) and one for the others
    (``nonfatal_weight``). The switch's PCI address is not a GPU's: nothing is captured."""
    try:
        template = str(table["regex"])
        weights = {Category(str(k)): float(v) for k, v in dict(table["weights"]).items()}  # type: ignore[call-overload]
        nonfatal_weight = float(table["nonfatal_weight"])  # type: ignore[arg-type]
        examples = [str(e) for e in table.get("examples", [])]  # type: ignore[attr-defined]
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{origin}: bad [sxid] table: {exc}") from exc
    sxid = load_sxid_catalogue()
    tables: list[dict[str, object]] = []
    for category, weight in weights.items():
        for fatal, suffix, w in ((True, "", weight), (False, "-nonfatal", nonfatal_weight)):
            codes = sorted(
                c for c, e in sxid.items() if e.category is category and e.fatal is fatal
            )
            if not codes:
                continue
            regex = template.replace("{codes}", "|".join(map(str, codes)))
            tables.append(
                {
                    "id": f"sxid-{category.value}{suffix}",
                    "category": category.value,
                    "weight": w,
                    "regex": regex,
                    "examples": [e for e in examples if re.search(regex, e)],
                }
            )
    return tables
