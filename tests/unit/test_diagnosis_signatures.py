"""Every catalogue signature: compiles, converts to ERE, matches and classifies its examples."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support.builders import diagnosed

from trainmedic.core.errors import ConfigError
from trainmedic.core.taxonomy import Category
from trainmedic.diagnosis import LogSource, Role, diagnose, load_catalogue
from trainmedic.diagnosis.catalogue import parse_catalogue
from trainmedic.diagnosis.ere import python_regex_to_ere

CATALOGUE = load_catalogue()
SIGNATURES = CATALOGUE.signatures
EXAMPLES = [(s, e) for s in SIGNATURES for e in s.examples]


def test_catalogue_is_not_trivial() -> None:
    assert len(SIGNATURES) >= 30
    covered = {s.category for s in SIGNATURES if s.role is not Role.context}
    # Every category has line signatures now (Hang: hang detectors, stack dumps; LossSpike:
    # the fp16 loss scale at its minimum), besides the curves and heartbeats; Unknown a crash
    # whose cause the line does not say (a bare segfault).
    assert covered == set(Category)


@pytest.mark.parametrize("signature", SIGNATURES, ids=lambda s: s.id)
def test_signature_has_examples(signature) -> None:
    assert signature.examples, f"{signature.id} needs at least one example"


@pytest.mark.parametrize(("signature", "example"), EXAMPLES, ids=lambda v: getattr(v, "id", "ex"))
def test_example_matches_and_passes_prefilter(signature, example: str) -> None:
    assert signature.regex.search(example), f"{signature.id} does not match {example!r}"
    assert CATALOGUE.passes_prefilter(example), f"no prefilter anchor for {example!r}"


# What proves a corroborating signature's category, per category.
PROOF = {Category.HostOOM: "[123.4] Out of memory: Killed process 4242 (python)"}


@pytest.mark.parametrize(("signature", "example"), EXAMPLES, ids=lambda v: getattr(v, "id", "ex"))
def test_example_classifies_to_its_category(signature, example: str) -> None:
    diagnosis = diagnose([LogSource.from_text("example.log", example)])
    if signature.corroborates:
        # Alone it proves nothing (a SIGKILL is also scancel or preemption); beside a line
        # that proves its category, it counts.
        assert diagnosis.category is not signature.category
        proven = diagnose(
            [LogSource.from_text("example.log", f"{PROOF[signature.category]}\n{example}\n")]
        )
        assert proven.category is signature.category
        assert any(e.signature == signature.id for e in proven.evidence)
        return
    assert diagnosis.category is signature.category
    assert any(e.signature == signature.id for e in diagnosis.evidence)


def test_ordinary_training_lines_pass_no_anchor() -> None:
    ordinary = [
        "[2026-12-02 14:01:02] iteration 120/400 | lm loss: 2.314E+00 | grad norm: 0.812 | "
        "elapsed time per iteration (ms): 812.3",
        " iteration    11446/  159576 | consumed samples:      1255856 | elapsed time per "
        "iteration (ms): 80367.0 | learning rate: 3.000E-05 | global batch size:   432 | "
        "lm loss: 3.062589E+00 | loss scale: 65536.0 | grad norm: 12952.562 | num zeros: 0.0 | "
        "number of skipped iterations:   0 | number of nan iterations:   0 |",
        "{'loss': 3.5534, 'grad_norm': 1.4142135381698608, 'learning_rate': 2.04e-06, "
        "'epoch': 0.01}",
        "[default0]:  1%|          | 10/1752 [00:29<1:22:01,  2.83s/it]",
        "node001:1234:1234 [0] NCCL INFO Channel 00/02 :    0   1",
    ]
    for line in ordinary:
        assert not CATALOGUE.passes_prefilter(line), line


@pytest.mark.parametrize("signature", SIGNATURES, ids=lambda s: s.id)
def test_ere_translation_is_valid_for_grep(signature) -> None:
    ere = signature.grep_pattern
    assert "(?" not in ere
    grep = shutil.which("grep")
    if grep is None:
        pytest.skip("no grep")
    sample = "\n".join(signature.examples) + "\n"
    result = subprocess.run(
        [grep, "-c", "-E", ere], input=sample, capture_output=True, text=True, check=False
    )
    assert result.returncode in (0, 1), result.stderr
    # The ERE is a superset of the Python regex: every example matches it too.
    assert int(result.stdout.strip() or 0) == len(signature.examples), ere


def test_ere_translation_rules() -> None:
    assert python_regex_to_ere(r"(?P<x>\d+)(?:a|b)") == "([0-9]+)(a|b)"
    assert python_regex_to_ere(r"(?i)ab") == "[Aa][Bb]"
    assert python_regex_to_ere(r"x(?<!y)z(?=q)") == "xz"


def test_bad_catalogue_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="bad regex"):
        parse_catalogue(
            '[prefilter]\nanchors=["x"]\n[[signature]]\nid="a"\ncategory="ECCError"\nregex="("\n'
        )
    with pytest.raises(ConfigError):
        parse_catalogue(
            '[prefilter]\nanchors=["x"]\n[[signature]]\nid="a"\ncategory="Nope"\nregex="x"\n'
        )
    with pytest.raises(ConfigError, match="empty anchor"):
        parse_catalogue(
            '[prefilter]\nanchors=["x",""]\n[[signature]]\nid="a"\ncategory="ECCError"\nregex="x"\n'
        )
    # The packaged tables are read as a site's are: a misspelt field is an error, not ignored.
    with pytest.raises(ConfigError, match=r"signature\[0\]\.witnes=True: not a signature field"):
        parse_catalogue(
            '[prefilter]\nanchors=["x"]\n[[signature]]\nid="a"\ncategory="ECCError"\n'
            'regex="x"\nwitnes=true\n'
        )
    with pytest.raises(ConfigError, match=r"signature\[0\]\.aftermath_of='b': a list"):
        parse_catalogue(
            '[prefilter]\nanchors=["x"]\n[[signature]]\nid="a"\ncategory="ECCError"\n'
            'regex="x"\naftermath_of="b"\n'
        )


def test_regexes_compile_without_catastrophic_backtracking() -> None:
    nasty = "a" * 20_000 + " error " + "(" * 5_000
    for signature in SIGNATURES:
        assert isinstance(signature.regex, re.Pattern)
        signature.regex.search(nasty)  # must return promptly (pytest-timeout guards)


@pytest.mark.parametrize(
    "line",
    [
        "GPU 3: no ECC errors since the last reboot",
        "dcgmi diag: 0 ECC errors, memory test passed",
        "the burn-in ran 12 h without uncorrectable ECC errors",
        "node passed health checks without any ECC errors",
        # a snap's squashfs is always 100 % used; it says nothing of free space
        "/dev/loop3                        56M   56M     0 100% /snap/core18/2812",
        # a warning of a risk, printed at every start on an old kernel: no hang happened
        "Detected kernel version 3.10.0, which is below the recommended minimum of 5.5.0; this "
        "can cause the process to hang. It is recommended to upgrade the kernel to the minimum "
        "version or higher.",
        "NCCL_P2P_DISABLE unset: this may cause the training to hang on some systems",
        # a traceback's source line passing a timeout setting on: no timeout happened
        "    pg = ProcessGroupGloo(prefix_store, rank, world_size, timeout=timeout)",
        "    dist.init_process_group(backend='nccl', timeout=timedelta(minutes=60))",
    ],
)
def test_lines_that_report_health_or_a_risk_name_no_cause(line: str) -> None:
    causes = [s.id for s in SIGNATURES if s.role is not Role.context and s.regex.search(line)]
    assert causes == []


def test_a_cpu_s_illegal_instruction_is_no_cuda_fault() -> None:
    """SIGILL as a shell reports it is the CPU refusing an instruction (a binary built for
    another CPU): nothing says the GPU failed. CUDA's own error 715 is a kernel's."""
    sigill = './webui.sh: line 255:   146 Illegal instruction     (core dumped) "${python_cmd}"'
    assert diagnosed(sigill).category is not Category.CUDAError
    kernel = "RuntimeError: CUDA error: an illegal instruction was encountered"
    assert diagnosed(kernel).category is Category.CUDAError


def test_a_missing_checkpoint_file_is_the_checkpoints_and_a_missing_data_file_the_scripts() -> None:
    saved_away = (
        "FileNotFoundError: [Errno 2] No such file or directory: "
        "'/mnt/nas/run7/tmp-checkpoint-81' -> '/mnt/nas/run7/checkpoint-81'"
    )
    assert diagnosed(saved_away).category is Category.CheckpointError
    no_data = "FileNotFoundError: [Errno 2] No such file or directory: 'data/train-00001.jsonl'"
    assert diagnosed(no_data).category is Category.ScriptError
    # the storage failing under the checkpoint is the storage's
    eio = "OSError: [Errno 5] Input/output error: '/lustre/run7/checkpoint-81/model.pt'"
    assert diagnosed(eio).category is Category.StorageError


def test_a_sanitizer_report_in_a_cuda_library_kernel_is_the_library_s() -> None:
    """compute-sanitizer's first line says an access was invalid; the frame under it says
    whose kernel made it. In the job's own kernel it is the script's indexing; in cuSPARSE's
    it is the CUDA library's, whatever the progress bar the report was printed on."""
    report = "Epoch 01: 375it [04:27,  1.36it/s]========= Invalid __shared__ read of size 4"
    library = "=========     at void cusparse::csr2csc_rows_expansion_kernel<128>(int *)+0x20"
    own = "=========     at write_oob(int *)+0x50 in kernel_oob.cu:7"
    assert diagnosed(report, library).category is Category.CUDAError
    assert diagnosed(report, own).category is Category.ScriptError


