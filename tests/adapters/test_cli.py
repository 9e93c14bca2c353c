"""Bad input on the command line: one line naming the field and the value, exit code 2, no
traceback, nothing started."""

from __future__ import annotations

import pytest

from trainmedic.cli.main import main
from trainmedic.core.settings import get_settings
from trainmedic.stack import prefect_env


@pytest.fixture(autouse=True)
def keep_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI points this process at the stack (PREFECT_API_URL...): undo it afterwards, so
    no later test talks to a server that is not its own."""
    for key in prefect_env(get_settings()):
        monkeypatch.delenv(key, raising=False)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["sim", "inject", "node999", "ecc"], "node='node999'"),
        (["sim", "inject", "node001", "melted"], "fault='melted'"),
    ],
)
def test_bad_input_is_one_clear_line(sim, capsys, argv: list[str], named: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainmedic: ") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert named in err


def test_bad_setting_names_the_variable(monkeypatch, capsys) -> None:
    monkeypatch.setenv("TRAINMEDIC_SERVER_PORT", "seventy")
    get_settings.cache_clear()
    try:
        assert main(["status"]) == 2
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert "server_port" in err and "seventy" in err


def test_sim_status_json(sim, capsys) -> None:
    import json

    assert main(["sim", "status", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows][:2] == ["node001", "node002"]
    assert rows[0]["fault"] == "healthy" and rows[0]["scheduler"]["state"] == "IDLE"
