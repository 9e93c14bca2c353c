"""The simulated hardware, the CLI helper and the benchmark's smoke run."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from trainmedic.core.errors import InputError
from trainmedic.locate.simulation import (
    SimulatedFabric,
    ThreadedExecutor,
    locate_simulated,
    simulated_nodes,
)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "locate.py"


def test_simulated_nodes() -> None:
    assert simulated_nodes(3) == ["node001", "node002", "node003"]
    assert simulated_nodes(12345)[-1] == "node12345"
    with pytest.raises(InputError) as err:
        simulated_nodes(0)
    assert err.value.field == "simulate"


def test_fabric_answers_like_the_hardware_model() -> None:
    fabric = SimulatedFabric({"a1"}, {"a3"}, transient={"a5": 1})
    assert not fabric.test(("a1", "a2")).ok
    slow, fast = fabric.test(("a3", "a4")), fabric.test(("a5", "a6"))
    assert slow.ok and fast.ok
    assert slow.busbw_gbps is not None and fast.busbw_gbps is not None
    assert slow.busbw_gbps < 0.5 * fast.busbw_gbps
    assert not fabric.test(("a5", "a7")).ok  # a5's second test: the transient
    assert fabric.test(("a5", "a7")).ok  # once only
    assert fabric.test(("a5", "a6")) == fast  # deterministic


def test_locate_simulated_runs_each_round_concurrently() -> None:
    nodes = simulated_nodes(64)
    start = time.perf_counter()
    report = locate_simulated(nodes, {nodes[3]}, {nodes[40]}, test_seconds=0.05)
    wall = time.perf_counter() - start
    assert report.faulty == (nodes[3],)
    assert report.slow == (nodes[40],)
    assert report.rounds == 2
    assert 0.1 <= wall < 0.1 + 1.0  # two rounds of 0.05 s, not 36 tests of 0.05 s
    summary = report.summary(wall)
    assert summary["faulty"] == [nodes[3]]
    assert summary["tests_run"] == report.tests_run


def test_locate_simulated_rejects_unknown_nodes() -> None:
    with pytest.raises(InputError) as err:
        locate_simulated(["a1", "a2"], {"a9"}, test_seconds=0)
    assert err.value.field == "faulty"
    with pytest.raises(InputError) as err:
        locate_simulated(["a1", "a2"], set(), {"a1", "a9"}, test_seconds=0)
    assert err.value.field == "slow"


def test_executor_bounds_concurrency() -> None:
    fabric = SimulatedFabric()
    groups = [(f"a{i}", f"b{i}") for i in range(4)]
    with ThreadedExecutor(fabric, test_seconds=0.05, concurrency=2) as run:
        start = time.perf_counter()
        results = run(groups)
        wall = time.perf_counter() - start
    assert [r.nodes for r in results] == groups
    assert wall >= 0.1  # four tests, two at a time
    assert run.batches == 1


def test_bench_smoke(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("bench_locate", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_locate", bench)  # dataclasses look it up
    spec.loader.exec_module(bench)
    argv = ["--sizes", "16,64", "--no-stress", "--test-seconds", "0.001", "--repeat", "1"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("| yes |") == 4
    assert "goal" in out and "met" in out
