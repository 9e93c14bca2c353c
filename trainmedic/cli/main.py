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
from typing import NoReturn

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


class _Parser(argparse.ArgumentParser):
    """argparse, with its refusals in one line as every other bad input (argparse prints its
    usage block first): the argument and the value, exit 2. Subcommands' parsers are of this
    class too (add_subparsers makes them of the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INPUT, f"trainmedic: invalid input: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    and a documented exit code (trainmedic.cli.common), never a traceback. Output closed
    early (`| head`) ends quietly with EXIT_BROKEN_PIPE."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:  # --help, or a refusal: argparse's way out, kept for callers
        if not _flushed():
            raise SystemExit(EXIT_BROKEN_PIPE) from None
        raise
    except BrokenPipeError:  # a --help longer than the pipe's buffer
        return _closed_pipe()
    code = _run(args.handler, args)
    # Flushed here, inside the handling of a closed pipe: left to the interpreter's exit, a
    # reader gone (`trainmedic sim status | head -1`, stdout not a terminal so buffered)
    # is "Exception ignored ... BrokenPipeError" and exit 120.
    return code if _flushed() else EXIT_BROKEN_PIPE


def _run(handler: Handler, args: argparse.Namespace) -> int:
    try:
        return int(handler(args))
    except InputError as exc:
        return _fail(f"invalid input: {exc}", EXIT_INPUT)
    except ValidationError as exc:
        return _fail(f"invalid input: {validation_message(exc)}", EXIT_INPUT)
    except ServerError as exc:
        # A record the server would not give us (trainmedic.adapters.server_state), an event
        # it would not take: credentials refused is not a server away.
        cause = exc.__cause__
        if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code in (401, 403):
            return _refused(cause)
        return _fail(str(exc), EXIT_SERVER)
    except TrainmedicError as exc:
        return _fail(str(exc), EXIT_INPUT)
    except httpx.HTTPStatusError as exc:
        code = exc.response.status_code
        if code in (401, 403):
            return _refused(exc)
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
        return _closed_pipe()
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)


def _refused(exc: httpx.HTTPStatusError) -> int:
    url = exc.request.url
    return _fail(
        f"the Prefect API at {url.host}:{url.port} refused our credentials "
        f"(HTTP {exc.response.status_code}): check TRAINMEDIC_SERVER_AUTH",
        EXIT_SERVER,
    )


def _flushed() -> bool:
    """Flush stdout; False when its reader is gone (then it points at /dev/null)."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        _closed_pipe()
        return False
    return True


def _closed_pipe() -> int:
    """The reader left (`trainmedic runs | head`): what it did not read was not wanted, so
    this is no error to report. stdout points at /dev/null from here on, so that the
    interpreter's last flush of what is still buffered fails no more."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


def _fail(message: str, code: int) -> int:
    # One line, even when a message carries another's (httpx's has a second line).
    line = " ".join(message.split())
    with contextlib.suppress(OSError):
        print(f"trainmedic: {line}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
