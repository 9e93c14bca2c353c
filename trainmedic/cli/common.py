"""What every command module shares: output helpers and the error every bad input becomes."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Protocol

from pydantic import ValidationError

# Exit codes (README "On call: the CLI"): 0 done; 1 the runbook ran but did not complete;
# 2 bad input, an unknown job or node, or a refusal before any run is created (named in the
# one line printed); 3 the Prefect API is unreachable or refused our credentials; 4 the
# runbook completed but refused, or left the decision to a human; 130 interrupted; 141 the
# output was closed early (nothing printed: the reader chose to stop reading).
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
    import httpx

    from trainmedic.core.errors import ServerError
    from trainmedic.core.settings import get_settings
    from trainmedic.stack import apply_prefect_env

    apply_prefect_env(get_settings())  # before Prefect reads its settings
    from prefect.client.orchestration import get_client

    url = os.environ.get("PREFECT_API_URL", "")
    with get_client(sync_client=True, httpx_settings={"timeout": 5}) as client:
        problem = client.api_healthcheck()
    if isinstance(problem, httpx.HTTPStatusError) and problem.response.status_code in (401, 403):
        raise problem  # a proxy guarding even the health check: main() names the refusal
    if problem is not None:
        raise ServerError(
            f"the Prefect API at {url or '?'} does not answer ({type(problem).__name__}: "
            f"{str(problem)[:120] or 'no detail'}): is the server up? (`trainmedic up`)"
        )


def persisted_result(state: object) -> object:
    """The run's result as the worker persisted it (JSON, see the runbooks' flow decorators)
    in this installation's result storage: the worker's PREFECT_HOME/storage, on this host or
    a shared file system. Read as plain JSON: the result's class lives in the worker's
    entrypoint module, which this process need not import."""
    import json

    from prefect.filesystems import LocalFileSystem
    from prefect.results import ResultRecordMetadata

    from trainmedic.core.settings import get_settings

    meta = state.data  # type: ignore[attr-defined]
    if not isinstance(meta, ResultRecordMetadata):
        return state.result()  # type: ignore[attr-defined]
    storage = LocalFileSystem(basepath=str(get_settings().prefect_home / "storage"))
    decoded = json.loads(storage.read_path(meta.storage_key))
    return decoded.get("data", decoded) if isinstance(decoded, dict) else decoded


def needs_human(outcome: dict[str, object]) -> str | None:
    """What the completed run refused or left to a human, from its result; None when it did
    what was asked."""
    for key in ("not_handled", "human_needed"):
        if outcome.get(key):
            return str(outcome[key])
    if outcome.get("restored") is False and "dry run" not in str(outcome.get("verdict")):
        return f"{outcome.get('verdict')}: {outcome.get('reason')}"
    if outcome.get("acted") is False:
        return "nothing was rolled back (a human said no, or did not answer, or the budget)"
    return None


def outcome_summary(outcome: object, *, paged: str | None = None) -> str:
    """One cell for `trainmedic runs`: what the run found and did, from its result, and
    whether it paged on-call (``paged``: what the page said, from the run's page event)."""
    outcome = outcome if isinstance(outcome, dict) else {}
    parts = [str(outcome["category"])] if outcome.get("category") else []
    drained = outcome.get("drained")
    if drained:
        parts.append("drained " + ",".join(map(str, drained)))
    if outcome.get("new_job_id"):
        parts.append(f"resubmitted as {outcome['new_job_id']}")
    human = needs_human(outcome)
    if paged is not None:
        # The result's reason is the shorter, when there is one: the page's summary repeats
        # the job and category already in the row.
        parts.append(f"paged: {(human or paged)[:80]}")
    elif human:
        parts.append(f"human: {human[:80]}")
    return "; ".join(parts)
