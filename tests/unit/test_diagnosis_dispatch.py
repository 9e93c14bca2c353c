"""The dispatch of flagged lines: same verdicts as running every signature, hits from real lines."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest
from support.corpus import dev_lines

from trainmedic.diagnosis import LogSource, load_catalogue
from trainmedic.diagnosis import dispatch as dispatch_module
from trainmedic.diagnosis.catalogue import MASK, Prefilter
from trainmedic.diagnosis.dispatch import DIGITS, Dispatch, line_text, searches
from trainmedic.diagnosis.envelope import messages
from trainmedic.diagnosis.regex_facts import (
    NON_ASCII_FOLDS,
    digit_blind,
    digit_relaxed,
    required_factors,
    split_alternatives,
)
from trainmedic.diagnosis.scan import scan_source

sys.path.insert(0, str(Path(__file__).parent))
from test_diagnosis_prefilter import generated_lines

CATALOGUE = load_catalogue()


def _every_signature(raw: bytes) -> list[str]:
    """Every signature that matches the line or a message inside its envelope."""
    text = line_text(raw)
    inner = messages(text)
    return [s.id for s in CATALOGUE.signatures if searches(s.regex, text, inner)]


def _dispatched(dispatch: Dispatch, raw: bytes) -> list[str]:
    text = line_text(raw)
    inner = messages(text)
    return [
        s.id
        for s, alternatives in dispatch.verdict(raw)
        if alternatives is None or any(searches(r, text, inner) for r in alternatives)
    ]


# How a line reaches the reader: timestamped, tagged by a launcher, coloured, shipped as JSON.
WRAPPERS = (
    lambda line: f"2025-03-04T05:06:07.123Z {line}",
    lambda line: f"[2025-03-04 05:06:07,123] INFO: {line}",
    lambda line: f"12: {line}",
    lambda line: f"[1,12]<stderr>:{line}",
    lambda line: f"> {line}",
    lambda line: f"    {line}",
    lambda line: f"E0813 06:19:49.809000 161210 api.py:869] {line}",
    lambda line: line.replace("Error", "\x1b[31mError\x1b[0m", 1),
    lambda line: json.dumps({"log": line + "\n", "stream": "stderr"}, ensure_ascii=False),
)


def _forms(line: str, rng: random.Random) -> list[str]:
    """The line as it also comes: other numbers, capitals, a \r inside, in an envelope."""
    forms = [
        re.sub(r"\d", lambda _: str(rng.randrange(10)), line),
        line.upper(),
        line.replace(" ", "\r", 1),
        rng.choice(WRAPPERS)(line),
    ]
    return [form for form in dict.fromkeys(forms) if form != line]


def _lines() -> list[str]:
    """Every distinct real line, every line a signature is written to match, and other forms of
    them: all forms of the signatures' lines, one form (drawn) of each real line. A form of
    every real line would double the three slowest checks of the unit tier for little: the
    real lines differ from one another far more than their forms do."""
    made = [e for s in CATALOGUE.signatures for e in s.examples]
    made += [g for s in CATALOGUE.signatures for g in generated_lines(s)[0]]
    rng = random.Random(5)
    varied = [form for line in dict.fromkeys(made) for form in _forms(line, rng)]
    for line in dev_lines():
        if forms := _forms(line, rng):
            varied.append(rng.choice(forms))
    return list(dict.fromkeys([*dev_lines(), *made, *varied]))


def test_verdicts_are_those_of_every_signature_on_the_real_line() -> None:
    dispatch = Dispatch(CATALOGUE.signatures)
    lines = _lines()
    assert len(lines) > 2000
    # the second pass (a sample of it: the check is slow) answers from the cache
    for line in lines + random.Random(3).sample(lines, 5000):
        raw = line.encode("utf-8", "surrogateescape")
        assert _dispatched(dispatch, raw) == _every_signature(raw), line
    assert dispatch.verdicts  # the cache was used


@pytest.mark.parametrize(
    "line",
    [
        # A dotless i: (?i) matches it, the template's MASK does not fold it.
        "NVL\u0131nk: fatal error detected on link 3",
        "GPU 0000:3b:00.0: row remapping pending",
        "volatile dbe: 2",
        "volatile dbe: 0",  # the same digit-masked line as the one above, another verdict
        "exit code 139",
        "exit code 138",
        "OSError: [Errno 28] No space left on device",
        "OSError: [Errno 29] something else",
        "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",
    ],
)
def test_digit_sensitive_and_folded_lines(line: str) -> None:
    dispatch = Dispatch(CATALOGUE.signatures)
    raw = line.encode()
    for _ in range(2):
        assert _dispatched(dispatch, raw) == _every_signature(raw)


def test_numbers_share_a_verdict_but_hits_come_from_the_real_line() -> None:
    lines = [f"node{n:03d}:1:2 [{n % 8}] NCCL WARN Connection refused" for n in range(10)]
    scan = scan_source(LogSource.from_text("launcher.log", "\n".join(lines)), 0, CATALOGUE)
    assert scan.count("nccl-warn") == 10
    hits = [h for h in scan.hits() if h.signature.id == "nccl-warn"]
    assert [h.host for h in hits] == [
        "node000",
        "node001",
        "node002",
        "node007",
        "node008",
        "node009",
    ]
    assert [h.gpu for h in hits] == ["0", "1", "2", "7", "0", "1"]
    assert [h.line for h in hits] == [1, 2, 3, 8, 9, 10]
    assert hits[-1].text == lines[-1]


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch_module, "MAX_VERDICTS", 16)
    dispatch = Dispatch(CATALOGUE.signatures)
    for n in range(100):
        dispatch.verdict(f"NCCL WARN peer 0x{n:x}{'abcdef'[n % 6]} lost".encode())
    assert len(dispatch.verdicts) == 16
    dispatch.verdict(b"NCCL WARN " + b"x" * (dispatch_module.MAX_KEY_BYTES + 1))
    assert len(dispatch.verdicts) == 16


def test_digit_blindness() -> None:
    assert digit_blind(r"GPU \d+ has a total capacity of")
    assert digit_blind(r"[0-9a-fA-F]{4}:\w+ \S+ .{0,9}\b")
    assert digit_blind(r"NCCL WARN(?![0-9])")
    assert not digit_blind(r"Signal 11\b")
    assert not digit_blind(r"volatile dbe\s*[:=]\s*[1-9]")
    assert not digit_blind(r"(?:-9|137)")
    assert not digit_blind(r"[^5]")
    assert not digit_blind(r"(\d)\1")  # a backreference tells digits apart


def test_digit_relaxed_twins() -> None:
    assert digit_relaxed(r"GPU \d+ lost") is None  # blind already: no twin needed
    assert digit_relaxed(r"(\d)\1") is None  # a backreference: no sound twin
    assert digit_relaxed(r"(?>1|1x)y") is None  # atomic: widening may change what it keeps
    xid = digit_relaxed(r"Xid \S+: 79\b")
    assert xid is not None and xid.search("Xid (PCI:0000:3b:00): 00, pid=0")
    assert not xid.search("Xid (PCI:0000:3b:00): pid=0")
    # A negative lookbehind that tells digits apart is dropped: the twin accepts more.
    behind = digit_relaxed(r"(?<!1)x2")
    assert behind is not None and behind.search("0x0")
    negated = digit_relaxed(r"code [^5]\b")
    assert negated is not None and negated.search("code 0")
    assert digit_relaxed(r"(?i)EXIT code 137").search("exit CODE 000")


def test_digit_relaxed_twins_match_wherever_their_regex_does() -> None:
    """The dispatch caches "no" for a line form its twin misses: sound only if the twin
    matches the masked line wherever the regex matches the real one."""
    tables = Dispatch(CATALOGUE.signatures).tables
    twins = [a for a in tables.alternatives if a.relaxed is not None]
    assert len(twins) >= 10
    lines = _lines()
    raws = [line.encode("utf-8", "surrogateescape") for line in lines]
    lines = [line_text(raw) for raw in raws]  # as the signatures see them
    masked = [line_text(raw.translate(DIGITS)) for raw in raws]
    # and the messages inside their envelopes, which the signatures are run on too
    for line, masked_line in list(zip(lines, masked, strict=True)):
        lines.extend(messages(line))
        masked.extend(messages(masked_line))
    for alternative in twins:
        pattern, twin = alternative.regex.pattern, alternative.relaxed
        for line, masked_line in zip(lines, masked, strict=True):
            # Blind: the same answer on the real and the masked line ...
            assert bool(twin.search(line)) == bool(twin.search(masked_line)), (pattern, line)
            # ... and a match wherever the regex matches.
            if alternative.regex.search(line):
                assert twin.search(masked_line), (pattern, line)


def test_messages_are_digit_blind() -> None:
    """The message of a line with its digits masked is the masked message: the verdict cached
    for one masked line holds for every line of its form."""
    zeros = str.maketrans("0123456789", "0" * 10)
    for line in _lines():
        text = line_text(line.encode("utf-8", "surrogateescape"))
        expected = tuple(message.translate(zeros) for message in messages(text))
        assert messages(text.translate(zeros)) == expected, line


def test_prefilter_answers_as_one_regex_of_every_anchor_would() -> None:
    whole = re.compile("|".join(f"(?:{a})" for a in CATALOGUE.anchors).encode())
    for line in _lines():
        template = line.encode("utf-8", "surrogateescape").translate(MASK)
        assert CATALOGUE.prefilter.search(template) == bool(whole.search(template)), line


def test_prefilter_mixes_text_and_regex_anchors() -> None:
    prefilter = Prefilter(("fallen off", "\\beio\\b", "显存不足"))
    assert prefilter.search(b"gpu has fallen off the bus")
    assert prefilter.search(b"oserror: eio")
    assert not prefilter.search(b"video")
    assert prefilter.search("错误: 显存不足".encode())
    assert not prefilter.search(b"step 0 loss 0.0")
    assert Prefilter(("\\beio\\b",)).search(b"eio") and not Prefilter(("x",)).search(b"eio")


def test_required_factors() -> None:
    assert required_factors(r"NCCL WARN") == {b"nccl warn"}
    assert required_factors(r"\[Errno 28\]") == {b"[errno 00]"}
    assert required_factors(r"(?i)row[- ]remap\w* (?:failure|pending)") == {b"failure", b"pending"}
    assert required_factors(r"[Nn]ode (?:lost|down)") == {b"node "}
    assert required_factors(r"(?i)nvlink") == {b"nvlink"}
    assert required_factors(r"a?|b") is None
    assert required_factors(r".*\d+") is None


def test_split_alternatives() -> None:
    assert split_alternatives(r"(?i)a|(b|c)|[|]|\||[]|]x") == ["a", "(b|c)", "[|]", r"\|", "[]|]x"]
    assert split_alternatives(r"abc") == ["abc"]


def test_non_ascii_folds_are_the_ones_re_knows() -> None:
    ascii_letter = re.compile(r"(?i)[a-z]")
    found = {
        code: chr(code).lower()
        for code in range(128, sys.maxunicode + 1)
        if ascii_letter.fullmatch(chr(code))
    }
    assert set(found) == set(NON_ASCII_FOLDS)
    for code, letter in NON_ASCII_FOLDS.items():
        assert re.fullmatch(f"(?i){letter}", chr(code))
