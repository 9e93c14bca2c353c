"""When no rule explains a failure: a model's suggestion, then the corpus's words, or Unknown.

Neither fallback proves anything. The LLM's answer (asked only where a site configured one)
and the labelled corpus's word table (``learned.py``) each give a category with a confidence
below every signature's; a plan built on either asks a human before it acts, and neither
names a host to drain (the origin is only a host the logs' context lines name alone).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from trainmedic.core.models import Diagnosis, Evidence, Rival
from trainmedic.core.taxonomy import Category, layer_of, remediation_for
from trainmedic.diagnosis.learned import Guess, TokenModel
from trainmedic.diagnosis.llm import LlmConfig, classify_with_llm

__all__ = ["unexplained"]


def unexplained(
    tails: Mapping[str, Sequence[str]],
    *,
    evidence: tuple[Evidence, ...],
    root: str | None,
    rivals: tuple[Rival, ...],
    llm: LlmConfig | None,
    learned: TokenModel | None,
    unproven: Collection[Category] = frozenset(),
) -> Diagnosis:
    """The diagnosis of logs no signature explains, from each source's last lines.

    ``unproven``: categories the rules set aside for want of proof (an exit code 137 alone is
    not host OOM): the word table's lean towards one of them is the same unproven inference.
    """
    if llm is not None and any(tails.values()):
        answer = classify_with_llm(tails, llm)
        if answer is not None and answer.category is not Category.Unknown:
            return Diagnosis(
                category=answer.category,
                layer=layer_of(answer.category),
                root_cause_host=answer.root_cause_host or root,
                confidence=answer.confidence,
                evidence=evidence,
                remediation=remediation_for(answer.category),
                source="llm",
            )
    # A launcher's report that a rank exited or where (a context line) says that the job
    # failed, not why: the word table reads the other lines.
    context = {e.text for e in evidence if e.category is Category.Unknown}
    text = "\n".join(
        line for lines in tails.values() for line in lines if line.rstrip("\r\n") not in context
    )
    guess = learned.guess(text) if learned is not None else None
    if guess is not None and guess.category not in {Category.Unknown, *unproven}:
        return Diagnosis(
            category=guess.category,
            layer=layer_of(guess.category),
            root_cause_host=root,
            confidence=guess.confidence,
            evidence=(_why(guess), *evidence),
            remediation=remediation_for(guess.category),
            source="learned",
            # no line is a proven cause: never an origin to drain
            symptom_only=True,
            rivals=rivals,
        )
    return Diagnosis(
        category=Category.Unknown,
        layer=layer_of(Category.Unknown),
        root_cause_host=root,
        confidence=0.1,
        evidence=evidence,
        remediation=remediation_for(Category.Unknown),
        symptom_only=True,
        rivals=rivals,
    )


def _why(guess: Guess) -> Evidence:
    words = ", ".join(f"'{word}'" for word in guess.words)
    return Evidence(
        file="(labelled corpus)",
        line=0,
        text=(
            f"no signature matched; the words {words} lean to {guess.category} "
            f"(p={guess.probability:.2f} over {guess.examples} labelled real failures)"
        ),
        signature="learned-words",
        category=guess.category,
    )
