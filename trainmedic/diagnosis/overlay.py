"""A site's overlay of the signature catalogue: operators extend the diagnosis without Python.

The setting ``signatures_overlay`` (``TRAINMEDIC_SIGNATURES_OVERLAY``) names a TOML file in the
format of ``signatures.toml`` (see ``data/README.md``): ``[[signature]]`` tables (a new id is
added, a known id replaced), ``[prefilter].anchors`` (added to the packaged ones) and
``[xid.overrides]`` (Xid code -> category, or ``{ category = ..., kind = ... }``). It is read
and merged once. Anything wrong in it is one :class:`InputError` naming the file, the field
and the value; an example no prefilter anchor lets through is such an error, since the
signature would never see a line.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from enum import StrEnum
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TypeVar

from trainmedic.core.errors import ConfigError, InputError
from trainmedic.core.settings import get_settings
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis.catalogue import (
    Catalogue,
    Role,
    Signature,
    build_catalogue,
    load_catalogue,
    mask_template,
)
from trainmedic.diagnosis.xid import KINDS, XidEntry, load_xid_catalogue

__all__ = ["load_with_overlay", "merge", "site_catalogue"]

E = TypeVar("E", bound=StrEnum)

_TOP_LEVEL = {"signature", "prefilter", "xid"}
_SIGNATURE_KEYS = {
    "id",
    "category",
    "role",
    "weight",
    "regex",
    "examples",
    "ere",
    "witness",
    "peer",
}


def site_catalogue() -> Catalogue:
    """The catalogue the engine uses: the packaged one with the settings' overlay merged."""
    overlay = get_settings().signatures_overlay
    return load_with_overlay(str(overlay)) if overlay is not None else load_catalogue()


