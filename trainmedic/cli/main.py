"""``trainmedic``: the on-call engineer's command line.

Every command that changes something goes through the Prefect API (runs show up in the UI);
bad input gets one line naming the field and value, and exit code 2. Each command group lives
in its own module of this package and registers itself with :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

import httpx
from pydantic import ValidationError

from trainmedic.cli import (
    approvals,
    diagnose,
    history,
    intake,
    locate,
    runbooks,
    safety,
    sim,
    stack,
)
from trainmedic.cli.common import (
    EXIT_BROKEN_PIPE,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_SERVER,
    Handler,
    validation_message,
)
from trainmedic.core.errors import InputError, ServerError, TrainmedicError

COMMAND_GROUPS = (stack, intake, runbooks, approvals, safety, history, sim, diagnose, locate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainmedic", description="Remediation runbooks for pre-training clusters."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str, handler: Handler, help_text: str, description: str | None = None
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=description or help_text)
        p.set_defaults(handler=handler)
        return p

    for group in COMMAND_GROUPS:
        group.register(add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Whatever goes wrong ends in one line on stderr naming what and why,
    and a documented exit code (trainmedic.cli.common), never a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except InputError as exc:
        return _fail(f"invalid input: {exc}", EXIT_INPUT)
    except ValidationError as exc:
        return _fail(f"invalid input: {validation_message(exc)}", EXIT_INPUT)
    except ServerError as exc:
        return _fail(str(exc), EXIT_SERVER)
    except TrainmedicError as exc:
        return _fail(str(exc), EXIT_INPUT)
    except httpx.HTTPStatusError as exc:
        code = exc.response.status_code
        if code in (401, 403):
            return _fail(
                f"the Prefect API at {exc.request.url.host}:{exc.request.url.port} refused our "
                f"credentials (HTTP {code}): check TRAINMEDIC_SERVER_AUTH",
                EXIT_SERVER,
            )
        detail = exc.response.text.replace("\n", " ")[:160]
        return _fail(
            f"the Prefect API answered HTTP {code} to {exc.request.url.path}: {detail}", EXIT_SERVER
        )
    except httpx.HTTPError as exc:
        return _fail(
            f"the Prefect API could not be reached ({type(exc).__name__}: {str(exc)[:120]})",
            EXIT_SERVER,
        )
    except BrokenPipeError:
        # `trainmedic runs | head`: the reader left. Nothing more can go to stdout.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _fail("output closed early (broken pipe)", EXIT_BROKEN_PIPE)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)


def _fail(message: str, code: int) -> int:
    with contextlib.suppress(OSError):
        print(f"trainmedic: {message}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
