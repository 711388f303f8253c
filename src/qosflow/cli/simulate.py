"""``qosflow simulate`` and ``qosflow bound``: the simulator and the upper bound from the shell.

:mod:`qosflow.cli.sim_commands` registers both on the ``qosflow`` CLI's subparsers and loads this
module (the simulator, scipy) only when one of them runs: :func:`simulate_cmd` and
:func:`bound_cmd`. A trace is a CSV path (either ElasticFlow column variant) or
``seed[:key=value,...]`` for the seed paper's generated CPU workload
(:class:`~qosflow.sim.workload.SeedWorkload` knobs, e.g. ``seed:rate_per_hour=48,jobs=120``).

Wall time and policy CPU time are measured here, around the simulator (which never reads a
clock); ``--no-timing`` blanks them so that equal runs give byte-identical files.

Bad input — a trace row or encoding, a seed knob, an ``--out`` that is a file — is a
:class:`~qosflow.core.errors.SpecError` naming the file, line and column or the flag, which the
CLI prints as one ``error:`` line with exit code 2; ``--out`` is checked before anything runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from qosflow.core.errors import SpecError
from qosflow.core.predict import Calibration
from qosflow.core.words import duration
from qosflow.sim import metrics as m
from qosflow.sim.bound import BoundJob, UpperBound, upper_bound
from qosflow.sim.policy import (
    NoOverhead,
    OverheadModel,
    Placed,
    Policy,
    RescaleOverhead,
    SlotDecision,
    SlotSnapshot,
    StepLatency,
)
from qosflow.sim.report import PolicyRun, write_all
from qosflow.sim.trace import (
    ClusterShape,
    ThroughputTable,
    TraceJob,
    cluster_shape,
    load_throughputs,
    load_trace,
)
from qosflow.sim.workload import generate, parse_knobs, seed_table

# name -> (module under qosflow.sim.policies, factory name)
REGISTRY: dict[str, tuple[str, str]] = {
    "k8s-default": ("k8s_default", "K8sDefault"),
    "edf-elastic": ("edf_elastic", "EdfElastic"),
    "elasticflow": ("elasticflow", "ElasticFlow"),
    "elasticflow-exact": ("elasticflow", "ElasticFlowExact"),
    "xing19": ("xing19", "Xing19Policy"),
    "qosflow": ("qosflow_policy", "QosflowPolicy"),
}
OWN_CALIBRATED = {"xing19", "qosflow"}
TABLE_AWARE = {"elasticflow", "elasticflow-exact"}


@dataclass(frozen=True, slots=True)
class Workload:
    """A loaded trace: jobs, true speeds and the cluster it runs on."""

    jobs: tuple[TraceJob, ...]
    table: ThroughputTable
    shape: ClusterShape
    label: str


def load_workload(trace: str, cluster: str | None, gpu_type: str, seed: int) -> Workload:
    """Load a trace file or generate the seed-paper workload (``seed[:k=v,...]``)."""
    if trace == "seed" or trace.startswith("seed:"):
        w, knobs = parse_knobs(trace.partition(":")[2], flag="--trace")
        shape = (
            ClusterShape.parse(cluster) if cluster else ClusterShape(1, w.nodes, w.cores_per_node)
        )
        w = dataclasses.replace(w, nodes=shape.nodes, cores_per_node=shape.gpus_per_node)
        jobs = generate(w, np.random.default_rng(seed))
        knobs_text = ", ".join(f"{k}={v:g}" for k, v in knobs.items()) or "defaults"
        return Workload(jobs, seed_table(w), shape, f"seed-paper CPU workload ({knobs_text})")
    table = load_throughputs(Path(gpu_type) if Path(gpu_type).is_dir() else gpu_type)
    jobs = load_trace(trace, table)
    shape = cluster_shape(cluster or "16x8")  # an artifact spec name carries its switches
    return Workload(jobs, table, shape, Path(trace).name)


def bound_jobs(w: Workload) -> list[BoundJob]:
    """The bound's view of a workload (generic caps, capacity applied by the bound)."""
    out = []
    for j in w.jobs:
        cap = w.table.generic_cap(j.model, j.batch_size)
        curve = {n: x for n, x in w.table.curve(j.model, j.batch_size).items() if n <= cap}
        out.append(BoundJob(j.job_id, j.submit, j.deadline, float(j.iterations), curve))
    return out


