"""The tree is the architecture: these checks keep it so (ARCHITECTURE.md describes it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "trainmedic"
# Pure domain logic: importable, and tested, without Prefect.
PURE = ["core", "decisions", "diagnosis", "locate", "reports", "state"]
# What each layer may import from trainmedic (itself always).
ALLOWED = {
    "core": set(),
    "state": {"core"},
    "diagnosis": {"core"},
    "decisions": {"core", "state", "diagnosis"},
    "locate": {"core"},
    "reports": {"core", "state", "decisions", "locate"},
}
MAX_LINES = 400
LONGER_ALLOWED = {"adapters/scheduler/slurm.py"}


def _modules(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def _trainmedic_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "trainmedic" and len(parts) > 1:
                found.add(parts[1])
            if parts[0] == "flows":
                found.add("flows")
    return found


@pytest.mark.parametrize("package", PURE)
def test_pure_packages_do_not_import_prefect(package: str) -> None:
    modules = [
        "trainmedic." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)
        for p in _modules(package)
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m.removesuffix('.__init__'))\n"
        "print(sorted(m for m in sys.modules if m == 'prefect' or m.startswith('prefect.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"{package} pulls in Prefect: {done.stdout[:300]}"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_layers_import_only_what_is_below_them(package: str) -> None:
    for path in _modules(package):
        extra = _trainmedic_imports(path) - ALLOWED[package] - {package}
        assert not extra, f"{path.relative_to(REPO)} imports {sorted(extra)}"


def test_no_module_outside_the_slurm_adapter_grows_past_400_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
        for p in PACKAGE.rglob("*.py")
        if len(p.read_text().splitlines()) > MAX_LINES
    }
    assert set(long) <= LONGER_ALLOWED, long


def test_architecture_document_names_every_package_and_module() -> None:
    text = (REPO / "ARCHITECTURE.md").read_text()
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if path.name == "__init__.py":
            if relative.parent == Path():
                continue
            assert f"{relative.parent.name}/" in text, f"ARCHITECTURE.md misses {relative.parent}/"
        else:
            assert path.name in text, f"ARCHITECTURE.md misses {relative}"
    for path in (REPO / "flows").glob("*.py"):
        if path.name != "__init__.py":
            assert path.name in text, f"ARCHITECTURE.md misses flows/{path.name}"
