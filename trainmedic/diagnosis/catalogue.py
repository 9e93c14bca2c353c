"""The signature catalogue: ``signatures.toml`` loaded, validated and compiled once."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TypeVar

import ahocorasick

from trainmedic.core.errors import ConfigError, InputError
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis.envelope import anchored
from trainmedic.diagnosis.ere import python_regex_to_ere
from trainmedic.diagnosis.xid import (
    XidEntry,
    load_xid_catalogue,
    sxid_signature_tables,
    xid_signature_tables,
)

__all__ = [
    "MASK",
    "Catalogue",
    "Prefilter",
    "Role",
    "Signature",
    "build_catalogue",
    "byte_automaton",
    "load_catalogue",
    "mask_template",
]


class Role(StrEnum):
    cause = "cause"
    symptom = "symptom"
    context = "context"


@dataclass(frozen=True)
class Signature:
    id: str
    category: Category
    role: Role
    weight: float
    regex: re.Pattern[str]
    examples: tuple[str, ...]
    ere: str | None = None
    # The line reports another node's failure (slurmstepd on a surviving node): the file it
    # sits in names a witness, not the origin, so the hit takes no location from its source.
    witness: bool = False
    # The host the line names is the far end of a connection that broke, named by the other
    # end (NCCL's "Connection closed by remote peer node2", a refused connect): where to look
    # first, not proof of a fault there. The peer's process may have died of a bug of its own,
    # or the path between them failed; the pair test proves or clears it, nothing is drained.
    peer: bool = False
    # The line strengthens a diagnosis of its category that another (non-corroborating) cause
    # proves, and proves nothing alone: a job's exit code 137 is host OOM only beside a
    # kernel OOM line (scancel, preemption and KillWait send the same signal).
    corroborates: bool = False
    # Ids of signatures whose line, anywhere in the job, makes this one its aftermath: PyTorch's
    # heartbeat monitor fires when the watchdog hangs aborting a collective that already timed
    # out, so "watchdog got stuck" beside a real collective timeout is that timeout's, not a hang.
    aftermath_of: tuple[str, ...] = ()

    @property
    def grep_pattern(self) -> str:
        """The same signature as a POSIX ERE (GNU extensions), for the grep speed baseline."""
        return self.ere if self.ere is not None else python_regex_to_ere(self.regex.pattern)


def _build_mask() -> bytes:
    # Lowercase ASCII letters and fold every digit to "0": lines that differ only in their
    # numbers (steps, timestamps, losses, ranks) share one template and are checked once.
    table = bytearray(range(256))
    for upper in range(ord("A"), ord("Z") + 1):
        table[upper] = upper + 32
    for digit in range(ord("0"), ord("9") + 1):
        table[digit] = ord("0")
    return bytes(table)


MASK = _build_mask()


def mask_template(line: bytes) -> bytes:
    return line.translate(MASK)


_REGEX_SYNTAX = frozenset("\\.^$|?*+()[]{}")


def byte_automaton(words: Iterable[bytes]) -> ahocorasick.Automaton | None:
    """One Aho-Corasick automaton over byte strings (None for none), searched in a template's
    bytes decoded as latin-1; each match's value is the word's bytes."""
    ordered = sorted(set(words))
    if not ordered:
        return None
    automaton = ahocorasick.Automaton()
    for word in ordered:
        automaton.add_word(word.decode("latin-1"), word)
    automaton.make_automaton()
    return automaton


@dataclass(frozen=True)
class Prefilter:
    """Whether a masked template holds one of the ``[prefilter].anchors``. ``re`` tries each
    branch of an alternation at each position, so one regex of two hundred anchors costs tens
    of microseconds a line: on a noisy log, with thousands of distinct templates, a third of
    the time. The anchors that are plain text (most of them) are found by one Aho-Corasick
    pass instead; only the few real regexes run as ``re``."""

    anchors: tuple[str, ...]
    _texts: ahocorasick.Automaton | None = field(init=False, repr=False, compare=False)
    _regexes: re.Pattern[bytes] | None = field(init=False, repr=False, compare=False)
    _starts: re.Pattern[bytes] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regexes = [a for a in self.anchors if _REGEX_SYNTAX.intersection(a)]
        object.__setattr__(
            self, "_texts", byte_automaton(a.encode() for a in self.anchors if a not in regexes)
        )
        for name, chosen in (("_regexes", regexes), ("_starts", list(filter(anchored, regexes)))):
            joined = "|".join(f"(?:{a})" for a in chosen).encode()
            object.__setattr__(self, name, re.compile(joined) if chosen else None)

    def search(self, template: bytes) -> bool:
        if self._texts is not None and next(self._texts.iter(template.decode("latin-1")), None):
            return True
        return self._regexes is not None and self._regexes.search(template) is not None

    def search_starts(self, template: bytes) -> bool:
        """Whether an anchor tied to a line's start matches (the template of a message)."""
        return self._starts is not None and self._starts.search(template) is not None


@dataclass(frozen=True)
class Catalogue:
    signatures: tuple[Signature, ...]
    anchors: tuple[str, ...]
    prefilter: Prefilter  # searched in masked templates, never in raw lines
    # NVIDIA's Xid catalogue as this site reads it (overrides merged): logs and telemetry.
    xid: Mapping[int, XidEntry] = field(default_factory=dict, compare=False, hash=False)

    def xid_codes(self, category: Category) -> frozenset[int]:
        """Every Xid code filed under ``category``."""
        return frozenset(code for code, e in self.xid.items() if e.category is category)

    def by_id(self, signature_id: str) -> Signature:
        for signature in self.signatures:
            if signature.id == signature_id:
                return signature
        raise KeyError(signature_id)

    def passes_prefilter(self, line: str) -> bool:
        return self.prefilter.search(mask_template(line.encode("utf-8", "replace")))


