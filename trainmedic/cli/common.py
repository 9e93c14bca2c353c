"""What every command module shares: output helpers and the error every bad input becomes."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Protocol

from pydantic import ValidationError

# Exit codes (README "On call: the CLI"): 0 done; 1 the runbook ran but did not complete;
# 2 bad input, an unknown job or node, or a refusal (named in the one line printed); 3 the
# Prefect API is unreachable or refused us; 4 the runbook completed but refused, or left the
# decision to a human; 130 interrupted; 141 the output was closed early.
EXIT_RUN_FAILED = 1
EXIT_INPUT = 2
EXIT_SERVER = 3
EXIT_HUMAN = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

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
    """Point the Prefect client at this installation's API (unless the environment does) and
    make sure it answers: a stopped server is one line in a few seconds, not a traceback
    after the client's retries."""
    from trainmedic.core.errors import ServerError
    from trainmedic.core.settings import get_settings
    from trainmedic.stack import apply_prefect_env

    apply_prefect_env(get_settings())  # before Prefect reads its settings
    from prefect.client.orchestration import get_client

    url = os.environ.get("PREFECT_API_URL", "")
    with get_client(sync_client=True, httpx_settings={"timeout": 5}) as client:
        problem = client.api_healthcheck()
    if problem is not None:
        raise ServerError(
            f"the Prefect API at {url or '?'} does not answer ({type(problem).__name__}: "
            f"{str(problem)[:120] or 'no detail'}): is the server up? (`trainmedic up`)"
        )
