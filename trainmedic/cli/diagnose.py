"""``trainmedic classify [--json] [--telemetry URL] LOGFILE...``

Several files are several ranks/hosts of one job; ``-`` reads stdin. Bad input (missing
or binary file, unreachable telemetry) prints one line naming it on stderr and exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from trainmedic.adapters.telemetry import fetch_gpu_telemetry
from trainmedic.cli.common import EXIT_INPUT, AddCommand
from trainmedic.core.errors import TrainmedicError
from trainmedic.core.models import Diagnosis, GpuTelemetry
from trainmedic.core.settings import get_settings
from trainmedic.diagnosis.engine import diagnose
from trainmedic.diagnosis.llm import llm_config_from_settings
from trainmedic.diagnosis.sources import LogSource

__all__ = ["diagnosis_to_json", "format_report", "register", "run"]

EXIT_OK = 0


def register(add: AddCommand) -> None:
    parser = add(
        "classify",
        run,
        "diagnose a failed job from its logs",
        "Classify a training-job failure from its logs (one file per rank/host).",
    )
    parser.add_argument("logfiles", nargs="+", metavar="LOGFILE", help="log file, '-' = stdin")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--telemetry",
        metavar="URL",
        help="DCGM/Prometheus /metrics URL (one scrape: its counters are lifetime totals, "
        "never evidence; temperatures are)",
    )
    parser.add_argument("--exit-code", type=int, default=None, help="the job's exit code")
    parser.add_argument(
        "--heartbeat-age", type=float, default=None, metavar="S", help="seconds since progress"
    )


def run(
    args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        if [p for p in args.logfiles if p == "-"][1:]:
            raise TrainmedicError("stdin ('-') can be given only once")
        sources = [LogSource.from_path(path) for path in args.logfiles]
        telemetry: list[GpuTelemetry] = []
        if getattr(args, "telemetry", None):
            telemetry = fetch_gpu_telemetry(args.telemetry)
        diagnosis = diagnose(
            sources,
            telemetry=telemetry,
            exit_code=getattr(args, "exit_code", None),
            heartbeat_age_s=getattr(args, "heartbeat_age", None),
            llm=llm_config_from_settings(get_settings()),
        )
    except TrainmedicError as exc:
        print(f"trainmedic classify: error: {exc}", file=err)
        return EXIT_INPUT
    except OSError as exc:
        print(f"trainmedic classify: error: {exc.filename or ''}: {exc.strerror or exc}", file=err)
        return EXIT_INPUT
    if args.json:
        print(json.dumps(diagnosis_to_json(diagnosis), ensure_ascii=False), file=out)
    else:
        print(format_report(diagnosis), file=out)
    return EXIT_OK


def diagnosis_to_json(diagnosis: Diagnosis) -> dict[str, object]:
    """The stable ``classify --json`` contract."""
    remediation = diagnosis.remediation
    return {
        "category": diagnosis.category.value,
        "layer": diagnosis.layer.value,
        "root_cause_host": diagnosis.root_cause_host,
        "confidence": diagnosis.confidence,
        "evidence": [
            {"file": e.file, "line": e.line, "text": e.text, "signature": e.signature}
            for e in diagnosis.evidence
        ],
        "remediation": {
            "action": remediation.action.value,
            "auto_retry": remediation.auto_retry,
            "summary": remediation.summary,
            "hints": list(remediation.hints),
        },
    }


def format_report(diagnosis: Diagnosis) -> str:
    remediation = diagnosis.remediation
    lines = [
        f"Diagnosis:   {diagnosis.category.value} ({diagnosis.layer.value} layer)",
        f"Root cause:  {diagnosis.root_cause_host or 'not located'}",
        f"Confidence:  {diagnosis.confidence:.2f} (from {diagnosis.source})",
        f"Action:      {remediation.action.value}"
        + (" (auto-retry)" if remediation.auto_retry else " (no automatic retry)"),
        f"             {remediation.summary}",
    ]
    lines.extend(f"  hint:      {hint}" for hint in remediation.hints)
    if diagnosis.evidence:
        lines.append("Evidence:")
        for e in diagnosis.evidence:
            where = f"{e.file}:{e.line}" if e.line else e.file
            tag = e.category.value if e.category else "-"
            lines.append(f"  [{tag}/{e.signature}] {where}")
            lines.append(f"      {e.text}")
    else:
        lines.append("Evidence:    none (no known failure signature in the logs)")
    return "\n".join(lines)
