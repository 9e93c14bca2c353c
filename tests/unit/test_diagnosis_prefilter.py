"""Every alternative of every signature reaches its signature through the prefilter.

A line is only looked at when its template holds a prefilter anchor (``signatures.toml``,
``[prefilter].anchors``): a regex alternative no anchor covers matches in theory and never in
practice. For each signature this generates lines from its regex, one per branch of every
alternation (``(?:failure|pending|failed)`` gives three), checks the regex matches each, and
that scanning the line alone yields a hit of that signature. And every real line of the dev
corpus that a signature's regex matches gets past the prefilter (generated lines take one
spelling of each branch; real logs pad, wrap and spell them otherwise).
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

import pytest
from support.corpus import dev_lines

from trainmedic.diagnosis import LogSource, Signature, load_catalogue
from trainmedic.diagnosis.scan import scan_source

CATALOGUE = load_catalogue()
FILLERS = "x0 :_-./=a"  # tried in order where a class or "." needs some character


def _in_class(char: str, items: list) -> bool:
    negate = False
    found = False
    for op, arg in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            found |= char == chr(arg)
        elif op is sre.RANGE:
            found |= arg[0] <= ord(char) <= arg[1]
        elif op is sre.CATEGORY:
            found |= {
                sre.CATEGORY_DIGIT: char.isdigit(),
                sre.CATEGORY_NOT_DIGIT: not char.isdigit(),
                sre.CATEGORY_SPACE: char.isspace(),
                sre.CATEGORY_NOT_SPACE: not char.isspace(),
                sre.CATEGORY_WORD: char.isalnum() or char == "_",
                sre.CATEGORY_NOT_WORD: not (char.isalnum() or char == "_"),
            }[arg]
        else:
            raise AssertionError(f"class item {op} not handled")
    return found != negate


def _class_char(items: list, pad: bool) -> str:
    natural = [chr(a) for op, a in items if op is sre.LITERAL] + [
        chr(a[0]) for op, a in items if op is sre.RANGE
    ]
    order = (" ", *natural, *FILLERS) if pad else (*natural, *FILLERS)
    for char in order:
        if _in_class(char, items):
            return char
    raise AssertionError(f"no character for class {items}")


def _variants(tree, pad: bool) -> list[str]:
    """Strings covering every branch of every alternation in ``tree`` at least once."""
    parts = [_node_variants(op, arg, pad) for op, arg in tree]
    width = max((len(p) for p in parts), default=1)
    return ["".join(p[min(k, len(p) - 1)] for p in parts) for k in range(width)]


def _node_variants(op, arg, pad: bool) -> list[str]:
    if op is sre.LITERAL:
        return [chr(arg)]
    if op is sre.NOT_LITERAL:
        return [next(c for c in FILLERS if c != chr(arg))]
    if op is sre.ANY:
        return [" " if pad else "x"]
    if op is sre.IN:
        return [_class_char(arg, pad)]
    if op is sre.BRANCH:
        return [v for branch in arg[1] for v in _variants(branch, pad)]
    if op is sre.SUBPATTERN:
        return _variants(arg[-1], pad)
    if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
        low, _high, item = arg
        inner = _variants(item, pad)
        if low:
            return [v * low for v in inner]
        single = len(item) == 1 and item[0][0] in (sre.ANY, sre.IN)
        return [inner[0] if pad and single else "", *inner]
    if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
        return [""]
    raise AssertionError(f"opcode {op} not handled: give the signature an example instead")


def generated_lines(signature: Signature) -> tuple[list[str], list[str]]:
    """(lines the regex matches, variants no line could be made for)."""
    tree = sre_parse.parse(signature.regex.pattern, signature.regex.flags)
    plain, padded = _variants(list(tree), pad=False), _variants(list(tree), pad=True)
    lines, missing = [], []
    for first, second in zip(plain, padded, strict=True):
        line = next((c for c in (first, second, f" {second} ") if signature.regex.search(c)), None)
        if line is None:
            missing.append(first)
        else:
            lines.append(line)
    return lines, missing


def _top_level_alternatives(signature: Signature) -> int:
    tree = list(sre_parse.parse(signature.regex.pattern, signature.regex.flags))
    return len(tree[0][1][1]) if len(tree) == 1 and tree[0][0] is sre.BRANCH else 1


def _reaches(signature: Signature, line: str) -> bool:
    scan = scan_source(LogSource.from_text("generated.log", line), 0, CATALOGUE)
    return scan.count(signature.id) > 0


@pytest.mark.parametrize("signature", CATALOGUE.signatures, ids=lambda s: s.id)
def test_every_alternative_reaches_its_signature(signature: Signature) -> None:
    lines, missing = generated_lines(signature)
    assert not missing, f"{signature.id}: no matching line generated from {missing}"
    assert len(lines) >= _top_level_alternatives(signature)
    unreached = [line for line in lines if not _reaches(signature, line)]
    assert not unreached, (
        f"{signature.id}: the prefilter stops {len(unreached)} of {len(lines)} generated "
        f"lines, e.g. {unreached[:5]}"
    )


def test_generator_covers_inner_alternatives() -> None:
    row_remap = CATALOGUE.by_id("ecc-row-remap")
    lines, missing = generated_lines(row_remap)
    assert not missing
    assert any("pending" in line for line in lines)
    assert any(line.startswith("volatile dbe") for line in lines)
    assert all(row_remap.regex.search(line) for line in lines)


def test_a_line_no_anchor_covers_does_not_reach() -> None:
    # The check above can fail: a signature whose regex matches a line without an anchor.
    signature = CATALOGUE.by_id("nccl-warn")
    assert not _reaches(signature, "NCCL INFO all fine")
    assert re.search("NCCL WARN", "NCCL WARN x") and _reaches(signature, "NCCL WARN x")


def test_no_real_line_a_signature_matches_is_stopped_by_the_prefilter() -> None:
    """ "Loss    nan" (columns padded with spaces) matched nan-loss-value and never reached it."""
    stopped = []
    for line in dev_lines():
        if CATALOGUE.passes_prefilter(line):
            continue
        stopped += [(s.id, line) for s in CATALOGUE.signatures if s.regex.search(line)]
    assert not stopped, f"{len(stopped)} corpus lines the prefilter stops, e.g. {stopped[:5]}"
