import pytest
from support.builders import job_info

from trainmedic.core.models import Diagnosis, Evidence, JobInfo
from trainmedic.core.taxonomy import Action, Category, layer_of, remediation_for
from trainmedic.decisions.attempts import attempts_so_far, exclusions, spec_changes_for
from trainmedic.decisions.remediation import origin_node, plan_remediation
from trainmedic.diagnosis import LogSource, diagnose


def job(job_id: str = "1001", nodes=("node001", "node002", "node003"), prev=None) -> JobInfo:
    return job_info(job_id, nodes=nodes, resubmission_of=prev)


def diagnosis(category: Category, host: str | None = None, *evidence_hosts: str) -> Diagnosis:
    """A diagnosis whose winning evidence sits on ``evidence_hosts`` (default: the node named
    first in ``host``), as the diagnosis engine reports it."""
    hosts = evidence_hosts or ((host.split()[0],) if host and host.startswith("node") else ())
    evidence = tuple(
        Evidence(file=f"{h}.err", line=1, text="x", signature="s", host=h, category=category)
        for h in hosts
    )
    return Diagnosis(
        category=category,
        layer=layer_of(category),
        root_cause_host=host,
        confidence=0.9,
        remediation=remediation_for(category),
        evidence=evidence,
    )


def test_origin_node_from_hostname_or_rank() -> None:
    assert origin_node(diagnosis(Category.ECCError, "node002"), job()) == "node002"
    assert origin_node(diagnosis(Category.ECCError, "node002 GPU 1"), job()) == "node002"
    assert origin_node(diagnosis(Category.NCCLTimeout, "rank 9"), job()) == "node003"
    assert origin_node(diagnosis(Category.ECCError, "node999"), job()) is None
    assert origin_node(diagnosis(Category.ECCError, "GPU 0000:3b:00.0"), job()) is None
    # Several of the job's nodes behind the winning evidence: no single origin, pair-test.
    several = diagnosis(Category.NodeFailure, "node001, node002", "node001", "node002")
    assert origin_node(several, job()) is None
    assert plan_remediation(several, job()).locate
    assert origin_node(diagnosis(Category.ECCError, None), job()) is None


def test_a_rank_whose_node_the_srun_lines_contradict_names_no_node() -> None:
    """A rank's node is guessed from the job's node order; where srun's own line puts that
    task on another node (the batch host was not the first node), the guess would drain a
    healthy node and leave the broken one: no origin, the pair test decides."""
    nodes = ("worker-0", "worker-1")
    placed = diagnosis(Category.CUDAError, "rank 15").model_copy(
        update={
            "evidence": (
                Evidence(
                    file="job.out",
                    line=9,
                    text="srun: error: worker-0: tasks 8,12-15: Exited with exit code 134",
                    signature="srun-task-exited",
                    host="worker-0",
                    category=Category.Unknown,
                ),
            )
        }
    )
    contradicted = job_info(nodes=nodes, gpus_per_node=8)  # rank 15 -> index 1 -> worker-1
    assert origin_node(placed, contradicted) is None
    plan = plan_remediation(placed, contradicted)
    assert plan.drain == () and plan.locate
    # The same line agreeing with the node order leaves the guess standing.
    assert origin_node(placed, job_info(nodes=nodes[::-1], gpus_per_node=8)) == "worker-0"


def test_hardware_fault_with_origin_drains_and_restarts_elsewhere() -> None:
    plan = plan_remediation(diagnosis(Category.GPUFallenOff, "node003"), job())
    assert plan.drain == ("node003",)
    assert plan.exclude == ("node003",)
    assert plan.restart and not plan.locate


def test_fabric_fault_without_origin_asks_for_pair_test() -> None:
    plan = plan_remediation(diagnosis(Category.NCCLTimeout), job())
    assert plan.locate and plan.drain == () and plan.restart


def test_script_error_is_never_retried() -> None:
    plan = plan_remediation(diagnosis(Category.ScriptError), job())
    assert not plan.restart and plan.notify_owner and plan.drain == ()