def make_policy(
    name: str,
    *,
    speeds: str,
    table: ThroughputTable,
    slot: int,
    shape: ClusterShape | None = None,
    resize_s: float | None = None,
) -> Policy:
    """Instantiate a policy by name (``shape``: the cluster its overhead model places on).

    ``elasticflow`` and ``elasticflow-exact`` get the trace's table (their per-model caps) and
    the slot (their overhead's restart period); ``elasticflow`` also brings the artifact's
    timekeeping (its ``completion``), ``elasticflow-exact`` runs on the exact engine. Ours
    (``qosflow``, ``xing19``) are charged ElasticFlow's overhead model, the same environment as
    the ``elasticflow`` rows, and ``qosflow`` also the latency of the Airflow steps that ship it
    (:class:`~qosflow.sim.policy.StepLatency`, per size change); with learned speeds they plan
    on conservative speeds (the core's default conformal inflation). ``resize_s``: what a change
    of size costs where the cluster resizes in place (:func:`resize_cost`); ours then plan with
    it, as the Airflow watch does, instead of a checkpoint-restart's.
    """
    if name not in REGISTRY:
        raise SpecError("--policies", f"unknown policy {name!r} (one of {', '.join(REGISTRY)})")
    module, cls = REGISTRY[name]
    factory = getattr(importlib.import_module(f"qosflow.sim.policies.{module}"), cls)
    if name in TABLE_AWARE:
        return factory(table=table, slot=slot)  # type: ignore[no-any-return]
    if name in OWN_CALIBRATED:
        calibration = Calibration() if speeds == "learned" else None
        overhead: OverheadModel = _elasticflow_overhead(slot, shape)
        if name == "qosflow":  # what the shipped Airflow steps add: the latency of a round
            overhead = StepLatency(overhead)
        planned = {} if resize_s is None else {"rescale_overhead_s": resize_s}
        return factory(  # type: ignore[no-any-return]
            calibration=calibration, overhead=overhead, **planned
        )
    return factory()  # type: ignore[no-any-return]


def _elasticflow_overhead(slot: int, shape: ClusterShape | None) -> OverheadModel:
    """ElasticFlow's overhead model placing on the run's nodes and switches.

    Charged to a policy other than ``elasticflow``, nobody tells the model the artifact's release
    order (ended jobs, then by deadline), so on several switches its free-node list is replayed
    with the node sets released in placement order.
    """
    from qosflow.sim.policies.elasticflow import ElasticFlowOverhead

    if shape is None:
        return ElasticFlowOverhead(slot)
    return ElasticFlowOverhead(slot, node_size=shape.gpus_per_node, switches=shape.switches)


def overhead_model(kind: str, slot: int, shape: ClusterShape | None = None) -> OverheadModel | None:
    """The overhead model every policy of a run is charged (``policy``: each its own)."""
    if kind == "policy":
        return None
    if kind == "elasticflow":
        return _elasticflow_overhead(slot, shape)
    if kind == "none":
        return NoOverhead()
    seconds = resize_cost(kind)
    if seconds is not None:
        return RescaleOverhead(int(seconds))
    raise SpecError(
        "--overhead", f"must be policy, elasticflow, none or rescale[:S] (got {kind!r})"
    )


def resize_cost(kind: str) -> float | None:
    """What a change of size costs where the run's overhead is an in-place resize (``rescale:S``).

    The pipeline plans a job's changes of size at what they cost on its cluster (the watch's
    ``rescale_overhead``: 5 s for an in-place CPU resize, 30 s for a checkpoint-restart), so our
    policies plan at ``S`` there. ``None`` for every other kind: each policy's own (a restart).
    The one parse of the kind's seconds (whole seconds, 30 when none are named):
    :func:`overhead_model` charges what this returns.
    """
    if kind.startswith("rescale"):
        return float(int(kind.partition(":")[2] or "30"))
    return None


