"""What every command module shares: output helpers and the error every bad input becomes."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Protocol

from pydantic import ValidationError

EXIT_INPUT = 2

Handler = Callable[[argparse.Namespace], int]


class AddCommand(Protocol):
    """How a command module registers its commands: ``add(name, handler, help)`` returns the
    command's parser for its arguments."""

    def __call__(
        self, name: str, handler: Handler, help_text: str, description: str | None = None
    ) -> argparse.ArgumentParser: ...


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


def validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or "input"
    return f"{field}={first.get('input')!r}: {first.get('msg')}"


def ui_link(flow_run_id: object) -> str:
    return f"{os.environ['PREFECT_UI_URL'].rstrip('/')}/runs/flow-run/{flow_run_id}"


def with_prefect() -> None:
    """Point the Prefect client at this installation's API (unless the environment does)."""
    from trainmedic.core.settings import get_settings
    from trainmedic.stack import apply_prefect_env

    apply_prefect_env(get_settings())