def test_dataloader_killed_restarts_with_num_workers_zero_and_gc() -> None:
    plan = plan_remediation(diagnosis(Category.DataloaderKilled), job())
    assert plan.restart
    assert plan.spec_changes == {"num_workers": 0, "gc_interval": 50}


def test_retry_budget_pages_instead_of_requeuing() -> None:
    history = [job("1"), job("2", prev="1"), job("3", prev="2"), job("4", prev="3")]
    assert attempts_so_far(history[-1], history) == 3
    plan = plan_remediation(
        diagnosis(Category.GPUFallenOff, "node001"), history[-1], attempts=3, retry_budget=3
    )
    assert not plan.restart and plan.page_oncall
    assert any("budget" in r for r in plan.reasons)


def test_already_drained_job_nodes_are_excluded() -> None:
    plan = plan_remediation(diagnosis(Category.StorageError), job(), drained=["node002", "node9"])
    assert plan.exclude == ("node002",)


def test_exclude_is_drained_now_not_every_node_ever_excluded() -> None:
    """node007 was excluded two attempts ago and has been repaired and restored since; node008
    is still drained. Only node008 (and the node drained now) stay out."""
    earlier = job().model_copy(
        update={"spec": job().spec.model_copy(update={"exclude": ("node007", "node008")})}
    )
    assert exclusions(earlier, drained_now=["node008", "node099"]) == ("node008",)
    plan = plan_remediation(diagnosis(Category.ECCError, "node001"), earlier, drained=["node008"])
    assert plan.exclude == ("node001", "node008")


def test_every_category_has_a_layer_and_remediation() -> None:
    for category in Category:
        assert layer_of(category)
        assert remediation_for(category).summary
    assert remediation_for(Category.ScriptError).action is Action.notify_owner


def test_crash_loop_stops_and_pages_whatever_each_failure_was_diagnosed_as() -> None:
    from trainmedic.decisions.attempts import failure_categories, failure_streak

    history = [job("1"), job("2", prev="1"), job("3", prev="2")]
    # Three misreadings of one fault: three different categories.
    categories = {"1": "ECCError", "2": "NCCLTimeout", "3": "Unknown"}
    streak = failure_streak(history[-1], history)
    assert streak == 3
    seen = failure_categories(history[-1], history, categories)
    assert seen == ["Unknown", "NCCLTimeout", "ECCError"]
    plan = plan_remediation(
        diagnosis(Category.NCCLTimeout),
        history[-1],
        attempts=2,
        retry_budget=10,  # far from spent: the crash loop is what stops it
        failure_streak=streak,
        crash_loop_after=3,
        streak_categories=seen,
    )
    assert not plan.restart and plan.page_oncall
    assert any("crash loop: the last 3 runs" in r and "NCCLTimeout" in r for r in plan.reasons)


def test_an_attempt_that_ended_well_ends_the_streak() -> None:
    from trainmedic.core.models import JobState
    from trainmedic.decisions.attempts import failure_streak

    first = job("1").model_copy(update={"state": JobState.COMPLETED})
    history = [first, job("2", prev="1"), job("3", prev="2")]
    assert failure_streak(history[-1], history) == 2
    assert failure_streak(job("9"), [job("9")]) == 1  # the failure at hand alone


@pytest.mark.parametrize(("source", "said"), [("llm", "LLM"), ("learned", "word table")])
def test_a_suggestion_no_rule_made_waits_for_a_human(source: str, said: str) -> None:
    # GPUFallenOff would drain its origin and restart the job were a rule to say it
    proven = diagnosis(Category.GPUFallenOff, "node001")
    assert plan_remediation(proven, job()).drain == ("node001",)
    suggested = proven.model_copy(update={"source": source})
    plan = plan_remediation(suggested, job())
    assert not plan.restart and not plan.drain and not plan.locate and plan.page_oncall
    assert any(said in r for r in plan.reasons)


XID13 = (
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', "
    "name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction "
    "Parameter"
)
XID48 = (
    "NVRM: Xid (PCI:0000:cb:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
    "bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
)