class _Metered:
    """Wraps a policy and its overhead model to measure CPU time and lost unit-seconds."""

    def __init__(self, inner: Policy, overhead: OverheadModel | None) -> None:
        self.inner = inner
        self.name = inner.name
        self.completion = getattr(inner, "completion", "exact")  # the policy's timekeeping
        self.model = overhead if overhead is not None else inner.overhead
        self.overhead: OverheadModel = self
        self.cpu_s = 0.0
        self.lost_unit_s = 0.0

    def decide(self, snap: SlotSnapshot) -> SlotDecision:
        start = time.process_time()
        out = self.inner.decide(snap)
        self.cpu_s += time.process_time() - start
        return out

    def charge(self, placed: tuple[Placed, ...], *, decision: int, capacity: int) -> dict[str, int]:
        charges = self.model.charge(placed, decision=decision, capacity=capacity)
        units = {p.job_id: p.units for p in placed}
        self.lost_unit_s += sum(s * units.get(j, 0) for j, s in charges.items())
        return charges

    def reset(self) -> None:
        reset = getattr(self.model, "reset", None)
        if callable(reset):
            reset()


def run_policy(
    w: Workload,
    name: str,
    *,
    slot: int,
    speeds: str,
    seed: int,
    sigma: float,
    bound: int | None,
    timing: bool,
    overhead: str = "policy",
) -> PolicyRun:
    """Simulate one policy on a workload and compute its metrics."""
    from qosflow.sim.engine import SimConfig, simulate
    from qosflow.sim.truth import Noise

    model = overhead_model(overhead, slot, w.shape)  # validates the kind first
    resize_s = resize_cost(overhead)
    policy = make_policy(
        name, speeds=speeds, table=w.table, slot=slot, shape=w.shape, resize_s=resize_s
    )
    metered = _Metered(policy, model)
    config = SimConfig(
        capacity=w.shape.total,
        node_size=w.shape.gpus_per_node,
        slot=slot,
        seed=seed,
        speeds="learned" if speeds == "learned" else "oracle",
        noise=Noise(sigma=sigma),
        switches=w.shape.switches,
    )
    start = time.perf_counter()
    result = simulate(w.jobs, w.table, metered, config)
    wall = time.perf_counter() - start
    submits = {j.job_id: j.submit for j in w.jobs}
    outcomes = tuple(
        m.JobOutcome(
            o.job_id,
            submits[o.job_id],
            o.deadline,
            None if o.finish is None else float(o.finish),
            o.rejected,
            o.admitted,
            o.rescales,
            o.unit_seconds,
        )
        for o in result.outcomes
    )
    alloc = sum(o.gpu_seconds for o in outcomes)
    first = min(submits.values())
    usage = m.Usage(
        capacity=w.shape.total,
        span=max(result.end_time - first, 0.0),
        allocated_unit_s=alloc,
        busy_unit_s=max(alloc - metered.lost_unit_s, 0.0),
        decisions=result.decisions,
        policy_cpu_s=metered.cpu_s if timing else 0.0,
    )
    metrics = m.compute(
        name, outcomes, usage, upper_bound=bound, wall_s=wall if timing else math.nan
    )
    if not timing:
        metrics = dataclasses.replace(metrics, cpu_ms_per_decision=math.nan)
    return PolicyRun(metrics, outcomes, result.usage)


def _print_table(console: Console, runs: Sequence[PolicyRun], title: str) -> None:
    table = Table(title=title)
    cols = {
        "policy": "policy",
        "deadline_jobs": "jobs",
        "met": "met",
        "ratio": "ratio",
        "upper_bound": "bound",
        "fraction_of_bound": "of bound",
        "met_guaranteed": "as guar.",
        "met_best_effort": "as b-e",
        "guarantee_violations": "viol.",
        "utilisation": "util.",
        "rescales": "rescales",
        "wall_s": "wall s",
    }
    for key, header in cols.items():
        table.add_column(header, justify="left" if key == "policy" else "right")
    for run in runs:
        row = run.metrics.row()
        table.add_row(*(str(row[c]) for c in cols))
    console.print(table)


def _bound_of(w: Workload, time_limit: float, slot: float | None) -> UpperBound:
    return upper_bound(bound_jobs(w), w.shape.total, slot=slot, time_limit=time_limit)