@cache
def load_with_overlay(path: str) -> Catalogue:
    """The packaged catalogue with the overlay file at ``path`` merged (read once per path)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InputError("signatures_overlay", path, f"cannot be read: {reason}") from exc
    try:
        overlay = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(path, "(file)", f"not valid TOML: {exc}") from exc
    packaged = resources.files("trainmedic.diagnosis").joinpath("signatures.toml").read_text()
    return merge(tomllib.loads(packaged), overlay, path)


def merge(packaged: dict[str, object], overlay: dict[str, object], path: str) -> Catalogue:
    unknown = sorted(set(overlay) - _TOP_LEVEL)
    if unknown:
        raise InputError(f"{path}: {unknown[0]}", overlay[unknown[0]], "not an overlay table")
    anchors = _anchors(overlay.get("prefilter", {}), path)
    data = dict(packaged)
    prefilter = dict(packaged.get("prefilter", {}))  # type: ignore[call-overload]
    prefilter["anchors"] = [*prefilter.get("anchors", []), *anchors]
    data["prefilter"] = prefilter
    xid = _xid(overlay.get("xid", {}), path)
    try:
        base = build_catalogue(data, "signatures.toml", xid=xid)
    except ConfigError as exc:  # packaged data with the site's Xid table or anchors
        raise InputError(path, "(merged)", str(exc)) from exc
    replacing = {}
    tables = overlay.get("signature", [])
    if not isinstance(tables, list):
        raise InputError(f"{path}: signature", tables, "must be [[signature]] tables")
    for number, table in enumerate(tables):
        signature = _signature(table, f"{path}: signature[{number}]", base)
        if signature.id in replacing:
            raise InputError(f"{path}: signature[{number}].id", signature.id, "given twice")
        replacing[signature.id] = signature
    return build_catalogue(data, "signatures.toml", xid=xid, replacing=replacing)


def _anchors(table: object, path: str) -> list[str]:
    if not isinstance(table, dict) or set(table) - {"anchors"}:
        raise InputError(f"{path}: prefilter", table, "only `anchors = [...]` may be given")
    anchors = table.get("anchors", [])
    if not isinstance(anchors, list):
        raise InputError(f"{path}: prefilter.anchors", anchors, "must be a list of regexes")
    for number, anchor in enumerate(anchors):
        field = f"{path}: prefilter.anchors[{number}]"
        if not isinstance(anchor, str) or not anchor:
            raise InputError(field, anchor, "must be a non-empty regex string")
        try:
            re.compile(anchor.encode())
        except re.error as exc:
            raise InputError(field, anchor, f"bad regex: {exc}") from exc
        if anchor != anchor.lower() and "\\" not in anchor:
            raise InputError(field, anchor, "templates are lowercased: write the anchor so")
    return anchors


def _xid(table: object, path: str) -> dict[int, XidEntry]:
    xid = dict(load_xid_catalogue())
    if not isinstance(table, dict) or set(table) - {"overrides"}:
        raise InputError(f"{path}: xid", table, "only `[xid.overrides]` may be given")
    overrides = table.get("overrides", {})
    if not isinstance(overrides, dict):
        raise InputError(f"{path}: xid.overrides", overrides, "must be a table code = category")
    for key, value in overrides.items():
        field = f"{path}: xid.overrides.{key}"
        if not key.isdigit() or not 0 < int(key) < 100_000:
            raise InputError(field, key, "an Xid code is a positive number")
        spec = {"category": value} if isinstance(value, str) else value
        if (
            not isinstance(spec, dict)
            or not spec.get("category")
            or set(spec) - {"category", "kind"}
        ):
            raise InputError(field, value, 'give a category, or { category = "...", kind = "..." }')
        category = _choice(f"{field}.category", spec["category"], Category)
        code = int(key)
        kind = spec.get("kind", xid[code].kind if code in xid else "hardware")
        if kind not in KINDS:
            raise InputError(f"{field}.kind", kind, f"not one of {sorted(KINDS)}")
        entry = xid.get(code) or XidEntry(
            code, "SITE", "added by the site overlay", kind, "", category
        )
        xid[code] = dataclasses.replace(entry, category=category, kind=kind)
    return xid


def _choice(field: str, value: object, enum: type[E]) -> E:
    try:
        return enum(str(value))
    except ValueError:
        raise InputError(field, value, f"not one of {[m.value for m in enum]}") from None


def _signature(table: object, field: str, base: Catalogue) -> Signature:
    if not isinstance(table, dict):
        raise InputError(field, table, "must be a table")
    unknown = sorted(set(table) - _SIGNATURE_KEYS)
    if unknown:
        raise InputError(f"{field}.{unknown[0]}", table[unknown[0]], "not a signature field")
    for name in ("id", "category", "regex"):
        if not isinstance(table.get(name), str) or not table[name]:
            raise InputError(f"{field}.{name}", table.get(name), "required, a non-empty string")
    category = _choice(f"{field}.category", table["category"], Category)
    role = _choice(f"{field}.role", table.get("role", "cause"), Role)
    weight = table.get("weight", 0.5)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:
        raise InputError(f"{field}.weight", weight, "a number from 0 to 1")
    try:
        regex = re.compile(table["regex"])
    except re.error as exc:
        raise InputError(f"{field}.regex", table["regex"], f"bad regex: {exc}") from exc
    examples = table.get("examples")
    if (
        not isinstance(examples, list)
        or not examples
        or not all(isinstance(e, str) for e in examples)
    ):
        raise InputError(f"{field}.examples", examples, "at least one example line (a string)")
    for number, example in enumerate(examples):
        where = f"{field}.examples[{number}]"
        if not regex.search(example):
            raise InputError(where, example, "the regex does not match it")
        if not base.prefilter.search(mask_template(example.encode("utf-8", "replace"))):
            raise InputError(where, example, "no prefilter anchor lets it through: add one")
    for name, kind in (("ere", str), ("witness", bool), ("peer", bool)):
        if name in table and not isinstance(table[name], kind):
            raise InputError(f"{field}.{name}", table[name], f"must be a {kind.__name__}")
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
    )
