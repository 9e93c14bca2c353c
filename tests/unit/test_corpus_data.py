"""The knowledge the diagnosis is built and judged on: the labelled corpus of real failure
excerpts (tests/corpus/) and NVIDIA's Xid catalogue (trainmedic/diagnosis/data/) are
well-formed, sourced and cover every class."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

from support.corpus import dev_rows

from trainmedic.core.taxonomy import Category, layer_of

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "trainmedic" / "diagnosis" / "data"


def test_corpus_rows_are_real_sourced_and_labelled_with_the_taxonomy() -> None:
    rows = dev_rows()
    assert len(rows) >= 150
    assert len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        category = Category(row["label"])
        assert row["layer"] == layer_of(category).value, row["id"]
        assert row["source"].startswith("https://"), row["id"]
        assert row["log"].strip(), row["id"]
    per_category = Counter(r["label"] for r in rows)
    assert set(per_category) == {c.value for c in Category}, "every class of the taxonomy"
    assert min(per_category.values()) >= 7, per_category


def test_xid_catalogue_covers_every_code_once_with_known_kinds_and_categories() -> None:
    with (DATA / "xid_catalogue.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    codes = [int(r["code"]) for r in rows]
    assert len(codes) == len(set(codes)) and set(range(1, 160)) <= set(codes)
    assert {r["kind"] for r in rows} <= {"hardware", "application", "driver", "informational"}
    for row in rows:
        Category(row["category"])
    kinds = {int(r["code"]): r["kind"] for r in rows}
    # The device plugin's application Xids are never the hardware's fault.
    assert all(kinds[c] == "application" for c in (13, 31, 43, 45, 68))
    assert kinds[79] == "hardware" and kinds[48] == "hardware"


def test_sxid_catalogue_and_xid154_actions_parse() -> None:
    with (DATA / "sxid_catalogue.csv").open() as handle:
        sxids = list(csv.DictReader(handle))
    assert sxids and all(r["fatal"] in ("true", "false") for r in sxids)
    for row in sxids:
        Category(row["category"])
    with (DATA / "xid154_recovery_actions.csv").open() as handle:
        actions = {r["action"]: int(r["code"]) for r in csv.DictReader(handle)}
    assert {"NONE", "GPU_RESET", "NODE_REBOOT", "DRAIN_P2P", "DRAIN_AND_RESET"} <= set(actions)
    # NVML's enum: each code once, as the driver prints it in an Xid 154 line ("to 0x1 (...)")
    assert sorted(actions.values()) == list(range(len(actions)))
    assert (actions["NONE"], actions["GPU_RESET"], actions["NODE_REBOOT"]) == (0, 1, 2)
