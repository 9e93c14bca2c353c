"""What trainmedic remembers between runs: append-only ledgers under the state directory."""

from trainmedic.state.ledgers import ActionLedger, DiagnosisLedger, DrainLedger, Ledgers
from trainmedic.state.records import ActionEntry, ActionKind, DrainRecord

__all__ = [
    "ActionEntry",
    "ActionKind",
    "ActionLedger",
    "DiagnosisLedger",
    "DrainLedger",
    "DrainRecord",
    "Ledgers",
]
