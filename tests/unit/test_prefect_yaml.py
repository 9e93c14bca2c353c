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
