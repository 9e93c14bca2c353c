from support.builders import job_info

from trainmedic.core.models import ActionRecord, Diagnosis, Evidence, HostOutcome, PlaybookResult
from trainmedic.core.taxonomy import Category, layer_of, remediation_for
from trainmedic.decisions.remediation import plan_remediation
from trainmedic.reports.triage import triage_report


def test_triage_report_shows_each_evidence_line_once_and_escapes_pipes() -> None:
    job = job_info("7")
    line = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus | odd"
    evidence = tuple(
        Evidence(
            file="node001:kernel",
            line=1,
            text=line,
            signature=s,
            host="node001",
            category=Category.GPUFallenOff,
        )
        for s in ("xid-79", "fallen-off-bus")
    )
    diagnosis = Diagnosis(
        category=Category.GPUFallenOff,
        layer=layer_of(Category.GPUFallenOff),
        root_cause_host="node001",
        confidence=0.9,
        evidence=evidence,
        remediation=remediation_for(Category.GPUFallenOff),
    )
    plan = plan_remediation(diagnosis, job)
    text = triage_report(
        job=job,
        diagnosis=diagnosis,
        plan=plan,
        actions=[ActionRecord(what="drain", target="node001", outcome="ok", changed=True)],
        checkpoint=None,
        new_job=None,
        diagnostics=None,
        dry_run=False,
    )
    assert text.count("fallen off the bus") == 1
    assert "xid-79, fallen-off-bus" in text
    assert "bus \\| odd" in text
    assert "| drain | node001 | ok | yes |" in text
    assert "origin node node001 proven" in text


def test_triage_report_says_when_kernel_evidence_could_not_be_read() -> None:
    job = job_info("8", nodes=("node001", "node002"))
    diagnosis = Diagnosis(
        category=Category.Unknown,
        layer=layer_of(Category.Unknown),
        root_cause_host=None,
        confidence=0.0,
        evidence=(),
        remediation=remediation_for(Category.Unknown),
    )
    refused = "dmesg: read kernel buffer failed: Operation not permitted"
    diagnostics = PlaybookResult(
        playbook="collect_node_diagnostics.yml",
        status="successful",
        rc=0,
        hosts={"node001": HostOutcome.ok, "node002": HostOutcome.ok},
        facts={
            "node001": {"trainmedic_diagnostics": {"kernel_rc": 0, "kernel_error": ""}},
            "node002": {"trainmedic_diagnostics": {"kernel_rc": 1, "kernel_error": refused}},
        },
        private_data_dir="/x",
    )
    text = triage_report(
        job=job,
        diagnosis=diagnosis,
        plan=plan_remediation(diagnosis, job),
        actions=[],
        checkpoint=None,
        new_job=None,
        diagnostics=diagnostics,
        dry_run=False,
    )
    assert "| node001 | ok | — | read |" in text
    assert f"UNREADABLE: {refused}" in text
    assert f"**Kernel evidence could not be read** on node002 ({refused})" in text