def test_an_application_xid_goes_to_the_owner_and_never_drains() -> None:
    found = diagnose([LogSource.from_lines("node002-kernel.log", [XID13], host="node002")])
    assert found.category is Category.CUDAError  # the label real reports carry
    plan = plan_remediation(found, job(nodes=("node001", "node002")))
    assert plan.notify_owner and not plan.drain and not plan.locate and not plan.restart
    assert any("application-class GPU fault" in r for r in plan.reasons)


def test_gpu_code_the_install_cannot_load_goes_to_the_owner_and_never_drains() -> None:
    """No kernel image for the GPU's architecture (or a symbol the module lacks) is the job's
    build, and would fail the same on every node: draining the node it landed on would take
    one healthy node out per retry. Hardware evidence beside it still drains."""
    for line in (
        "node002:4411:4502 [2] NCCL WARN Cuda failure 'no kernel image is available for "
        "execution on the device'",
        "node002:50555:50555 [0] NCCL WARN Cuda failure 'named symbol not found'",
    ):
        found = diagnose([LogSource.from_lines("rank-00002.node002.err", [line])])
        assert found.category is Category.CUDAError
        assert found.evidence[0].signature == "gpu-code-unloadable"
        plan = plan_remediation(found, job(nodes=("node001", "node002")))
        assert plan.notify_owner and not plan.drain and not plan.locate and not plan.restart
        assert any("cannot load" in r for r in plan.reasons)

    kernel = LogSource.from_lines("node002-kernel.log", [XID48], host="node002")
    no_image = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    unloadable = LogSource.from_lines("rank-00002.node002.err", [no_image])
    backed = diagnose([unloadable, kernel])
    plan = plan_remediation(backed, job(nodes=("node001", "node002")))
    assert plan.drain == ("node002",) and not plan.notify_owner


def test_hardware_evidence_beside_an_application_xid_wins() -> None:
    found = diagnose([LogSource.from_lines("node002-kernel.log", [XID13, XID48], host="node002")])
    assert found.category is Category.ECCError
    plan = plan_remediation(found, job(nodes=("node001", "node002")))
    assert plan.drain == ("node002",) and not plan.notify_owner


def test_skipped_batches_stay_with_the_attempt_that_needed_them() -> None:
    rolled_back = job().spec.model_copy(
        update={"skip_batches": (121, 130), "num_workers": 0, "gc_interval": 50}
    )
    # Resuming past the skipped batches: they are behind the job, not carried on.
    assert spec_changes_for(rolled_back, 200, {}) == {"skip_batches": None}
    # Resuming before them (an earlier checkpoint): still needed.
    assert spec_changes_for(rolled_back, 100, {}) == {}
    # A new rollback sets its own; lasting fixes (num_workers, GC) are never undone here.
    assert spec_changes_for(rolled_back, 200, {"skip_batches": (301, 310)}) == {
        "skip_batches": (301, 310)
    }
    assert spec_changes_for(job().spec, 0, {"num_workers": 0}) == {"num_workers": 0}


def test_below_the_confidence_floor_nothing_destructive_happens_automatically() -> None:
    from trainmedic.core.settings import Settings
    from trainmedic.decisions.remediation import DEFAULT_CONFIDENCE_FLOOR

    assert Settings().confidence_floor == DEFAULT_CONFIDENCE_FLOOR
    sure = diagnosis(Category.ECCError, "node002")
    assert plan_remediation(sure, job()).drain == ("node002",)
    unsure = sure.model_copy(update={"confidence": 0.3})
    plan = plan_remediation(unsure, job())
    assert plan.drain == () and plan.locate and plan.restart  # the pair test decides
    assert any("below the floor 0.50" in reason for reason in plan.reasons)
    # The floor is the installation's: a stricter one holds back a surer diagnosis too.
    assert plan_remediation(sure, job(), confidence_floor=0.95).drain == ()
    # A rollback discards progress and skips data: below the floor a human confirms first.
    nan = diagnosis(Category.NaNLoss).model_copy(update={"confidence": 0.3})
    plan = plan_remediation(nan, job())
    assert plan.action is Action.investigate and plan.page_oncall and not plan.restart
    assert plan_remediation(nan, job(), confidence_floor=0.2).action is Action.rollback


