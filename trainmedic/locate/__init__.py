"""Locating faulty and fail-slow nodes with the two-round pair test: the pairing and judging
of a round (:mod:`.pairing`), running the rounds (:mod:`.locator`), and an oracle simulation of
the fabric for trying the algorithm and benchmarks (:mod:`.simulation`)."""

from trainmedic.locate.locator import LocateReport, Locator, RoundRecord, locate
from trainmedic.locate.pairing import (
    Group,
    Pair,
    Role,
    RunRound,
    Verdict,
    check_nodes,
    default_seed,
    judge_round,
    pair_suspects,
    plan_round_one,
    plan_round_two,
    reference_busbw,
    shuffled,
)

__all__ = [
    "Group",
    "LocateReport",
    "Locator",
    "Pair",
    "Role",
    "RoundRecord",
    "RunRound",
    "Verdict",
    "check_nodes",
    "default_seed",
    "judge_round",
    "locate",
    "pair_suspects",
    "plan_round_one",
    "plan_round_two",
    "reference_busbw",
    "shuffled",
]
