"""Dev-corpus accuracy of the diagnosis engine vs a naive first-error-line baseline.

python bench/classify_accuracy.py [--corpus PATH] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainmedic.diagnosis import LogSource, diagnose  # noqa: E402

DEFAULT_CORPUS = ROOT / "tests" / "corpus" / "dev-logs.jsonl"  # real excerpts, with URLs
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.corpus.read_text().splitlines() if line.strip()]
    scores = {"trainmedic": [0, 0], "naive": [0, 0]}
    host_rows = [r for r in rows if r["root_cause_host"]]
    confusion: dict[tuple[str, str], int] = {}
    host_by_label: dict[str, list[int]] = {}
    for row in rows:
        diagnosis = diagnose([LogSource.from_text(row["id"], row["log"])])
        ours = (diagnosis.category.value, diagnosis.root_cause_host)
        pair = (row["label"], ours[0])
        confusion[pair] = confusion.get(pair, 0) + 1
        if row["root_cause_host"]:
            tally = host_by_label.setdefault(row["label"], [0, 0])
            tally[0] += host_ok(row["root_cause_host"], ours[1])
            tally[1] += 1
        for name, (label, place) in (("trainmedic", ours), ("naive", naive(row["log"]))):
            scores[name][0] += label == row["label"]
            if row["root_cause_host"]:
                scores[name][1] += host_ok(row["root_cause_host"], place)
            if args.verbose and label != row["label"]:
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