def test_symptom_only_evidence_never_drains_even_when_it_names_a_node() -> None:
    seen = diagnosis(Category.NCCLTimeout, "node002").model_copy(update={"symptom_only": True})
    plan = plan_remediation(seen, job())
    assert plan.drain == () and plan.locate


def _nccl(host: str, message: str) -> str:
    return f"{host}:4411:4502 [1] misc/socket.cc:538 NCCL WARN {message}"


def test_a_socket_failure_drains_neither_end_and_the_pair_test_decides() -> None:
    """A reset seen by node001 is a witness's line; a peer it names is only the far end of the
    broken connection: its process may have died of its own error. Neither is drained on it."""
    nodes = ("node001", "node002")
    reset = diagnose(
        [
            LogSource.from_lines(
                "rank-00001.node001.err",
                [
                    _nccl(
                        "node001",
                        "Net : Call to recv from 10.0.0.2<36048> failed : Connection reset by peer",
                    )
                ],
            )
        ]
    )
    assert reset.category is Category.NetworkError
    plan = plan_remediation(reset, job(nodes=nodes))
    assert plan.drain == () and plan.locate and plan.restart
    assert reset.root_cause_host == "10.0.0.2"  # where to look, named in the report

    closed = diagnose(
        [
            LogSource.from_lines(
                "rank-00001.node001.err",
                [
                    _nccl(
                        "node001", "socketProgress: Connection closed by remote peer node002<42830>"
                    )
                ],
            )
        ]
    )
    assert closed.root_cause_host == "node002"
    assert [e.host for e in closed.evidence if e.far_end] == ["node002"]
    # The catch-all "NCCL WARN" on the same line does not put it on node001 either.
    assert "node001" not in {e.host for e in closed.evidence}
    plan = plan_remediation(closed, job(nodes=nodes))
    assert plan.drain == () and plan.locate
    assert any("node002 only as the far end" in reason for reason in plan.reasons)


def test_what_only_the_printing_host_can_cause_is_its_own() -> None:
    """No route in its own table, or a "peer" at its own loopback address: node001's set-up."""
    unreachable = diagnose(
        [
            LogSource.from_lines(
                "rank-00001.node001.err",
                [_nccl("node001", "Connect to 10.0.0.2<57335> failed : Network is unreachable")],
            )
        ]
    )
    assert unreachable.category is Category.NetworkError
    assert plan_remediation(unreachable, job(nodes=("node001", "node002"))).drain == ("node001",)

    loopback = diagnose(
        [
            LogSource.from_lines(
                "rank-00001.node001.err",
                [
                    "node001:6682:6688 [0] NCCL INFO ncclOsSocketPollConnect: connect to "
                    f"127.0.0.1<52243> returned Connection refused, retrying ({n}/34) after "
                    f"sleep for {100 * n} msec"
                    for n in (1, 2)
                ],
            )
        ]
    )
    assert loopback.root_cause_host == "node001"
    # Named through the refused connect: still not proof, the pair test looks first.
    assert plan_remediation(loopback, job(nodes=("node001", "node002"))).drain == ()


def test_ranks_that_disagree_on_a_collective_drain_no_node() -> None:
    """NCCL's IB transport saw a peer post another size for the same operation: the ranks
    issued different collectives. The node that noticed is a witness, not a faulty machine,
    and the catch-all NCCL WARN on that line does not bring it back."""
    line = (
        "node001:201805:201927 [0] transport/net_ib.cc:667 NCCL WARN NET/IB : collective "
        "mismatch error local size 32768 remote 1048576 addr 0 rkey 3beac3"
    )
    found = diagnose([LogSource.from_lines("rank-00000.node001.err", [line])])
    assert found.category is Category.NCCLError
    assert "nccl-collective-mismatch" in {e.signature for e in found.evidence}
    assert {e.host for e in found.evidence} == {None}
    plan = plan_remediation(found, job(nodes=("node001", "node002")))
    assert plan.drain == () and plan.locate


