"""Every deployment's entrypoint imports, and every playbook the code names exists."""

import importlib
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_every_entrypoint_imports_a_flow() -> None:
    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert config["deployments"]
    for deployment in config["deployments"]:
        path, name = deployment["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, name)
        assert hasattr(flow, "to_deployment"), deployment["name"]
        assert deployment["enforce_parameter_schema"] is True


def test_every_playbook_named_in_code_exists() -> None:
    sources = [*ROOT.glob("flows/*.py"), *ROOT.glob("trainmedic/**/*.py")]
    pattern = re.compile(r'run_playbook\(\s*"([a-z_]+\.yml)"')
    named = {m for p in sources for m in pattern.findall(p.read_text())}
    assert named, "no playbook referenced"
    for playbook in named:
        assert (ROOT / "playbooks" / playbook).is_file(), playbook


def _triggers() -> dict[str, dict]:
    config = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return {t["name"]: t for d in config["deployments"] for t in d.get("triggers") or []}


def test_the_failure_trigger_folds_reports_of_one_failure_and_never_a_later_one() -> None:
    """A job's failure reported by several sources starts one run (the trigger's window);
    the window ends well before the intake reports an untaken failure again, and a hang or
    slow-down report shares no window with a failure (a job that hangs and then fails is
    triaged for its failure too)."""
    from trainmedic.core.settings import Settings

    triggers = _triggers()
    failure, stalled = triggers["job-failed-triage"], triggers["job-stalled-triage"]
    assert 0 < failure["within"] <= Settings().intake_redeliver_after_s / 2
    assert failure["for_each"] == ["prefect.resource.id"]
    assert not {"trainmedic.job.hung", "trainmedic.job.slow"} & set(failure["expect"])
    assert set(stalled["expect"]) == {"trainmedic.job.hung", "trainmedic.job.slow"}
    assert stalled.get("within", 0) == 0
