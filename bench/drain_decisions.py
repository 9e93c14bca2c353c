"""Which nodes the plan would drain on the dev corpus's real logs, and how many of those drains
the row's label says were wrong.

python bench/drain_decisions.py [--corpus PATH] [--verbose]

A drain is the most destructive thing a diagnosis can do on its own. Each row is diagnosed by
the rules (the word table's suggestions never drain), then planned as if every host the
diagnosis names were a node of the job, beside two bystanders. A drain is *right* when the
row's label is the diagnosed category and its root-cause host is among the drained nodes, of
the *right node* when only the category differs, of a *wrong node* when the label names
another host, and wrong too where the label is no infrastructure fault at all (a script's
bug, an out-of-memory: *no node at fault*). Where the label names no host, only the category
can be checked.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "tests")]

from classify_accuracy import host_ok  # noqa: E402
from support.builders import job_info  # noqa: E402
from support.corpus import DEV_CORPUS, read_rows  # noqa: E402

from trainmedic.core.models import Diagnosis  # noqa: E402
from trainmedic.core.taxonomy import Category, Layer, layer_of  # noqa: E402
from trainmedic.core.validate import HOSTNAME_RE  # noqa: E402
from trainmedic.decisions.remediation import plan_remediation  # noqa: E402
from trainmedic.diagnosis import LogSource, diagnose  # noqa: E402
from trainmedic.diagnosis.learned import NO_WORDS  # noqa: E402

BYSTANDERS = ("bystander-1", "bystander-2")
VERDICTS = (
    "right",
    "right node, other category",
    "host unlabelled",
    "other category, host unlabelled",
    "wrong node",
    "no node at fault",
)
WRONG = frozenset({"wrong node", "no node at fault"})


def named_hosts(diagnosis: Diagnosis) -> list[str]:
    """Every schedulable host name the diagnosis names: its evidence, its origin."""
    names = [e.host for e in diagnosis.evidence if e.host]
    if diagnosis.root_cause_host and not diagnosis.root_cause_host.startswith(("rank ", "GPU ")):
        names.append(diagnosis.root_cause_host.split()[0])
    return sorted({n for n in names if HOSTNAME_RE.match(n)})


def verdict(row: dict[str, str | None], diagnosis: Diagnosis, drained: tuple[str, ...]) -> str:
    label = Category(row["label"])
    if layer_of(label) is not Layer.infrastructure:
        return "no node at fault"  # a script's bug, an out-of-memory, a loss spike: no drain
    expected = row["root_cause_host"]
    right_category = label is diagnosis.category
    if expected:
        if not any(host_ok(expected, node) for node in drained):
            return "wrong node"
        return "right" if right_category else "right node, other category"
    return "host unlabelled" if right_category else "other category, host unlabelled"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEV_CORPUS)
    parser.add_argument("--verbose", action="store_true", help="list the wrong drains")
    args = parser.parse_args()
    rows = read_rows(args.corpus)
    tally: Counter[str] = Counter()
    wrong_by_signature: Counter[str] = Counter()
    for row in rows:
        diagnosis = diagnose([LogSource.from_text(row["id"], row["log"])], learned=NO_WORDS)
        nodes = named_hosts(diagnosis)
        if not nodes:
            continue
        plan = plan_remediation(diagnosis, job_info(nodes=(*nodes, *BYSTANDERS), gpus_per_node=8))
        if not plan.drain:
            continue
        tally["drains"] += 1
        said = verdict(row, diagnosis, plan.drain)
        tally[said] += 1
        if said in WRONG:
            signature = diagnosis.evidence[0].signature if diagnosis.evidence else "-"
            wrong_by_signature[signature] += 1
            if args.verbose:
                print(
                    f"  {said} {row['id']}: {row['label']} host {row['root_cause_host']} -> "
                    f"{diagnosis.category.value}, drains {', '.join(plan.drain)} ({signature})"
                )
    drains = tally["drains"]
    print(f"dev corpus: {len(rows)} cases; the plan drains a node in {drains}")
    for said in VERDICTS:
        share = 100 * tally[said] / drains if drains else 0.0
        print(f"  {said:32s} {tally[said]:5d}  {share:5.1f} %")
    if wrong_by_signature:
        worst = ", ".join(f"{sig} {n}" for sig, n in wrong_by_signature.most_common(6))
        print(f"wrong drains by deciding line: {worst}")


if __name__ == "__main__":
    main()
