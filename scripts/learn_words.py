"""Rebuild the diagnosis's word table from the labelled corpus.

    .venv/bin/python scripts/learn_words.py [tests/corpus/dev-logs.jsonl]

Run it after adding rows to the corpus: tests/unit/test_diagnosis_learned.py fails while the
shipped table (trainmedic/diagnosis/data/learned_tokens.json) is not the corpus's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainmedic.diagnosis.learned import TABLE, corpus_examples, train  # noqa: E402


def main(argv: list[str]) -> int:
    corpus = Path(argv[0]) if argv else ROOT / "tests" / "corpus" / "dev-logs.jsonl"
    rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines() if line]
    model = train(corpus_examples(rows))
    TABLE.write_text(model.dumps(), encoding="utf-8")
    print(f"{TABLE.relative_to(ROOT)}: {len(model.table)} words from {model.size} examples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
