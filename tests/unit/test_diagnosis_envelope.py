"""A line's message inside its envelope: timestamps, levels, launcher tags, colours, JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache

import pytest
from support.corpus import dev_rows

from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis import LogSource, diagnose
from trainmedic.diagnosis.attribution import attribute
from trainmedic.diagnosis.dispatch import line_text
from trainmedic.diagnosis.envelope import message_templates, messages, named_part
from trainmedic.diagnosis.learned import NO_WORDS

TRACEBACK = "Traceback (most recent call last):"


@pytest.mark.parametrize(
    "line",
    [
        f"2025-03-04T05:06:07.123456Z {TRACEBACK}",
        f"[2025-03-04 05:06:07,123] {TRACEBACK}",
        f"2025-03-04 05:06:07,123 - ERROR - {TRACEBACK}",
        f"2025/03/04 05:06:07 {TRACEBACK}",
        f"[05:06:07] {TRACEBACK}",
        f"INFO: {TRACEBACK}",
        f"[ERROR] {TRACEBACK}",
        f"12: {TRACEBACK}",  # srun --label
        f"[1,12]<stderr>:{TRACEBACK}",  # mpirun --tag-output
        f"[rank3]: {TRACEBACK}",
        f"[default0]:{TRACEBACK}",
        f"E0813 06:19:49.809000 161210 torch/distributed/api.py:869] {TRACEBACK}",
        f"> {TRACEBACK}",
        f"    {TRACEBACK}",
        json.dumps({"log": TRACEBACK + "\n", "stream": "stderr", "time": "2025-03-04T05:06:07Z"}),
        json.dumps({"message": f"12: [rank3]: {TRACEBACK}"}),
        f"[2025-03-04 05:06:07,123] 12: [rank3]: {TRACEBACK}",  # several, in any order
        f"(TaskRunner pid=844447) {TRACEBACK}",  # a Ray worker's output
        f"(RayWorker pid=9, ip=10.0.0.3) {TRACEBACK}",
        f"i.finetune/0 [default0]:[rank0]: {TRACEBACK}",  # torchx / NeMo-Run's role and rank
    ],
)
def test_the_message_is_found_inside_its_envelope(line: str) -> None:
    assert messages(line)[-1] == TRACEBACK


def test_a_terminal_control_sequence_is_never_part_of_a_line() -> None:
    raw = b"\x1b[1;31mRuntimeError\x1b[0m: CUDA error: an illegal memory access\x1b[K"
    assert line_text(raw) == "RuntimeError: CUDA error: an illegal memory access"
    assert line_text(b"#033[31mTraceback (most recent call last):#033[0m") == TRACEBACK  # rsyslog


def test_a_writer_name_is_kept_in_the_first_message_and_dropped_in_the_next() -> None:
    line = "[2025-03-04 05:06:07,123] node7: bash: /opt/run.sh: No such file or directory"
    assert messages(line) == (
        "node7: bash: /opt/run.sh: No such file or directory",
        "bash: /opt/run.sh: No such file or directory",
    )
    assert named_part(line) == messages(line)[0]
    assert attribute(line)[0] == "node7"  # who wrote it: past the timestamp


@pytest.mark.parametrize(
    "line",
    [
        TRACEBACK,
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:219",
        # the kernel's time: what follows is the kernel's own words, not a program's output
        "[  479.971084] INFO: task python:3780 blocked for more than 120 seconds.",
        "May 29 10:01:02 node12 kernel: NVRM: Xid (PCI:0000:3b:00): 79",
    ],
)
def test_a_line_without_an_envelope_has_no_message(line: str) -> None:
    assert messages(line) == ()


def test_json_with_digits_inside_an_escape_stays_whole() -> None:
    # the masked line's escape would read otherwise ("\u000b"): its message would not be the
    # masked message
    line = '{"log": "\\u001b[31mTraceback (most recent call last):\\n"}'
    assert not any(m.startswith(TRACEBACK) for m in messages(line))


def test_a_device_after_the_kernel_time_is_no_writer() -> None:
    assert attribute("[  812.113204] ata3: SATA link down (SStatus 0 SControl 300)")[0] is None
    assert attribute("[  812.113204] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028")[0] is None


def test_the_message_keeps_its_own_indentation() -> None:
    line = "[2025-03-04 05:06:07,123]     model.load_state_dict(torch.load(path))"
    assert messages(line)[0] == "    model.load_state_dict(torch.load(path))"


def test_masked_templates_have_the_masked_messages() -> None:
    line = "[2025-03-04 05:06:07,123] INFO: [rank3]: node7: Thread 0x7f00 (most recent call first)"
    template = line.lower().translate(str.maketrans("0123456789", "0" * 10)).encode()
    found = message_templates(template)
    assert [text for text, _ in found] == [
        b"node0: thread 0x0f00 (most recent call first)",
        b"thread 0x0f00 (most recent call first)",
    ]
    assert not any(inside for _, inside in found)  # only a prefix went
    coloured = message_templates(b"\x1b[00merror\x1b[0m: cuda error")
    assert coloured[0] == (b"error: cuda error", True)


WRAPPERS: dict[str, Callable[[str], str]] = {
    "logging timestamp": lambda line: f"[2025-03-04 05:06:07,123] {line}",
    "srun --label": lambda line: f"3: {line}",
    "mpirun --tag-output": lambda line: f"[1,3]<stderr>:{line}",
    "quoted in a report": lambda line: f"> {line}",
    "indented in a report": lambda line: f"    {line}",
    "container JSON": lambda line: json.dumps({"log": line + "\n", "stream": "stderr"}),
}


def _category(name: str, log: str) -> Category:
    return diagnose([LogSource.from_text(name, log)], learned=NO_WORDS).category


@cache
def _sample() -> list[tuple[str, str, Category]]:
    """About 250 real logs of every category (every 16th row), with the rules' verdict."""
    return [(row["id"], row["log"], _category(row["id"], row["log"])) for row in dev_rows()[::16]]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_real_logs_get_the_same_verdict_inside_an_envelope(wrapper: str) -> None:
    """Every line of a real failure log wrapped the same way (as a launcher, a logging setup
    or a log shipper does): the rules reach the same category."""
    wrap = WRAPPERS[wrapper]
    changed = []
    for name, log, plain in _sample():
        wrapped = _category(name, "\n".join(wrap(line) for line in log.split("\n")))
        if wrapped is not plain:
            changed.append((name, plain.value, wrapped.value))
    # JSON leaves a line whole where its text holds a \\u escape (non-ASCII, a control byte)
    assert len(changed) <= (2 if wrapper == "container JSON" else 0), changed