def output_dir(text: str) -> Path:
    """Check ``--out`` before the simulation runs: a folder, or one that can be created.

    Nothing is created here (a run that fails later leaves no empty folder).

    Raises:
        SpecError: Naming ``--out`` when it is an existing file, lies under a file, or its
            nearest existing folder cannot be written.
    """
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise SpecError("--out", f"{text!r} is an existing file, not a folder")
    nearest = out
    while not nearest.exists():  # exists() is False under a file too: climb to what exists
        nearest = nearest.parent
    if not nearest.is_dir():
        raise SpecError("--out", f"cannot create folder {text!r}: {str(nearest)!r} is a file")
    if not os.access(nearest, os.W_OK | os.X_OK):
        raise SpecError("--out", f"cannot write folder {str(nearest)!r}: permission denied")
    return out


def _write(
    runs: Sequence[PolicyRun], out: Path, w: Workload, ub: UpperBound | None, title: str
) -> list[Path]:
    bound_ratio = ub.value / ub.deadline_jobs if ub and ub.deadline_jobs else None
    try:
        return write_all(runs, out, capacity=w.shape.total, bound_ratio=bound_ratio, title=title)
    except OSError as exc:
        where = exc.filename if exc.filename is not None else out
        raise SpecError("--out", f"cannot write {str(where)!r}: {exc.strerror or exc}") from None


def simulate_cmd(args: argparse.Namespace) -> int:
    """``qosflow simulate``: run policies on a trace, write CSVs and plots, print the table."""
    console = Console(width=max(Console().width, 150))
    out = output_dir(args.out)
    w = load_workload(args.trace, args.cluster, args.gpu_type, args.seed)
    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    for name in names:
        if name not in REGISTRY:
            raise SpecError("--policies", f"unknown policy {name!r} (one of {', '.join(REGISTRY)})")
    ub: UpperBound | None = None
    if not args.no_bound:
        with console.status("computing the upper bound"):
            ub = _bound_of(w, args.bound_time_limit, None if len(w.jobs) > 400 else 1800.0)
    overhead = args.overhead or ("rescale:5" if args.trace.startswith("seed") else "policy")
    overhead_model(overhead, args.slot)  # validate before the first run
    runs = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("simulating", total=len(names))
        for name in names:
            progress.update(task, description=f"simulating {name}")
            runs.append(
                run_policy(
                    w,
                    name,
                    slot=args.slot,
                    speeds=args.speeds,
                    seed=args.seed,
                    sigma=args.noise_sigma,
                    bound=ub.value if ub else None,
                    timing=not args.no_timing,
                    overhead=overhead,
                )
            )
            progress.advance(task)
    slot = duration(args.slot)
    title = f"{w.label} on {w.shape.nodes}x{w.shape.gpus_per_node}, slot {slot}, {args.speeds}"
    files = _write(runs, out, w, ub, title)
    _print_table(console, runs, title)
    if ub is not None:
        console.print(
            f"upper bound {ub.value} of {ub.deadline_jobs} deadline jobs "
            f"({ub.feasible_in_isolation} feasible in isolation; "
            f"{'sufficient' if ub.sufficient else 'insufficient'} resources)"
        )
    console.print("wrote " + ", ".join(str(f) for f in files))
    return 0


def bound_cmd(args: argparse.Namespace) -> int:
    """``qosflow bound``: every upper bound of a trace and their minimum."""
    console = Console(width=max(Console().width, 150))
    w = load_workload(args.trace, args.cluster, args.gpu_type, args.seed)
    slot = None if args.slot <= 0 else float(args.slot)
    with console.status("solving"):
        start = time.perf_counter()
        ub = upper_bound(
            bound_jobs(w), w.shape.total, slot=slot, milp_b=args.milp, time_limit=args.time_limit
        )
        wall = time.perf_counter() - start
    table = Table(title=f"upper bound: {w.label} on {w.shape.total} units")
    for col in ("method", "bound", "raw", "proven", "detail"):
        table.add_column(col)
    for b in ub.bounds:
        table.add_row(
            b.method, str(b.value), f"{b.relaxed:.2f}", "yes" if b.optimal else "dual", b.detail
        )
    console.print(table)
    console.print(f"deadline jobs: {ub.deadline_jobs}")
    console.print(f"feasible in isolation: {ub.feasible_in_isolation}")
    console.print(
        f"upper bound: {ub.value} "
        f"({'sufficient' if ub.sufficient else 'insufficient'} resources; {duration(wall)})"
    )
    return 0
