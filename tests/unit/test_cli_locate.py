"""`trainmedic locate`: the --simulate JSON contract, and bad input exits 2 with one line."""

from __future__ import annotations

import json

import pytest

from trainmedic.cli.main import main


def test_simulate_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "locate",
            "--simulate",
            "16",
            "--faulty",
            "node003",
            "--slow",
            "node011",
            "--test-seconds",
            "0",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["faulty"] == ["node003"]
    assert out["slow"] == ["node011"]
    assert out["rounds"] == 2
    assert isinstance(out["tests_run"], int) and out["tests_run"] >= 10
    assert isinstance(out["wall_s"], float) and out["wall_s"] >= 0


def test_simulate_a_subset_given_as_an_expression(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "locate",
            "--simulate",
            "64",
            "--faulty",
            "node0[10,20]",
            "--test-seconds",
            "0",
            "--json",
            "node0[01-32]",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["faulty"] == ["node010", "node020"] and out["slow"] == []
    assert out["healthy"] == 30


def test_simulate_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["locate", "--simulate", "8", "--faulty", "node002", "--test-seconds", "0"]) == 0
    out = capsys.readouterr().out
    assert "faulty:       node002" in out and "rounds 2" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["locate", "node[1-"],
        ["locate", "node[003-001]"],
        ["locate", "Node01;reboot"],
        ["locate"],
        ["locate", "--simulate", "8", "--faulty", "node009"],
        ["locate", "--simulate", "8", "--faulty", "x;y"],
        ["locate", "--faulty", "node001", "node001"],
    ],
)
def test_bad_input_exits_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainmedic: invalid input:") and "\n" not in err


def test_nodes_outside_the_inventory_exit_2_before_any_run(
    tm_home, sim, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["locate", "node[007-009]"]) == 2
    assert "node009" in capsys.readouterr().err
