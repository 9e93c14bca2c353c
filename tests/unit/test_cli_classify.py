"""`trainmedic classify`: JSON contract, stdin, bad input exits 2 without a traceback."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from pathlib import Path

from trainmedic.cli.diagnose import run
from trainmedic.cli.main import build_parser

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=12345, name=python, GPU has fallen off the bus.\n"


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["classify", *argv])


def call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run(parse(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_json_contract(tmp_path: Path) -> None:
    log = tmp_path / "node003-dmesg.log"
    log.write_text(XID79)
    code, out, err = call(["--json", str(log)])
    assert code == 0, err
    result = json.loads(out)
    assert set(result) == {
        "category",
        "layer",
        "root_cause_host",
        "confidence",
        "evidence",
        "remediation",
    }
    assert result["category"] == "GPUFallenOff"
    assert result["layer"] == "infrastructure"
    assert "node003" in result["root_cause_host"]
    assert 0 <= result["confidence"] <= 1
    assert result["evidence"][0] == {
        "file": str(log),
        "line": 1,
        "text": XID79.strip(),
        "signature": "xid-GPUFallenOff",  # generated from the Xid catalogue
    }
    assert set(result["remediation"]) == {"action", "auto_retry", "summary", "hints"}
    assert result["remediation"]["action"] == "isolate_and_retry"


def test_several_files_are_one_job(tmp_path: Path) -> None:
    (tmp_path / "node001.log").write_text(
        "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1) ran for 600012 "
        "milliseconds before timing out.\n"
    )
    (tmp_path / "node002.log").write_text(
        "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    )
    code, out, _ = call(["--json", str(tmp_path / "node001.log"), str(tmp_path / "node002.log")])
    assert code == 0
    result = json.loads(out)
    assert result["category"] == "ECCError"
    assert result["root_cause_host"] == "node002"


def test_text_report_is_readable(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("KeyError: 'input_ids'\n")
    code, out, _ = call([str(log)])
    assert code == 0
    assert "Diagnosis:   ScriptError" in out
    assert "notify_owner" in out and "x.log:1" in out


def test_stdin_and_process_exit_codes(tmp_path: Path) -> None:
    script = "import sys\nfrom trainmedic.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"
    done = subprocess.run(
        [sys.executable, "-c", script, "classify", "--json", "-"],
        input="RuntimeError: CUDA error: uncorrectable ECC error encountered\n",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["category"] == "ECCError"
    missing = subprocess.run(
        [sys.executable, "-c", script, "classify", str(tmp_path / "nope.log")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 2
    assert "nope.log" in missing.stderr and "Traceback" not in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_missing_and_binary_files_exit_2(tmp_path: Path) -> None:
    code, out, err = call([str(tmp_path / "missing.log")])
    assert code == 2 and out == ""
    assert "missing.log" in err and "no such file" in err
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x00\x00\x01" + bytes(range(256)) * 4)
    code, _, err = call(["--json", str(binary)])
    assert code == 2
    assert "core.bin" in err and "binary" in err
    code, _, err = call([str(tmp_path)])
    assert code == 2 and "not a regular file" in err


def test_unreachable_telemetry_exits_2(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text(XID79)
    code, _, err = call(["--telemetry", "http://127.0.0.1:9/metrics", str(log)])
    assert code == 2
    assert "telemetry" in err
