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
from functools import cache
from importlib import resources
from pathlib import Path

from trainmedic.core.errors import ConfigError, InputError
from trainmedic.core.settings import get_settings
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis.catalogue import (
    Catalogue,
    Signature,
    build_catalogue,
    choice,
    load_catalogue,
    mask_template,
    signature_from_table,
)
from trainmedic.diagnosis.xid import KINDS, XidEntry, load_xid_catalogue

__all__ = ["load_with_overlay", "merge", "site_catalogue"]

_TOP_LEVEL = {"signature", "prefilter", "xid"}


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
        category = choice(f"{field}.category", spec["category"], Category)
        code = int(key)
        kind = spec.get("kind", xid[code].kind if code in xid else "hardware")
        if kind not in KINDS:
            raise InputError(f"{field}.kind", kind, f"not one of {sorted(KINDS)}")
        entry = xid.get(code) or XidEntry(
            code, "SITE", "added by the site overlay", kind, "", category
        )
        xid[code] = dataclasses.replace(entry, category=category, kind=kind)
    return xid


def _signature(table: object, field: str, base: Catalogue) -> Signature:
    """A site's signature: besides what any signature must be, it brings at least one example,
    which its regex matches and the prefilter lets through (else it never sees a line)."""
    signature = signature_from_table(table, field)
    if not signature.examples:
        given = table.get("examples") if isinstance(table, dict) else None
        raise InputError(f"{field}.examples", given, "at least one example line (a string)")
    for number, example in enumerate(signature.examples):
        where = f"{field}.examples[{number}]"
        if not signature.regex.search(example):
            raise InputError(where, example, "the regex does not match it")
        if not base.prefilter.search(mask_template(example.encode("utf-8", "replace"))):
            raise InputError(where, example, "no prefilter anchor lets it through: add one")
    return signature
