"""The word table learnt from the labelled corpus: the fallback when no signature matches."""

from __future__ import annotations

from support.builders import job_info
from support.corpus import dev_rows

from trainmedic.core.taxonomy import Category
from trainmedic.decisions.remediation import DEFAULT_CONFIDENCE_FLOOR, plan_remediation
from trainmedic.diagnosis import LogSource, diagnose
from trainmedic.diagnosis.learned import (
    MAX_CONFIDENCE,
    NO_WORDS,
    TABLE,
    bundled_model,
    corpus_examples,
    train,
    troubled,
)

HEALTHY = [
    f"[2026-12-02 14:0{i // 60}:{i % 60:02d}] iteration {i}/400 | lm loss: {3.0 - i / 200:.3E} | "
    f"grad norm: 0.812 | elapsed time per iteration (ms): 812.3"
    for i in range(1, 120)
]
# Words no signature knows, and a table that learnt them from two (made-up) hang reports.
STALLED = [*HEALTHY[:5], "WARNING: collective made no headway, the workers sit idle"]
TABLE_OF_TWO = train(
    [
        (Category.Hang, "warning: collective made no headway, workers idle for an hour"),
        (Category.Hang, "warning: no headway in the collective, the workers sit idle"),
        (Category.StorageError, "error: lustre client evicted, the mount went read-only"),
    ]
)


def test_the_shipped_table_is_the_one_the_corpus_builds() -> None:
    built = train(corpus_examples(dev_rows())).dumps()
    assert TABLE.read_text(encoding="utf-8") == built, (
        "the word table is stale: run `.venv/bin/python scripts/learn_words.py`"
    )


def test_distinctive_words_decide_and_common_ones_weigh_nothing() -> None:
    model = train(
        [
            (Category.HostOOM, "error: worker killed by the oom reaper, memory cgroup full"),
            (Category.HostOOM, "error: oom reaper took the worker, memory cgroup limit"),
            (Category.Hang, "error: all ranks stuck waiting, watchdog saw no progress"),
            (Category.Hang, "error: ranks stuck, no progress for an hour"),
        ]
    )
    guess = model.guess("fatal error: the oom reaper killed rank 3 (memory cgroup)")
    assert guess is not None and guess.category is Category.HostOOM
    assert "error" not in guess.words  # in every example: no lean
    assert guess.confidence <= MAX_CONFIDENCE
    assert model.guess("error error error") is None  # too few known words


def test_a_healthy_log_leans_nowhere() -> None:
    # Progress lines carry "loss" and "grad norm", words of the NaN and spike reports: only
    # lines that speak of trouble are read.
    model = bundled_model()
    assert model is not None
    assert model.guess("\n".join(HEALTHY)) is None
    sources = [LogSource.from_lines("rank-00000.node000.out", HEALTHY)]
    assert diagnose(sources, heartbeat_age_s=30).category is Category.Unknown


def test_no_signature_the_table_suggests_and_a_human_confirms() -> None:
    sources = [LogSource.from_lines("rank-00000.node000.out", STALLED)]
    # No word and no rule: only that the log ends without a word of an error (a weak hang).
    bare = diagnose(sources, learned=NO_WORDS)
    assert bare.evidence[0].signature == "log-ends-unexplained" and bare.source == "rules"
    suggested = diagnose(sources, learned=TABLE_OF_TWO)
    assert suggested.category is Category.Hang
    assert suggested.source == "learned" and suggested.symptom_only
    assert suggested.confidence <= MAX_CONFIDENCE
    why = suggested.evidence[0]
    assert why.signature == "learned-words" and "'headway'" in why.text
    plan = plan_remediation(suggested, job_info("7", nodes=("node000", "node001")))
    assert plan.page_oncall and not plan.drain and not plan.restart


def test_a_lone_sigkill_stays_below_the_floor() -> None:
    # The corpus's memory kills are mostly "exit code -9" reports: the table leans to HostOOM
    # on them; the rules name the suspicion too, but never above the confidence floor
    # (an operator's kill -9 looks the same).
    lines = [*HEALTHY[:3], "ERROR: process 4242 killed: exits with return code = -9 (SIGKILL)"]
    diagnosis = diagnose([LogSource.from_lines("rank-00000.node000.out", lines)])
    assert diagnosis.category is Category.HostOOM
    assert diagnosis.confidence < DEFAULT_CONFIDENCE_FLOOR
    assert diagnosis.source == "rules"