# The fields of a [[signature]] table, in signatures.toml and in a site's overlay alike.
SIGNATURE_FIELDS = frozenset(
    {
        "id",
        "category",
        "role",
        "weight",
        "regex",
        "examples",
        "ere",
        "witness",
        "peer",
        "corroborates",
        "aftermath_of",
    }
)
E = TypeVar("E", bound=StrEnum)


def choice(field: str, value: object, enum: type[E]) -> E:
    """``value`` as a member of ``enum``, else an InputError naming ``field``."""
    try:
        return enum(str(value))
    except ValueError:
        raise InputError(field, value, f"not one of {[m.value for m in enum]}") from None


def signature_from_table(table: object, field: str) -> Signature:
    """The signature one ``[[signature]]`` table describes (signatures.toml or a site's
    overlay). Anything wrong is an InputError naming ``<field>.<key>`` and its value."""
    if not isinstance(table, dict):
        raise InputError(field, table, "must be a table")
    unknown = sorted(set(table) - SIGNATURE_FIELDS)
    if unknown:
        raise InputError(f"{field}.{unknown[0]}", table[unknown[0]], "not a signature field")
    for name in ("id", "category", "regex"):
        if not isinstance(table.get(name), str) or not table[name]:
            raise InputError(f"{field}.{name}", table.get(name), "required, a non-empty string")
    category = choice(f"{field}.category", table["category"], Category)
    role = choice(f"{field}.role", table.get("role", "cause"), Role)
    weight = table.get("weight", 0.5)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:
        raise InputError(f"{field}.weight", weight, "a number from 0 to 1")
    try:
        regex = re.compile(table["regex"])
    except re.error as exc:
        raise InputError(f"{field}.regex", table["regex"], f"bad regex: {exc}") from exc
    examples = table.get("examples", [])
    if not isinstance(examples, list) or not all(isinstance(e, str) for e in examples):
        raise InputError(f"{field}.examples", examples, "a list of example lines (strings)")
    for name, kind in (("ere", str), ("witness", bool), ("peer", bool), ("corroborates", bool)):
        if name in table and not isinstance(table[name], kind):
            raise InputError(f"{field}.{name}", table[name], f"must be a {kind.__name__}")
    aftermath_of = table.get("aftermath_of", [])
    if not isinstance(aftermath_of, list) or not all(isinstance(a, str) for a in aftermath_of):
        raise InputError(f"{field}.aftermath_of", aftermath_of, "a list of signature ids")
    return Signature(
        id=table["id"],
        category=category,
        role=role,
        weight=float(weight),
        regex=regex,
        examples=tuple(examples),
        ere=table.get("ere"),
        witness=table.get("witness", False),
        peer=table.get("peer", False),
        corroborates=table.get("corroborates", False),
        aftermath_of=tuple(aftermath_of),
    )


def _packaged(table: object, field: str) -> Signature:
    """A signature of the catalogue's own data: a fault in it is the installation's."""
    try:
        return signature_from_table(table, field)
    except InputError as exc:
        raise ConfigError(str(exc)) from exc


def parse_catalogue(text: str, origin: str = "signatures.toml") -> Catalogue:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc
    return build_catalogue(data, origin)


def build_catalogue(
    data: dict[str, object],
    origin: str = "signatures.toml",
    xid: Mapping[int, XidEntry] | None = None,
    replacing: Mapping[str, Signature] | None = None,
) -> Catalogue:
    """The catalogue of a parsed signatures.toml; ``xid``: the Xid catalogue to generate the
    Xid signatures from (NVIDIA's by default); ``replacing``: signatures that take the place
    of those with their id (a site's overlay), the others of it come last."""
    xid = load_xid_catalogue() if xid is None else xid
    generated = [
        *(xid_signature_tables(data["xid"], origin, xid) if "xid" in data else []),  # type: ignore[arg-type]
        *(sxid_signature_tables(data["sxid"], origin) if "sxid" in data else []),  # type: ignore[arg-type]
    ]
    built = [
        *(_packaged(t, f"{origin}: {t['id']}") for t in generated),
        *(
            _packaged(t, f"{origin}: signature[{n}]")
            for n, t in enumerate(data.get("signature", []))  # type: ignore[attr-defined]
        ),
    ]
    replacing = dict(replacing or {})
    built = [replacing.pop(s.id, s) for s in built]
    signatures = (*built, *replacing.values())
    ids = [s.id for s in signatures]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigError(f"{origin}: duplicate signature ids {duplicates}")
    anchors = tuple(str(a) for a in data.get("prefilter", {}).get("anchors", []))  # type: ignore[attr-defined]
    if not anchors:
        raise ConfigError(f"{origin}: [prefilter].anchors is empty")
    if "" in anchors:  # it would let every line through
        raise ConfigError(f"{origin}: [prefilter].anchors holds an empty anchor")
    try:
        prefilter = Prefilter(anchors)
    except re.error as exc:
        raise ConfigError(f"{origin}: bad prefilter anchor: {exc}") from exc
    return Catalogue(signatures=signatures, anchors=anchors, prefilter=prefilter, xid=dict(xid))


@cache
def load_catalogue(path: str | None = None) -> Catalogue:
    """The packaged catalogue, or the TOML file at ``path``."""
    if path is None:
        text = resources.files("trainmedic.diagnosis").joinpath("signatures.toml").read_text()
        return parse_catalogue(text)
    return parse_catalogue(Path(path).read_text(encoding="utf-8"), origin=path)
