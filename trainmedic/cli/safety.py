"""``trainmedic breaker | incidents | release | notify``: the circuit breaker, the storms
handled as incidents and the holds they left, and who hears about runbooks."""

from __future__ import annotations

import argparse

from trainmedic.cli.common import AddCommand, print_json, with_prefect
from trainmedic.core.errors import InputError
from trainmedic.core.settings import get_settings


def cmd_breaker(args: argparse.Namespace) -> int:
    """The breaker's state and the actions that count against it, from the Prefect server
    (what every worker sees); ``--reset`` records a human's reset there."""
    from datetime import UTC, datetime

    with_prefect()
    from trainmedic.adapters.server_state import ServerState
    from trainmedic.decisions.guard import breaker_state, circuit_breaker, counted_actions
    from trainmedic.state import ActionEntry, ActionKind

    settings = get_settings()
    store = ServerState(settings.cluster)
    breaker = circuit_breaker(settings)
    if args.reset:
        with store.lock():
            store.record_action(
                ActionEntry(
                    kind=ActionKind.breaker_reset,
                    target="on-call",
                    at=datetime.now(UTC),
                    flow_run="cli",
                )
            )
    entries = store.actions()
    now = datetime.now(UTC)
    state = breaker_state(entries, now, breaker)
    counted = counted_actions(entries, now, breaker)
    if args.json:
        print_json({**state.model_dump(), "actions": [e.model_dump(mode="json") for e in counted]})
        return 0
    print(state.describe())
    for entry in counted:
        print(f"  {entry.at:%Y-%m-%d %H:%M:%S}Z  {entry.kind:<9} {entry.target}  {entry.flow_run}")
    return 0


def cmd_incidents(args: argparse.Namespace) -> int:
    """Storms handled as one incident (newest first), from the Prefect server."""
    from datetime import UTC, datetime, timedelta

    with_prefect()
    from trainmedic.adapters.server_state import ServerState

    since = datetime.now(UTC) - timedelta(days=args.days)
    found = ServerState(get_settings().cluster).incidents(since=since)
    # An incident of one job is a plain triage: shown only with --all.
    shown = [i for i in reversed(found) if args.all or len(i.jobs) > 1]
    if args.json:
        print_json([i.model_dump(mode="json") for i in shown])
        return 0
    if not shown:
        print(f"no incidents in the last {args.days:g} days")
    for i in shown:
        state = "closed" if i.closed_at else "decided" if i.decided else "open"
        switches = (
            f"  suspected switch {', '.join(i.suspected_switches)}" if i.suspected_switches else ""
        )
        print(
            f"{i.opened_at:%Y-%m-%d %H:%M:%S}Z  {i.incident_id:<16} {state:<7} "
            f"jobs {','.join(i.jobs)}  run {i.leader}{switches}"
        )
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    """End a hold trainmedic placed (a suspected switch's nodes, an incident's): its nodes
    take jobs again. Only trainmedic's own holds (their names say so)."""
    from trainmedic.adapters.scheduler import get_scheduler
    from trainmedic.core import validate

    name = validate.hold_name(args.hold)
    released = get_scheduler().release(name)
    print(f"{name}: {'released' if released else 'no such hold (already ended)'}")
    return 0


def cmd_notify(args: argparse.Namespace) -> int:
    with_prefect()
    from trainmedic.adapters.notifications import install

    # The URL usually carries a token: it comes from the environment (TRAINMEDIC_WEBHOOK_URL)
    # rather than argv, which every user of the host sees in `ps`.
    settings = get_settings()
    url = settings.webhook_url.get_secret_value() if settings.webhook_url else None
    if args.webhook_from_env and not url:
        raise InputError("TRAINMEDIC_WEBHOOK_URL", "", "is not set")
    block = args.block or settings.notify_block
    automation = install(block_name=block, webhook_url=url if args.webhook_from_env else None)
    print(f"automation {automation.name} -> block {block}")
    return 0


def register(add: AddCommand) -> None:
    breaker = add("breaker", cmd_breaker, "the circuit breaker in front of destructive actions")
    breaker.add_argument(
        "--reset",
        action="store_true",
        help="close it again (recorded) after checking what the automation did",
    )
    breaker.add_argument("--json", action="store_true")

    incidents = add("incidents", cmd_incidents, "storms handled as one incident, newest first")
    incidents.add_argument("--days", type=float, default=7.0, help="how far back (default 7)")
    incidents.add_argument("--all", action="store_true", help="also single-job incidents")
    incidents.add_argument("--json", action="store_true")
    release = add("release", cmd_release, "end a hold trainmedic placed (e.g. a suspected switch)")
    release.add_argument("hold", help="the hold's name, e.g. trainmedic-switch-leaf03")

    notify = add(
        "notify",
        cmd_notify,
        "notify on-call when a runbook fails or waits for "
        "approval (Prefect automation -> notification block)",
    )
    notify.add_argument(
        "--block",
        default=None,
        help="notification block to send to (e.g. an existing SlackWebhook); "
        "default TRAINMEDIC_NOTIFY_BLOCK (trainmedic-oncall)",
    )
    notify.add_argument(
        "--webhook-from-env",
        action="store_true",
        help="first save a webhook block with the URL in TRAINMEDIC_WEBHOOK_URL",
    )
