"""Logs that end without saying why (``diagnosis.silence``): a log ending in progress is a weak
hang before the word table is asked; one ending in anything else with no word of an error is a
weaker hang, only once the word table has nothing either."""

from __future__ import annotations

from support.builders import job_info

from trainmedic.core.taxonomy import Category
from trainmedic.decisions.remediation import DEFAULT_CONFIDENCE_FLOOR, plan_remediation
from trainmedic.diagnosis import LogSource, diagnose
from trainmedic.diagnosis.learned import NO_WORDS, train

# An evaluation's metrics table, and the log stops: no progress line, no error, no exit.
METRICS = [
    "Validating runs/train/exp15/weights/best.pt...",
    "Fusing layers...",
    "                 Class     Images  Instances          P          R      mAP50   mAP50-95",
    "                   all        128        929      0.923      0.893      0.941      0.768",
    "                person        128        254      0.985      0.862      0.952      0.747",
]


def test_a_log_ending_with_no_word_of_an_error_is_a_weak_hang_that_drains_nothing() -> None:
    diagnosis = diagnose([LogSource.from_lines("gpu07.log", METRICS)], learned=NO_WORDS)
    assert diagnosis.category is Category.Hang
    assert diagnosis.evidence[0].signature == "log-ends-unexplained"
    assert "no word of an error" in diagnosis.evidence[0].text
    assert diagnosis.symptom_only and diagnosis.confidence < DEFAULT_CONFIDENCE_FLOOR
    # a guess, not proof: a script's crash whose last lines were lost reads the same
    plan = plan_remediation(diagnosis, job_info(nodes=("gpu07", "gpu08")))
    assert plan.page_oncall and plan.drain == () and not plan.restart and not plan.locate
    assert any("no word of an error" in reason for reason in plan.reasons)


def test_a_log_ending_in_progress_is_read_before_the_word_table() -> None:
    progress = [f"step {i} | loss 2.{i:02d}" for i in range(6)]
    table = train([(Category.StorageError, "step loss"), (Category.StorageError, "loss step")])
    diagnosis = diagnose([LogSource.from_lines("train.log", progress)], learned=table)
    assert diagnosis.category is Category.Hang
    assert diagnosis.evidence[0].signature == "log-ends-in-silence"


def test_the_word_table_is_read_before_an_unexplained_end() -> None:
    table = train(
        [
            (Category.StorageError, "warning: the mount made no headway, readers idle an hour"),
            (Category.StorageError, "warning: no headway on the mount, the readers sit idle"),
            (Category.Hang, "error: collective watchdog fired after the barrier"),
        ]
    )
    # a warning the table knows the words of, and no word of an error or an ending
    lines = [*METRICS, "WARNING: the mount made no headway, the readers sit idle"]
    diagnosis = diagnose([LogSource.from_lines("gpu07.log", lines)], learned=table)
    assert diagnosis.category is Category.StorageError and diagnosis.source == "learned"


def test_a_word_of_an_error_or_an_ending_is_no_silence() -> None:
    for last in (
        "Traceback (most recent call last):",
        "srun: error: gpu07: task 0: Exited with exit code 1",
        "slurmstepd: *** JOB 42 ON gpu07 CANCELLED AT 2026-12-02T10:00:00 ***",
        "Segmentation fault (core dumped)",
    ):
        diagnosis = diagnose(
            [LogSource.from_lines("gpu07.log", [*METRICS, last])], learned=NO_WORDS
        )
        assert all(
            e.signature not in {"log-ends-unexplained", "log-ends-in-silence"}
            for e in diagnosis.evidence
        ), last


def test_a_log_cut_inside_a_traceback_ended_in_a_crash_and_a_thread_dump_in_a_hang() -> None:
    """A traceback's frames ('line 12, in f') are printed as an exception is raised: a log
    cut inside them crashed, whatever the lines that said why. A watcher's dump of live
    threads (a hang) prints frames in the same form under its thread headers."""
    frames = [
        '  File "/opt/trl/trainer/grpo_trainer.py", line 404, in __init__',
        "    self.llm = LLM(",
        '  File "/opt/vllm/engine/llm_engine.py", line 429, in _initialize_kv_caches',
        "    self.model_executor.initialize_cache(num_gpu_blocks, num_cpu_blocks)",
    ]
    crashed = diagnose([LogSource.from_lines("gpu07.log", [*METRICS, *frames])], learned=NO_WORDS)
    assert crashed.category is Category.Unknown
    native = ["==== backtrace (tid:   4304) ====", " 0 0x0000000000014420 __funlockfile()  ???:0"]
    crashed = diagnose([LogSource.from_lines("gpu07.log", [*METRICS, *native])], learned=NO_WORDS)
    assert crashed.category is Category.Unknown
    dump = [*METRICS, "Printing stack", "-- Thread ID: 140180603557696 ---", *frames]
    stuck = diagnose([LogSource.from_lines("gpu07.log", dump)], learned=NO_WORDS)
    assert stuck.category is Category.Hang


def test_nccl_finding_no_infiniband_is_routine_and_no_ending() -> None:
    """On a host without InfiniBand NCCL warns that it cannot open the verbs library and goes
    on over sockets: a job silent after that warning stopped making progress."""
    lines = [
        "Rank 3: Completed store-based barrier for key:store_based_barrier_key:1 with 7 nodes.",
        "gpu07:34127:34127 [0] NCCL INFO Bootstrap : Using eno1:192.168.1.133<0>",
        "gpu07:34127:34127 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
        "gpu07:34127:34127 [0] NCCL INFO NET/Socket : Using [0]eno1:192.168.1.133<0>",
    ]
    diagnosis = diagnose([LogSource.from_lines("gpu07.log", lines)], learned=NO_WORDS)
    assert diagnosis.category is Category.Hang and diagnosis.symptom_only


def test_a_known_heartbeat_age_is_read_instead() -> None:
    """Where the caller knows when the job last made progress, that (not the log's end) says
    whether it hung."""
    diagnosis = diagnose(
        [LogSource.from_lines("gpu07.log", METRICS)], heartbeat_age_s=5.0, learned=NO_WORDS
    )
    assert diagnosis.category is Category.Unknown
