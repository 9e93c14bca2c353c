"""A 3 a.m. on-call session, for real: the CLI an engineer types, a fresh installation in a
temporary home (Prefect server, worker, intake, DCGM exporter on a simulated 8-node cluster),
a webhook receiver standing in for the pager, and the isolation policy asking a human before
any drain. Prints the transcript with seconds since the GPU fell off the bus:

    fault → the job fails → the intake reports it → triage pauses and pages on-call →
    on-call reads `status`, approves → drain, resubmission, verification → `runs`

    .venv/bin/python bench/oncall_session.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.ports import free_port  # noqa: E402
from support.receiver import Receiver, receiving  # noqa: E402
from support.waits import wait_until as wait  # noqa: E402

CLI = str(ROOT / ".venv" / "bin" / "trainmedic")
CLOCK = {"fault": 0.0}  # when the fault was injected (0: not yet)


def say(text: str) -> None:
    t0 = CLOCK["fault"]
    stamp = f"+{time.monotonic() - t0:6.1f} s" if t0 else "        "
    print(f"{stamp}  {text}", flush=True)


def run(env: dict[str, str], *argv: str, show: bool = True) -> str:
    if show:
        say("$ trainmedic " + " ".join(argv))
    done = subprocess.run(
        [CLI, *argv], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if show:
        for line in (done.stdout + done.stderr).strip().splitlines():
            print(f"            {line}")
    if done.returncode not in (0, 4):
        raise SystemExit(f"exit {done.returncode}")
    return done.stdout


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="oncall-"))
    with receiving() as url:
        env = {
            **os.environ,
            "TRAINMEDIC_HOME": str(home / "home"),
            "TRAINMEDIC_INVENTORY": str(home / "inventory"),
            "TRAINMEDIC_SERVER_PORT": str(free_port()),
            "TRAINMEDIC_SIM_EXPORTER_PORT": str(free_port()),
            "TRAINMEDIC_WEBHOOK_URL": url,
            "TRAINMEDIC_DRAIN_AUTO_APPROVE_MAX": "0",  # every drain waits for a human
            "TRAINMEDIC_INTAKE_INTERVAL_S": "2",
        }
        env.pop("PREFECT_API_URL", None)
        try:
            run(env, "sim", "create", "--nodes", "8")
            run(env, "up")
            job = json.loads(
                run(
                    env,
                    "sim",
                    "submit",
                    "--nodes",
                    "4",
                    "--steps",
                    "100000",
                    "--checkpoint-every",
                    "20",
                    "--json",
                    show=False,
                )
            )
            say(f"job {job['job_id']} trains on {', '.join(job['nodes'])}")

            def step() -> int:
                try:
                    return int(json.loads(Path(job["heartbeat_path"]).read_text())["step"])
                except (OSError, ValueError, KeyError):
                    return 0

            wait(lambda: step() >= 50, 120, "step 50")
            victim = job["nodes"][2]
            CLOCK["fault"] = time.monotonic()
            run(env, "sim", "inject", victim, "xid79", "--gpu", "2")
            page = wait(
                lambda: next(
                    (p for p in Receiver.posts if "approval.needed" in p["subject"]), None
                ),
                300,
                "the page",
            )
            say(f"PAGE: {page['subject']}")
            for line in page["text"].splitlines():
                print(f"            | {line}")
            run_name = re.search(r"trainmedic approve ([\w-]+)", page["text"])[1]  # type: ignore[index]
            run(env, "status")
            run(env, "approve", run_name, "--reason", "Xid 79 in the kernel log", "--by", "oncall")

            def finished() -> bool:
                rows = json.loads(run(env, "runs", "--job", job["job_id"], "--json", show=False))
                return bool(rows) and rows[0]["state"] in ("Completed", "Failed")

            wait(finished, 300, "the triage run to finish")
            run(env, "runs", "--job", job["job_id"])
            run(env, "status")
            others = [p["subject"] for p in Receiver.posts if p is not page]
            say(f"other messages at the receiver: {others or 'none'}")
        finally:
            CLOCK["fault"] = 0.0
            run(env, "down", show=False)
            subprocess.run(
                [CLI, "sim", "create", "--nodes", "1"], env=env, capture_output=True, check=False
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
