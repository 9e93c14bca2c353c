"""On-call notifications through Prefect automations, two of them, both to one notification
block:

* a runbook failed, crashed, timed out or paused: a message with the run's state and link;
* a runbook decided a human must act: it emitted ``trainmedic.page`` (crash loop, retry
  budget spent, cause unknown...), ``trainmedic.owner.notify`` (a script error for the job's
  owner) or ``trainmedic.approval.needed`` (a paused run), each carrying the job, the run,
  the category, the evidence and the exact CLI line that answers it; the message says so.

Slack: create a ``SlackWebhook`` block instead (``prefect.blocks.notifications.SlackWebhook``,
its URL is stored as a secret) and pass its name with ``--block``; e-mail: a ``SendgridEmail``
block (API key and the addresses to mail); PagerDuty, Opsgenie and Microsoft Teams blocks work
the same way. Any other service that takes an HTTP POST works with the generic webhook block
made here.
"""

from __future__ import annotations

import contextlib

from prefect.automations import Automation, EventTrigger, SendNotification
from prefect.blocks.core import Block
from prefect.blocks.notifications import CustomWebhookNotificationBlock
from prefect.exceptions import ObjectNotFound

from trainmedic.core.errors import InputError

AUTOMATION_NAME = "trainmedic-runbook-needs-a-human"
PAGE_AUTOMATION_NAME = "trainmedic-pages"
PAGE_EVENTS = ("trainmedic.page", "trainmedic.owner.notify", "trainmedic.approval.needed")
PAGE_SUBJECT = (
    "trainmedic {{ event.event | replace('trainmedic.', '') }}: "
    "job {{ event.payload.job_id }} {{ event.payload.category }}"
)
PAGE_BODY = (
    "{{ event.payload.summary }}\n"
    "Run: {{ event.payload.run_name }}\n"
    "Evidence: {{ event.payload.evidence }}\n"
    "Answer: {{ event.payload.answer }}"
)
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
    for name in (AUTOMATION_NAME, PAGE_AUTOMATION_NAME):
        with contextlib.suppress(ValueError, ObjectNotFound):  # first installation
            Automation.read(name=name).delete()
    Automation(
        name=PAGE_AUTOMATION_NAME,
        description="A trainmedic runbook decided a human must act: page, owner notice, approval.",
        trigger=EventTrigger(
            match={"prefect.resource.id": ["trainmedic.job.*", "trainmedic.run.*"]},
            expect=set(PAGE_EVENTS),
            posture="Reactive",
            threshold=1,
            within=0,
        ),
        actions=[
            SendNotification(
                block_document_id=block._block_document_id, subject=PAGE_SUBJECT, body=PAGE_BODY
            )
        ],
    ).create()
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
    for block_type in _notification_block_types():
        try:
            return block_type.load(name)
        except ValueError:
            continue
    raise InputError(
        "block",
        name,
        "no notification block with that name (webhook, Slack, e-mail through SendGrid, "
        "PagerDuty, Opsgenie, Microsoft Teams)",
    )


def _notification_block_types() -> tuple[type[Block], ...]:
    """Prefect's own notification blocks an on-call team uses: the generic webhook made here,
    and the ones created in the UI (their secrets stay in the block)."""
    from prefect.blocks.notifications import (
        MicrosoftTeamsWebhook,
        OpsgenieWebhook,
        PagerDutyWebHook,
        SendgridEmail,
        SlackWebhook,
    )

    return (
        CustomWebhookNotificationBlock,
        SlackWebhook,
        SendgridEmail,
        PagerDutyWebHook,
        OpsgenieWebhook,
        MicrosoftTeamsWebhook,
    )


def installed() -> bool:
    """Whether the page automation exists (a page event with none reaches nobody)."""
    try:
        Automation.read(name=PAGE_AUTOMATION_NAME)
    except (ValueError, ObjectNotFound):
        return False
    return True
