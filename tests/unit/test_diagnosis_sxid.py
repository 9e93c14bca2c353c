"""NVSwitch SXid lines are read through the Fabric Manager guide's SXid table: every code of
data/sxid_catalogue.csv diagnoses as its category, from the driver's line, and a bad table
row is one line naming the row."""

from __future__ import annotations

import pytest

from trainmedic.core.errors import ConfigError
from trainmedic.diagnosis import LogSource, diagnose
from trainmedic.diagnosis.xid import load_sxid_catalogue, parse_sxid_catalogue

SXIDS = sorted(load_sxid_catalogue().values(), key=lambda e: e.code)


def test_the_table_is_the_guides() -> None:
    assert len(SXIDS) >= 90
    assert {e.category.value for e in SXIDS} <= {"NVLinkError", "CUDAError"}
    assert any(e.fatal for e in SXIDS) and any(not e.fatal for e in SXIDS)


@pytest.mark.parametrize("entry", SXIDS, ids=lambda e: str(e.code))
def test_every_sxid_diagnoses_as_its_category(entry) -> None:  # type: ignore[no-untyped-def]
    line = f"[ 1234.567890] nvidia-nvswitch2: SXid (PCI:0000:c5:00.0): {entry.code}, Severity 1"
    diagnosis = diagnose([LogSource.from_text("kern.log", line)])
    assert diagnosis.category is entry.category
    (best,) = diagnosis.evidence[:1]
    assert best.signature == f"sxid-{entry.category.value}" + ("" if entry.fatal else "-nonfatal")


def test_a_bad_row_is_one_line_naming_it() -> None:
    text = "code,description,severity,fatal,immediate_action,category,source\n"
    with pytest.raises(ConfigError, match=r"sxid_catalogue\.csv:2: bad row"):
        parse_sxid_catalogue(text + '12028,"egress",non-fatal,maybe,,NVLinkError,x\n')
    with pytest.raises(ConfigError, match="SXid 12028 listed twice"):
        parse_sxid_catalogue(text + "12028,a,b,false,,NVLinkError,x\n" * 2)