def test_a_launchers_exit_report_is_not_read_for_words() -> None:
    """ "Rank 0 crashed with exit code 1" says the job failed, not why: with a table whose
    crash reports were all host OOM, the launcher's line alone still suggests nothing."""
    crashes = train(
        [
            (Category.HostOOM, "error: rank crashed with exit code, launcher gave up, oom"),
            (Category.HostOOM, "error: rank crashed with exit code after the oom killer"),
            (Category.Hang, "warning: collective made no headway, workers idle for an hour"),
        ]
    )
    launcher = "ERROR:composer.cli.launcher:Rank 0 crashed with exit code 1."
    alone = diagnose(
        [LogSource.from_lines("launcher.log", [*HEALTHY[:3], launcher])], learned=crashes
    )
    assert alone.category is Category.Unknown
    assert [e.signature for e in alone.evidence] == ["launcher-rank-crashed"]
    stalled = diagnose(
        [LogSource.from_lines("launcher.log", [*STALLED, launcher])], learned=TABLE_OF_TWO
    )
    assert stalled.category is Category.Hang  # the other lines are still read


def test_a_count_of_none_is_no_trouble() -> None:
    """YOLO's dataset scan ("... 0 corrupt") is progress, not a line to read words from."""
    assert troubled("train: Scanning labels.cache... 6430 images, 0 corrupt: 100%") == ""
    assert troubled("val: 12 images, 3 corrupt") != ""


def test_a_text_without_a_categorys_hallmarks_leans_away_from_it() -> None:
    """A bare Python traceback shares its boilerplate with the dataloader-worker reports (all
    of them tracebacks) more than with the script errors (most of them); it lacks the workers'
    "dataloader" and "worker", so it leans to the script errors."""
    frames = "traceback (most recent call last): file train.py, line 9, in lib python"
    model = train(
        [
            *[
                (Category.DataloaderKilled, f"{frames} dataloader worker {i} killed")
                for i in range(3)
            ],
            (Category.ScriptError, f"{frames} keyerror: 'labels'"),
            (Category.ScriptError, f"{frames} valueerror: bad shape for the labels"),
            (Category.ScriptError, f"{frames} indexerror: out of range"),
            (Category.ScriptError, "error: attributeerror: no attribute, the labels"),
            (Category.Hang, "warning: collective made no headway, workers idle for an hour"),
            (Category.Hang, "warning: no headway in the collective, the workers sit idle"),
        ]
    )
    assert "dataloader" in model.hallmarks[Category.DataloaderKilled]
    bare = model.guess(f"{frames} typeerror: unsupported operand type")
    assert bare is not None and bare.category is Category.ScriptError
    worker = model.guess(f"{frames} dataloader worker killed by signal")
    assert worker is not None and worker.category is Category.DataloaderKilled


def test_the_table_never_names_a_gpu_hardware_fault() -> None:
    """Words alone do not make a hardware fault: an NVLink, ECC or bus-loss diagnosis needs its
    own line (an Xid, an ECC count, a link state) that a signature reads. A text whose words
    lean to the hardware examples is read for the best of the other categories."""
    nvidia_smi = "error: nvidia driver systemd service failed, nvidia-smi table gpu fan temp"
    model = train(
        [
            *[(Category.NVLinkError, f"{nvidia_smi} fabric manager {i}") for i in range(4)],
            *[(Category.ECCError, f"{nvidia_smi} volatile {i}") for i in range(3)],
            (Category.ScriptError, "error: keyerror in the service config, systemd failed"),
            (Category.ScriptError, "error: valueerror in the service config file"),
        ]
    )
    guess = model.guess("error: the nvidia driver service failed (systemd), nvidia-smi table")
    assert guess is not None and guess.category is Category.ScriptError


def test_a_guess_names_the_machine_the_logs_came_from() -> None:
    """A rule's node loss is reported by the survivors, so the machine that wrote its lines is
    not named; a guess drains nothing, and the one machine the logs came from is still the
    place a human looks first, whatever category the words lean to."""
    model = train(
        [
            (Category.NodeFailure, "error: the peer machine went away, contact lost for good"),
            (Category.NodeFailure, "error: contact lost, the peer machine went away"),
            (Category.ScriptError, "error: keyerror in the config file"),
        ]
    )
    lines = [
        "Dec  7 00:00:01 gpu017 trainer[4242]: step 10 done",
        "Dec  7 00:00:09 gpu017 trainer[4242]: error: contact lost, the peer machine went away",
    ]
    diagnosis = diagnose([LogSource.from_lines("job.log", lines)], learned=model)
    assert diagnosis.category is Category.NodeFailure and diagnosis.source == "learned"
    assert diagnosis.root_cause_host == "gpu017"
    plan = plan_remediation(diagnosis, job_info(nodes=("gpu017", "gpu018"), gpus_per_node=8))
    assert plan.drain == () and plan.page_oncall
