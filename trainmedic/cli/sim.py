"""``trainmedic sim ...``: the simulated cluster (hardware faults, jobs)."""

from __future__ import annotations

import argparse

from trainmedic.adapters.scheduler.sim import DATA_FAULTS, JOB_FAULTS
from trainmedic.cli.common import AddCommand, print_json
from trainmedic.core.settings import get_settings


def cmd_sim(args: argparse.Namespace) -> int:
    from trainmedic.adapters.scheduler.sim import SimScheduler
    from trainmedic.core.models import JobSpec
    from trainmedic.sim.cluster import SimCluster

    settings = get_settings()
    cluster = SimCluster(settings.sim_home)
    if args.sim_command == "create":
        # A clean start: the old cluster's jobs, checkpoints, data faults, and this home's
        # diagnosis ledger and intake record (about job ids that start again) are gone.
        SimScheduler(settings.sim_home).reset()
        for record in ("diagnoses.json", "intake.json"):
            (settings.home / record).unlink(missing_ok=True)
        hosts = cluster.create(
            args.nodes,
            gpus_per_node=args.gpus_per_node,
            nodes_per_switch=args.nodes_per_switch,
            inventory_dir=settings.inventory,
        )
        print(
            f"created {args.nodes} simulated nodes, {args.nodes_per_switch} per leaf switch; "
            f"inventory {hosts}"
        )
        return 0
    if args.sim_command == "inject":
        status = cluster.inject(args.node, args.fault, gpu=args.gpu)
        print(f"{status.name}: {status.fault} (GPU {status.gpu})")
        return 0
    if args.sim_command == "fail-switch":
        cut_off = cluster.fail_switch(args.switch)
        print(f"{args.switch}: down; fabric link lost on {', '.join(cut_off)}")
        return 0
    if args.sim_command == "repair":
        repaired = cluster.repair(args.node, reboot=not args.gpu_reset)
        print(f"{repaired.name}: healthy ({'GPU reset' if args.gpu_reset else 'rebooted'})")
        return 0
    scheduler = SimScheduler(settings.sim_home)
    if args.sim_command == "submit":
        job = scheduler.submit(
            JobSpec(
                name=args.name,
                nodes=args.nodes,
                steps=args.steps,
                checkpoint_every=args.checkpoint_every,
            )
        )
        print(job.job_id if not args.json else job.model_dump_json(indent=2))
        return 0
    if args.sim_command == "job-fault":
        scheduler.inject_job_fault(args.job_id, args.kind, batch=args.batch)
        print(f"job {args.job_id}: {args.kind}")
        return 0
    statuses = cluster.statuses()
    nodes = {n.name: n for n in scheduler.nodes()}
    if args.json:
        print_json([{**s.model_dump(), "scheduler": nodes[s.name].model_dump()} for s in statuses])
    else:
        for s in statuses:
            n = nodes[s.name]
            print(f"{s.name}  {s.fault:<9} {n.state:<10} {n.reason}")
    return 0


def register(add: AddCommand) -> None:
    sim = add("sim", cmd_sim, "the simulated cluster (hardware faults, jobs)")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    create = sim_sub.add_parser("create", help="create N healthy nodes and their inventory")
    create.add_argument("--nodes", type=int, default=16)
    create.add_argument("--gpus-per-node", type=int, default=4)
    create.add_argument("--nodes-per-switch", type=int, default=8, help="nodes per rack and leaf")
    inject = sim_sub.add_parser("inject", help="put a node into a fault state")
    inject.add_argument("node")
    inject.add_argument("fault", help="healthy|xid79|ecc|rowremap|nvlink|slow|down|overheat|link")
    fail_switch = sim_sub.add_parser(
        "fail-switch", help="a leaf switch dies: its nodes lose their fabric link"
    )
    fail_switch.add_argument("switch", help="e.g. leaf02 (`sim status` shows each node's)")
    inject.add_argument("--gpu", type=int, default=0)
    repair = sim_sub.add_parser("repair", help="repair a node (back to healthy)")
    repair.add_argument("node")
    repair.add_argument(
        "--gpu-reset",
        action="store_true",
        help="reset its GPUs instead of rebooting: the kernel log keeps the old Xid lines",
    )
    status = sim_sub.add_parser("status", help="nodes with fault and scheduler state")
    status.add_argument("--json", action="store_true")
    submit = sim_sub.add_parser("submit", help="submit a simulated training job")
    submit.add_argument("--name", default="pretrain")
    submit.add_argument("--nodes", type=int, default=4)
    submit.add_argument("--steps", type=int, default=400)
    submit.add_argument("--checkpoint-every", type=int, default=50)
    submit.add_argument("--json", action="store_true")
    fault = sim_sub.add_parser("job-fault", help="make a job hang/crash, or poison a batch")
    fault.add_argument("job_id")
    fault.add_argument("kind", choices=JOB_FAULTS + DATA_FAULTS, help="%(choices)s")
    fault.add_argument("--batch", type=int, help="the data batch a spike/nan poisons")
