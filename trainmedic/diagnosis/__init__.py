"""Failure-log diagnosis: which Category a failed training job belongs to, and where.

Pure domain logic (no Prefect): the triage flow calls ``diagnose`` / ``diagnose_paths``
and acts on the returned ``trainmedic.core.models.Diagnosis``.
"""

from __future__ import annotations

from trainmedic.diagnosis.catalogue import Catalogue, Role, Signature, load_catalogue
from trainmedic.diagnosis.engine import (
    diagnose,
    diagnose_paths,
    far_ends,
    suspect_hosts,
    task_hosts,
)
from trainmedic.diagnosis.llm import LlmConfig, classify_with_llm, llm_config_from_settings
from trainmedic.diagnosis.overlay import site_catalogue
from trainmedic.diagnosis.sources import LogSource, host_and_rank_from_name

__all__ = [
    "Catalogue",
    "LlmConfig",
    "LogSource",
    "Role",
    "Signature",
    "classify_with_llm",
    "diagnose",
    "diagnose_paths",
    "far_ends",
    "host_and_rank_from_name",
    "llm_config_from_settings",
    "load_catalogue",
    "site_catalogue",
    "suspect_hosts",
    "task_hosts",
]
