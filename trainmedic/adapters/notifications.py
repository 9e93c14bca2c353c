"""On-call notifications through Prefect automations: when a runbook fails, crashes or pauses
for an approval, a notification block is sent a message with the run's link.

Slack: create a ``SlackWebhook`` block instead (``prefect.blocks.notifications.SlackWebhook``,
its URL is stored as a secret) and pass its name with ``--block``; any other service that
takes an HTTP POST works with the generic webhook block made here.
"""

from __future__ import annotations

import contextlib

from prefect.automations import Automation, EventTrigger, SendNotification
from prefect.blocks.core import Block
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.exceptions import ObjectNotFound

from trainmedic.core.errors import InputError

AUTOMATION_NAME = "trainmedic-runbook-needs-a-human"
WATCHED_STATES = ("Failed", "Crashed", "Paused", "TimedOut")
SUBJECT = "trainmedic: {{ flow.name }} run {{ flow_run.name }} is {{ flow_run.state.name }}"
BODY = (
    "Runbook {{ flow.name }} ({{ flow_run.name }}) is {{ flow_run.state.name }}"
    "{% if flow_run.state.message %}: {{ flow_run.state.message }}{% endif %}.\n"
    "Parameters: {{ flow_run.parameters }}\n"
    "Open it: {{ flow_run|ui_url }}"
)


def webhook_block(name: str, url: str) -> CustomWebhookNotificationBlock:
    if not url.startswith(("https://", "http://")):
        raise InputError("webhook_url", "<hidden>", "must be an http(s) URL")
    return CustomWebhookNotificationBlock(
        name=name,
        url=url,
        json_data={"subject": "{{subject}}", "text": "{{body}}"},
    )


def install(*, block_name: str, webhook_url: str | None = None) -> Automation:
    """Create (or replace) the notification automation; returns it. With ``webhook_url`` a
    generic webhook block named ``block_name`` is saved first; without, the block must
    exist (e.g. a SlackWebhook)."""
    if webhook_url is not None:
        webhook_block(block_name, webhook_url).save(block_name, overwrite=True)
    block = _load_any_block(block_name)
    with contextlib.suppress(ValueError, ObjectNotFound):  # first installation
        Automation.read(name=AUTOMATION_NAME).delete()
    automation = Automation(
        name=AUTOMATION_NAME,
        description="A trainmedic runbook failed, crashed, timed out or waits for approval.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={
                "prefect.resource.id": "prefect.tag.trainmedic",
                "prefect.resource.role": "tag",
            },
            expect={f"prefect.flow-run.{state}" for state in WATCHED_STATES},
            posture="Reactive",
            threshold=1,
            within=0,
        ),
        actions=[
            SendNotification(block_document_id=block._block_document_id, subject=SUBJECT, body=BODY)
        ],
    )
    return automation.create()


def _load_any_block(name: str) -> Block:
    for block_type in (CustomWebhookNotificationBlock, *_slack()):
        try:
            return block_type.load(name)
        except ValueError:
            continue
    raise InputError("block", name, "no webhook or Slack notification block with that name")


def _slack() -> tuple[type[Block], ...]:
    from prefect.blocks.notifications import SlackWebhook

    return (SlackWebhook,)
