"""``trainmedic``: the on-call engineer's command line.

Every command that changes something goes through the Prefect API (runs show up in the UI);
bad input gets one line naming the field and value, and exit code 2. Each command group lives
in its own module of this package and registers itself with :func:`build_parser`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

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
from trainmedic.cli.common import EXIT_INPUT, Handler, validation_message
from trainmedic.core.errors import InputError, TrainmedicError

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
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except InputError as exc:
        print(f"trainmedic: invalid input: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except ValidationError as exc:
        print(f"trainmedic: invalid input: {validation_message(exc)}", file=sys.stderr)
        return EXIT_INPUT
    except TrainmedicError as exc:
        print(f"trainmedic: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
