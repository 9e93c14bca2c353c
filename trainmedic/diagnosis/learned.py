"""The labelled corpus as a fallback: which category do logs with these words belong to?

When no signature explains a failure (a report in prose, a framework's own wording of a hang
or a memory kill), the words of its last lines still lean one way: "memory pressure",
"stuck", "heartbeat", "checkpoint". A naive-Bayes table over the words and word pairs of the
labelled corpus of real failure logs (``tests/corpus/dev-logs.jsonl``, every row from a public
source) names the category they lean to most. Its guess is only ever a suggestion: capped
far below a signature's confidence, shown with the words that decided it, and a plan built
on it asks a human before anything is drained, retried or rolled back.

The table is data, built from the corpus (``scripts/learn_words.py`` writes it) and checked
against it by a test, so a corpus row added is a row learnt.
Pure: no I/O but reading the table.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, cached_property
from itertools import pairwise
from pathlib import Path

from trainmedic.core.taxonomy import Category

__all__ = ["NO_WORDS", "Guess", "TokenModel", "bundled_model", "train"]

TABLE = Path(__file__).with_name("data") / "learned_tokens.json"
# A word seen in one example only is that example's, not its category's: left out of the table.
MIN_EXAMPLES = 2
# What a word's count is smoothed by (a share is (held + s) / (examples + 2s)). Small: a word
# that a category's examples never hold then leans well away from it. Held out batch by batch
# on the 5217-row dev corpus, the 929 logs no signature explains were right 312 times at 0.5,
# 324 at 0.2, 332 at 0.1 (0.03 to 0.1 gave 327 to 334, 0.01 gave 325).
SMOOTHING = 0.1
# Below this many known words the text says too little to lean anywhere.
MIN_KNOWN_TOKENS = 3
MIN_PROBABILITY = 0.5
# A word that at least this share of a category's examples hold is one of its hallmarks, and a
# text without it leans away from the category: a bare Python traceback shares its boilerplate
# ("most recent call last", "lib python") with the DataloaderKilled examples, but none of their
# "worker" or "dataloader". Held out batch by batch on the dev corpus, this turned 165 of the
# 507 logs no signature explains right into 190 (shares from 0.15 to 0.5 all gave 181 to 190).
HALLMARK_SHARE = 0.2
MAX_CONFIDENCE = 0.4  # below every signature, below the default confidence floor
# Categories the table never names: a GPU's hardware fault. Its examples' words ("nvidia",
# "driver", "systemd", an nvidia-smi table's) are in every GPU node's log, and what makes them
# hardware faults is a line of their own (an Xid, an ECC count, an NVLink state) that the
# signatures read. Held out batch by batch on the dev corpus, the table's NVLink, ECC and
# bus-loss guesses were right 12 times in 109; naming none of them turned 356 of the 938
# logs no signature explains right into 366.
NEVER_GUESSED = frozenset({Category.NVLinkError, Category.ECCError, Category.GPUFallenOff})
_WORD = re.compile(r"[a-z][a-z_]{2,}")
# Only lines that speak of trouble are read: ordinary progress lines ("iteration 40 | lm loss:
# 2.8") lean to the loss categories by their words alone, and a healthy log must lean nowhere.
TROUBLE = re.compile(
    r"error|exception|fail|fatal|abort|kill|timed? ?out|panic|traceback|denied|refused|"
    r"unreachable|\bnan\b|\binf\b|overflow|corrupt|invalid|cannot|unable|stuck|hang|hung|"
    r"freez|deadlock|no progress|spike|explod|diverg|oom|out of memory|memory pressure|lost|"
    r"\bdown\b|not responding|terminat|signal|sigkill|sigterm|preempt|evict|missing|mismatch|"
    r"skipping|warn",
    re.IGNORECASE,
)


def tokens(text: str) -> frozenset[str]:
    """The lowercased words (3+ letters; numbers, hex and paths' digits dropped) and each
    pair of adjacent words: "memory pressure" says more than "memory" and "pressure"."""
    words = _WORD.findall(text.lower())
    return frozenset(words).union(f"{a} {b}" for a, b in pairwise(words))


# A count of none is no trouble: YOLO's "6430 images, 0 corrupt", a linter's "0 errors".
NONE_COUNTED = re.compile(
    r"\b(?:0|no|zero) (?:corrupt|errors?|failures?|failed|warnings?|missing)\b", re.IGNORECASE
)


def troubled(text: str) -> str:
    return "\n".join(
        line for line in text.splitlines() if TROUBLE.search(NONE_COUNTED.sub("", line))
    )


@dataclass(frozen=True)
class Guess:
    category: Category
    probability: float
    confidence: float
    words: tuple[str, ...]  # the words that leaned the most towards the category
    examples: int  # labelled examples the table was built from


@dataclass(frozen=True)
class TokenModel:
    examples: Mapping[Category, int]
    # token -> category -> how many examples of that category hold the token
    table: Mapping[str, Mapping[Category, int]]

    @property
    def size(self) -> int:
        return sum(self.examples.values())

    @cached_property
    def hallmarks(self) -> Mapping[Category, Mapping[str, float]]:
        """Per category, the words at least HALLMARK_SHARE of its examples hold, each with what
        its absence weighs (the table's counts alone decide it: worked out once per table)."""
        total = self.size
        needed = {c: max(HALLMARK_SHARE * count, 1) for c, count in self.examples.items()}
        hallmarks: dict[Category, dict[str, float]] = {category: {} for category in needed}
        for token, seen in self.table.items():
            held = sum(seen.values())
            for category, inside in seen.items():
                if category in needed and inside >= needed[category]:
                    count = self.examples[category]
                    hallmarks[category][token] = math.log(1 - _share(inside, count)) - math.log(
                        1 - _share(held - inside, total - count)
                    )
        return hallmarks

    def guess(self, text: str) -> Guess | None:
        """The category the words of the text's troubled lines lean to, or None when they
        say too little."""
        present = tokens(troubled(text))
        known = sorted(present & self.table.keys())
        if len(known) < MIN_KNOWN_TOKENS or not self.examples:
            return None
        total = self.size
        seen_in = {token: sum(self.table[token].values()) for token in known}
        scores: dict[Category, float] = {}
        leanings: dict[Category, list[tuple[float, str]]] = {}
        for category, count in self.examples.items():
            if category in NEVER_GUESSED:
                continue
            rest = total - count
            score = math.log(count / total)
            lean: list[tuple[float, str]] = []
            for token in known:
                inside = self.table[token].get(category, 0)
                outside = seen_in[token] - inside
                # one category against all the others: a word common to every failure
                # ("error", "rank") weighs nothing
                weight = math.log(_share(inside, count)) - math.log(_share(outside, rest))
                score += weight
                lean.append((weight, token))
            for token, absent in self.hallmarks[category].items():
                if token not in present:
                    score += absent
            scores[category] = score
            leanings[category] = lean
        best = max(scores, key=lambda c: scores[c])
        top = scores[best]
        probability = 1.0 / sum(math.exp(s - top) for s in scores.values())
        if probability < MIN_PROBABILITY:
            return None
        words = tuple(token for weight, token in sorted(leanings[best], reverse=True)[:4])
        return Guess(
            category=best,
            probability=round(probability, 3),
            confidence=round(min(probability, 1.0) * MAX_CONFIDENCE, 3),
            words=words,
            examples=total,
        )

    def dumps(self) -> str:
        """The table as JSON, one word a line (a corpus row added is a readable diff)."""
        lines = ",\n".join(
            f"{json.dumps(token)}: {json.dumps({str(c): n for c, n in sorted(seen.items())})}"
            for token, seen in sorted(self.table.items())
        )
        examples = json.dumps({str(c): n for c, n in sorted(self.examples.items())})
        return (
            '{"built_from": "tests/corpus/dev-logs.jsonl",\n'
            f'"examples": {examples},\n"tokens": {{\n{lines}\n}}}}\n'
        )

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> TokenModel:
        examples = data["examples"]
        table = data["tokens"]
        assert isinstance(examples, dict) and isinstance(table, dict)
        return cls(
            examples={Category(c): int(n) for c, n in examples.items()},
            table={
                token: {Category(c): int(n) for c, n in seen.items()}
                for token, seen in table.items()
            },
        )


def _share(holding: int, examples: int) -> float:
    """The smoothed share of examples holding a word: never 0 or 1, so its log is finite."""
    return (holding + SMOOTHING) / (examples + 2 * SMOOTHING)


NO_WORDS = TokenModel(examples={}, table={})  # the diagnosis without the word table


def train(examples: Iterable[tuple[Category, str]]) -> TokenModel:
    """A table from labelled log texts."""
    counts: Counter[Category] = Counter()
    table: defaultdict[str, Counter[Category]] = defaultdict(Counter)
    for category, text in examples:
        counts[category] += 1
        for token in tokens(troubled(text)):
            table[token][category] += 1
    return TokenModel(
        examples=dict(counts),
        table={
            token: dict(seen) for token, seen in table.items() if sum(seen.values()) >= MIN_EXAMPLES
        },
    )


def corpus_examples(rows: Iterable[Mapping[str, object]]) -> list[tuple[Category, str]]:
    return [(Category(str(row["label"])), str(row["log"])) for row in rows]


@cache
def bundled_model() -> TokenModel | None:
    """The table shipped with trainmedic (None where it was left out of an install)."""
    if not TABLE.is_file():
        return None
    return TokenModel.from_json(json.loads(TABLE.read_text(encoding="utf-8")))
