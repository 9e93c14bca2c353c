"""What trainmedic remembers between runs: the records (kept on the Prefect server by
trainmedic.adapters.server_state) and the local diagnosis ledger."""

from trainmedic.state.ledgers import DiagnosisLedger, Ledgers
from trainmedic.state.records import ActionEntry, ActionKind, DrainRecord, RepairRecord

__all__ = ["ActionEntry", "ActionKind", "DiagnosisLedger", "DrainRecord", "Ledgers", "RepairRecord"]
