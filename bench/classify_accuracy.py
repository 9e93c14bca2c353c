"""Dev-corpus accuracy of the diagnosis engine vs a naive first-error-line baseline.

python bench/classify_accuracy.py [--corpus PATH] [--verbose]

The engine falls back on a word table learnt from the dev corpus when no signature explains a
log (``trainmedic/diagnosis/learned.py``). Scoring it on the rows it was built from would
flatter it, so here each row is diagnosed with a table built *without the row's batch*: the
corpus came in batches (the first rows, then ``fresh-``, ``freshb-``, ... each collected
blind), and a batch's rows often share a source or a wording. ``rules only`` is the engine
with no table at all.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.corpus import DEV_CORPUS, dev_rows, read_rows  # noqa: E402

from trainmedic.diagnosis import LogSource, diagnose  # noqa: E402
from trainmedic.diagnosis.learned import (  # noqa: E402
    NO_WORDS,
    TokenModel,
    corpus_examples,
    train,
)

GENERIC_ERROR = re.compile(r"error|exception|fail|killed|timeout", re.IGNORECASE)
# What a hurried on-call engineer's grep would conclude from the first error line.
NAIVE_KEYWORDS = [
    ("out of memory", "CUDAOutOfMemory"),
    ("ecc", "ECCError"),
    ("nvlink", "NVLinkError"),
    ("xid", "GPUFallenOff"),
    ("timeout", "NCCLTimeout"),
    ("timed out", "NCCLTimeout"),
    ("nccl", "NCCLError"),
    ("dataloader", "DataloaderKilled"),
    ("killed", "HostOOM"),
    ("checkpoint", "CheckpointError"),
    ("state_dict", "CheckpointError"),
    ("input/output", "StorageError"),
    ("no space", "StorageError"),
    ("connection", "NetworkError"),
    ("socket", "NetworkError"),
    ("node", "NodeFailure"),
    ("nan", "NaNLoss"),
    ("cuda", "CUDAError"),
    ("error", "ScriptError"),
]
NAIVE_PLACE = re.compile(
    r"\b(?:rank\s*\d+|[a-z]+\d+[a-z0-9-]*|[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\b", re.I
)


def naive(log: str) -> tuple[str, str | None]:
    for line in log.splitlines():
        if GENERIC_ERROR.search(line):
            lowered = line.lower()
            label = next((lab for key, lab in NAIVE_KEYWORDS if key in lowered), "Unknown")
            place = NAIVE_PLACE.search(line)
            return label, place.group(0) if place else None
    return "Unknown", None


def key_tokens(expected: str) -> list[str]:
    text = expected.lower()
    for pattern in (
        r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.\d)?",
        r"\b\d{1,3}(?:\.\d{1,3}){3}\b",
        r"\brank \d+\b",
        r"\b[a-z][a-z0-9]*\d[a-z0-9-]*\b",
        r"\bgpu \d+\b",
    ):
        found = re.findall(pattern, text)
        if found:
            return found
    return [text]


def host_ok(expected: str, got: str | None) -> bool:
    return got is not None and any(t in got.lower() for t in key_tokens(expected))


def batch_of(row_id: str) -> str:
    """``freshc-017`` and ``freshc-ecc-mfc-12`` are batch ``freshc``; the rest the first."""
    head = row_id.split("-", 1)[0]
    return head if head.startswith("fresh") else "first"


class HeldOut:
    """Word tables built from the dev corpus without the batch of the row being scored, and
    without any row of the same text as a row of that batch (the shared corpus's rows were
    copied into the dev corpus)."""

    def __init__(self, scored: list[dict[str, str]]) -> None:
        self.dev = dev_rows()
        self.scored = scored
        self.tables: dict[str, TokenModel] = {}

    def table(self, row: dict[str, str]) -> TokenModel:
        batch = batch_of(row["id"])
        if batch not in self.tables:
            texts = {r["log"] for r in self.scored if batch_of(r["id"]) == batch}
            kept = [d for d in self.dev if batch_of(d["id"]) != batch and d["log"] not in texts]
            self.tables[batch] = train(corpus_examples(kept))
        return self.tables[batch]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEV_CORPUS)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    rows = read_rows(args.corpus)
    scores = {"trainmedic": [0, 0], "rules only": [0, 0], "naive": [0, 0]}
    held_out = HeldOut(rows)
    host_rows = [r for r in rows if r["root_cause_host"]]
    confusion: dict[tuple[str, str], int] = {}
    host_by_label: dict[str, list[int]] = {}
    for row in rows:
        source = [LogSource.from_text(row["id"], row["log"])]
        diagnosis = diagnose(source, learned=held_out.table(row))
        rules = diagnose(source, learned=NO_WORDS)
        ours = (diagnosis.category.value, diagnosis.root_cause_host)
        pair = (row["label"], ours[0])
        confusion[pair] = confusion.get(pair, 0) + 1
        if row["root_cause_host"]:
            tally = host_by_label.setdefault(row["label"], [0, 0])
            tally[0] += host_ok(row["root_cause_host"], ours[1])
            tally[1] += 1
        for name, (label, place) in (
            ("trainmedic", ours),
            ("rules only", (rules.category.value, rules.root_cause_host)),
            ("naive", naive(row["log"])),
        ):
            scores[name][0] += label == row["label"]
            if row["root_cause_host"]:
                scores[name][1] += host_ok(row["root_cause_host"], place)
            if args.verbose and label != row["label"] and name != "rules only":
                print(f"  {name:10s} miss {row['id']}: {row['label']} -> {label}")
    print(f"dev corpus: {len(rows)} cases, {len(host_rows)} with a named root-cause host")
    print(f"{'classifier':12s} {'category':>10s} {'root host':>10s}")
    for name, (category_ok, place_ok) in scores.items():
        print(
            f"{name:12s} {category_ok / len(rows):10.1%} "
            f"{place_ok / max(1, len(host_rows)):10.1%}   ({category_ok}/{len(rows)}, "
            f"{place_ok}/{len(host_rows)})"
        )
    print_per_category(confusion, host_by_label)
    return 0


def print_per_category(
    confusion: dict[tuple[str, str], int], host_by_label: dict[str, list[int]]
) -> None:
    """Per category: cases, recall, precision, origin host; then what each miss became."""
    labels = sorted({truth for truth, _ in confusion} | {got for _, got in confusion})
    print(f"\n{'category':18s} {'cases':>5s} {'recall':>7s} {'precision':>9s} {'host':>7s}")
    for label in labels:
        cases = sum(n for (truth, _), n in confusion.items() if truth == label)
        said = sum(n for (_, got), n in confusion.items() if got == label)
        right = confusion.get((label, label), 0)
        recall = f"{right / cases:.0%}" if cases else "-"
        precision = f"{right / said:.0%}" if said else "-"
        ok, total = host_by_label.get(label, [0, 0])
        host = f"{ok}/{total}" if total else "-"
        print(f"{label:18s} {cases:5d} {recall:>7s} {precision:>9s} {host:>7s}")
    misses = sorted(
        ((truth, got, n) for (truth, got), n in confusion.items() if truth != got),
        key=lambda m: (-m[2], m[0]),
    )
    if misses:
        print("\nconfusions (label -> diagnosed: cases)")
        for truth, got, n in misses:
            print(f"  {truth} -> {got}: {n}")


if __name__ == "__main__":
    raise SystemExit(main())
