"""What an on-call engineer sees in the Prefect UI, looked at with headless Chromium: the
triage report of a finished run on its artifact page, and a locate run paused for a drain
approval on its flow-run page, with the approval form that its "Resume" button opens. The
server is the embedded one (`prefect server start`, which serves the classic UI at `/`); the
runbooks run in this process against it, on the simulated cluster. DOM dumps carry the
assertions; the screenshots are kept under pytest's tmp dir for a human to look at."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import httpx
import pytest
from support.stack import embedded_stack
from support.waits import run_in_thread, unique_run_name, wait_finished, wait_paused, wait_step

from trainmedic.adapters.scheduler.sim import SimScheduler
from trainmedic.core.models import JobSpec, NodeState
from trainmedic.core.settings import Settings
from trainmedic.sim.cluster import SimCluster
from trainmedic.sim.hardware import NodeFault
from trainmedic.stack import Stack

CHROMIUM = Path(os.environ.get("TRAINMEDIC_CHROMIUM", "/usr/bin/chromium"))
# The UI is a single-page app: the page's text exists only after its JS has fetched the run.
VIRTUAL_TIME_MS = 15_000
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1400,1000",
    f"--virtual-time-budget={VIRTUAL_TIME_MS}",
]

pytestmark = [
    pytest.mark.ui,
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.is_file(),
        reason=f"{CHROMIUM} not found: apt-get install chromium (scripts/test.sh does as root)",
    ),
]


@dataclass
class Page:
    dom: str
    png: Path


def browse(url: str, out: Path, name: str) -> Page:
    """The rendered DOM and a screenshot of ``url``, each from a fresh Chromium profile."""
    out.mkdir(parents=True, exist_ok=True)
    png = out / f"{name}.png"
    runs = {
        "dom": ["--dump-dom", url],
        "png": [f"--screenshot={png}", url],
    }
    dom = ""
    for kind, args in runs.items():
        profile = out / f"profile-{name}-{kind}"
        done = subprocess.run(
            [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        shutil.rmtree(profile, ignore_errors=True)
        assert done.returncode == 0, f"chromium {kind} {url}: rc={done.returncode}\n{done.stderr}"
        if kind == "dom":
            dom = done.stdout
    (out / f"{name}.html").write_text(dom)
    assert png.is_file() and png.stat().st_size > 10_000, f"no screenshot of {url}"
    return Page(dom=dom, png=png)


class DevTools:
    """Just enough of the Chrome DevTools Protocol to click a button: the CLI flags can load a
    page but not press its "Resume", and the approval form only exists in the modal it opens.
    (Prefect already depends on `websockets`; no browser-driver package is needed.)"""

    def __init__(self, out: Path, name: str) -> None:
        self.profile = out / f"profile-{name}-devtools"
        flags = [f for f in CHROMIUM_FLAGS if not f.startswith("--virtual-time-budget")]
        self.proc = subprocess.Popen(
            [
                str(CHROMIUM),
                *flags,
                f"--user-data-dir={self.profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        port_file = self.profile / "DevToolsActivePort"
        self._until(lambda: port_file.is_file() and len(port_file.read_text().split()) >= 2, 60)
        port = int(port_file.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t.get("type") == "page")
        from websockets.sync.client import connect

        self.ws = connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        self._id = 0

    def call(self, method: str, **params: object) -> dict[str, object]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:  # events arrive in between; only our answer matters
            message = json.loads(self.ws.recv(timeout=60))
            if message.get("id") == self._id:
                assert "error" not in message, f"{method}: {message['error']}"
                return dict(message.get("result", {}))

    def js(self, expression: str) -> object:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return dict(result["result"]).get("value")  # type: ignore[arg-type]

    def wait_text(self, text: str, timeout: float = 60) -> None:
        probe = f"!!document.body && document.body.innerText.includes({json.dumps(text)})"
        self._until(lambda: bool(self.js(probe)), timeout, f"{text!r} never appeared")

    def screenshot(self, png: Path) -> None:
        png.write_bytes(base64.b64decode(str(self.call("Page.captureScreenshot")["data"])))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
        shutil.rmtree(self.profile, ignore_errors=True)

    @staticmethod
    def _until(condition: Callable[[], bool], timeout: float, message: str = "timeout") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.25)
        raise AssertionError(f"chromium: {message} within {timeout:.0f} s")


def click_and_capture(url: str, button: str, expect: str, out: Path, name: str) -> Page:
    """Open ``url``, press the button labelled ``button``, wait for ``expect``; DOM + PNG."""
    out.mkdir(parents=True, exist_ok=True)
    browser = DevTools(out, name)
    try:
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=1000,
            deviceScaleFactor=1,
            mobile=False,
        )
        browser.call("Page.navigate", url=url)
        browser.wait_text(button)
        pressed = browser.js(
            "(() => { const b = [...document.querySelectorAll('button')]"
            f".find(b => b.innerText.trim() === {json.dumps(button)});"
            " if (!b) return false; b.click(); return true; })()"
        )
        assert pressed, f"no {button!r} button on {url}"
        browser.wait_text(expect)
        time.sleep(1)  # the modal's open transition
        png = out / f"{name}.png"
        browser.screenshot(png)
        dom = str(browser.js("document.documentElement.outerHTML"))
    finally:
        browser.close()
    (out / f"{name}.html").write_text(dom)
    return Page(dom=dom, png=png)


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Settings, Stack]]:
    """The embedded Prefect server alone (no worker: the runbooks run in this process)."""
    root = tmp_path_factory.mktemp("ui")
    with embedded_stack(root, worker=False, env={"TRAINMEDIC_VERIFY_TIMEOUT_S": "60"}) as stack:
        yield stack


def test_triage_report_shows_on_its_artifact_page(ui_server, tmp_path: Path) -> None:
    from flows.triage import TriageRequest, triage

    settings, embedded = ui_server
    cluster = SimCluster(settings.sim_home)
    scheduler = SimScheduler(settings.sim_home)
    job = scheduler.submit(JobSpec(name="pretrain", nodes=3, steps=100_000, checkpoint_every=20))
    wait_step(job, 45)
    origin = job.nodes[1]
    cluster.inject(origin, "xid79", gpu=2)
    failed = wait_finished(scheduler, job.job_id)

    result = triage(TriageRequest(job_id=failed.job_id, event="job.failed"))
    assert result.category == "GPUFallenOff" and result.drained == [origin]

    page = browse(f"{embedded.ui_url}/artifacts/artifact/{result.report_id}", tmp_path, "triage")
    print(f"\ntriage report screenshot: {page.png}")
    # Rendered Markdown, not the raw source: the category is the report's bold cell, and the
    # actions table has a `drain | <origin>` row.
    assert re.search(r'text--strong">GPUFallenOff<', page.dom), "no bold category in the report"
    assert re.search(rf">drain</td><td[^>]*>{origin}<", page.dom), f"no drain row for {origin}"
    assert f"triage-{failed.job_id}" in page.dom  # the artifact's key, in the page header
    assert result.new_job_id is not None and result.new_job_id in page.dom


def test_fleet_report_shows_its_pictures_on_its_artifact_page(ui_server, tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from flows.report import FleetReportRequest, fleet_report_flow

    settings, embedded = ui_server
    cluster = SimCluster(settings.sim_home)
    scheduler = SimScheduler(settings.sim_home)
    job = scheduler.submit(JobSpec(name="fleet", nodes=2, steps=100_000, checkpoint_every=20))
    wait_step(job, 45)
    cluster.inject(job.nodes[1], "ecc")
    wait_finished(scheduler, job.job_id)
    cluster.repair(job.nodes[1])  # the report reads history; the next scenario needs the node whole

    state = fleet_report_flow(FleetReportRequest(since_h=1), return_state=True)
    result = state.result()
    assert f"incident-{job.job_id}.png" in result.plots
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    (artifact,) = [a for a in found if a.key == "fleet-report"]

    page = browse(f"{embedded.ui_url}/artifacts/artifact/{artifact.id}", tmp_path, "fleet")
    print(f"\nfleet report screenshot: {page.png}")
    # The UI renders the Markdown's data-URI images: one <img> per picture, not link text.
    shown = re.findall(r'<img[^>]*src="data:image/png;base64,', page.dom)
    assert len(shown) == len(result.plots), f"{len(shown)} images shown of {result.plots}"


def test_paused_locate_run_asks_for_approval_on_its_page(ui_server, tmp_path: Path, policy) -> None:
    policy(auto_approve_max=0, max_share=0.5)
    from prefect.flow_runs import resume_flow_run

    from flows.locate import LocateRequest, locate_faulty_nodes

    settings, embedded = ui_server
    cluster = SimCluster(settings.sim_home)
    scheduler = SimScheduler(settings.sim_home)
    for job in scheduler.jobs():  # the triage test's resubmission holds nodes: free them
        if not job.state.finished:
            scheduler.cancel(job.job_id, "next scenario")
    for name in ("node005", "node006", "node008"):  # only node007 is faulty in this scenario
        assert cluster.status(name).fault is NodeFault.healthy, f"{name} left faulty before"
    cluster.inject("node007", "nvlink")
    request = LocateRequest(
        nodes="node[005-008]",
        isolate=True,
        approval_timeout_s=300,
    )
    run_name = unique_run_name("ui-locate")
    thread, box = run_in_thread(locate_faulty_nodes, request, run_name)
    run_id: UUID | None = None
    try:
        run_id = wait_paused(run_name, timeout=120, box=box)
        page = browse(f"{embedded.ui_url}/runs/flow-run/{run_id}", tmp_path, "locate-paused")
        print(f"\npaused locate screenshot: {page.png}")
        assert "Paused" in page.dom
        assert "Resume" in page.dom  # the button that opens the approval form
        assert "locate-faulty-nodes" in page.dom
        # What the run waits for, in its log on the page's default tab.
        assert "isolation of [&#39;node007&#39;]: approval" in page.dom or (
            "isolation of ['node007']: approval" in page.dom
        )
        # "Resume" opens the approval form: the prompt and the answer's fields.
        form = click_and_capture(
            f"{embedded.ui_url}/runs/flow-run/{run_id}",
            "Resume",
            "Drain 1 node(s)?",
            tmp_path,
            "locate-approval-form",
        )
        print(f"approval form screenshot: {form.png}")
        text = re.sub(r"<[^>]+>", " ", form.dom)
        assert "Drain 1 node(s)? node007" in re.sub(r"\s+", " ", text)
        for field in ("decision", "nodes", "note"):
            assert field in text.lower(), f"no {field!r} field in the approval form"
    finally:
        # Answer either way, so the flow thread ends before the server goes.
        if run_id is not None:
            resume_flow_run(run_id, run_input={"decision": "reject", "note": "ui test"})
        thread.join(timeout=120)
    assert "error" not in box, box.get("error")
    assert "node007" not in {n.name for n in scheduler.nodes() if n.state is NodeState.DRAINED}