def test_a_daemon_open_mpi_lost_is_a_suspect_not_a_proven_node_failure() -> None:
    """mpirun lost its daemon on node002: the node died, or the daemon went down with the
    job's own crash. The report names node002; the pair test (or Slurm's NODE_FAIL) proves it."""
    lines = [
        "ORTE has lost communication with a remote daemon.",
        "",
        "  HNP daemon   : [[27407,0],0] on node node001",
        "  Remote daemon: [[27407,0],1] on node node002",
    ]
    found = diagnose([LogSource.from_lines("mpirun.out", lines)])
    assert found.category is Category.NodeFailure
    assert found.root_cause_host == "node002"
    plan = plan_remediation(found, job(nodes=("node001", "node002")))
    assert plan.drain == () and plan.locate
    assert any("node002 only as the far end" in reason for reason in plan.reasons)


def test_an_agent_that_lost_its_rendezvous_is_a_witness_not_the_lost_node() -> None:
    """torchelastic's agent on node002 could not renew its heartbeat with the rendezvous store
    (hosted on the job's first node). The node the warning names is node002 itself, alive and
    printing: it is not where the job broke, so it is neither named nor drained."""
    lines = [
        "WARNING:torch.distributed.elastic.rendezvous.dynamic_rendezvous:The node "
        "'node002_3427_0' has failed to send a keep-alive heartbeat to the rendezvous 'job' "
        "due to an error of type RendezvousConnectionError.",
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 3494 closing "
        "signal SIGTERM",
    ]
    found = diagnose([LogSource.from_lines("node002.out", lines)])
    assert found.category is Category.NodeFailure
    assert found.root_cause_host is None
    plan = plan_remediation(found, job(nodes=("node001", "node002")))
    assert plan.drain == ()


def test_cuda_failing_at_start_or_a_socket_address_the_job_chose_drains_nothing_alone() -> None:
    """CUDA failing at initialisation (CUDA_VISIBLE_DEVICES changed after the program started)
    and a socket bound to an address the program was given: the job's set-up as often as the
    node's. They name their category, and the plan pair-tests instead of draining node001."""
    for line, category in (
        (
            "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up "
            "environment, e.g. changing env variable CUDA_VISIBLE_DEVICES after program start.",
            Category.CUDAError,
        ),
        ("OSError: [Errno 99] Cannot assign requested address", Category.NetworkError),
    ):
        found = diagnose([LogSource.from_lines("rank-00000.node001.err", [line])])
        assert found.category is category
        plan = plan_remediation(found, job(nodes=("node001", "node002")))
        assert plan.drain == () and plan.locate


def test_an_illegal_memory_access_goes_to_the_owner_unless_hardware_stands_beside_it() -> None:
    """NVIDIA reads a kernel's illegal memory access as the program's own fault: the owner
    hears of it, no node is drained or tested, the job is not retried. An uncorrectable ECC
    error beside it is the hardware's, and drains the node."""
    crash = "[rank3]: RuntimeError: CUDA error: an illegal memory access was encountered"
    found = diagnose([LogSource.from_lines("rank-00003.node002.err", [crash])])
    assert found.category is Category.CUDAError  # the label real reports carry
    plan = plan_remediation(found, job(nodes=("node001", "node002")))
    assert plan.notify_owner and not plan.drain and not plan.locate and not plan.restart
    assert any("application-class GPU fault" in r for r in plan.reasons)

    kernel = LogSource.from_lines("node002-kernel.log", [XID48], host="node002")
    backed = diagnose([LogSource.from_lines("rank-00003.node002.err", [crash]), kernel])
    assert backed.category is Category.ECCError
    assert plan_remediation(backed, job(nodes=("node001", "node002"))).drain == ("node002",)