def test_gradients_clipped_ten_thousandfold_are_a_loss_spike() -> None:
    """icefall's optimiser clips every step whose gradient norm passes its threshold; only a
    factor of 1e-4 or less (a norm ten thousand times the recent median) is a blow-up."""
    clipped = "WARNING [optim.py:359] Scaling gradients by {}, model_norm_threshold=741.39"
    assert diagnosed(clipped.format("5.275502917356789e-05")).category is Category.LossSpike
    assert diagnosed(clipped.format("0.0")).category is Category.LossSpike
    for ordinary in ("0.5166", "0.0011294195428490639", "2.5e-03"):
        evidence = diagnosed(clipped.format(ordinary)).evidence
        assert all(e.signature != "gradient-clip-collapse" for e in evidence), ordinary


def test_tasks_killed_after_one_aborted_are_srun_s_clean_up_not_a_memory_kill() -> None:
    """srun kills a step's other tasks once one of them dies, by an error exit or by a signal
    of its own: those kills are no OOM killer's. The task that died says why."""
    aborted = (
        "[hipSYCL Error] from hip_queue.cpp:355 @ submit_memset() : hip_queue: "
        "hipMemsetAsync() failed (error code = HIP:1)",
        "srun: error: nid002892: task 39: Aborted (core dumped)",
        "srun: error: nid002892: tasks 0-38,40-63: Killed",
    )
    diagnosis = diagnosed(*aborted)
    assert diagnosis.category is Category.CUDAError
    assert diagnosed(*aborted[1:]).category is not Category.HostOOM
    assert diagnosed(aborted[2]).category is Category.HostOOM  # a lone kill stays a suspicion
