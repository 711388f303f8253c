"""The seed paper's setting: a CPU cluster running parameter-server-like training jobs.

Xing et al. (IJCNN 2019) evaluated on a small CPU cluster where each training job is a
parameter-server job whose speed depends on the CPU cores it gets. Their exact workload is not
public, so this generator reconstructs the setting in spirit, seeded and with every knob explicit:

* a cluster of ``nodes × cores_per_node`` CPU cores (default 4 × 16);
* a handful of model *families*, each with an Optimus-style synchronous speed curve
  (Peng et al., EuroSys 2018, the PS formula written in the core's step-time form)::

      τ(n) = t0 + t1/n + t3·(n − 1) + t4·[n > cores_per_node]

  where ``t0`` is the per-step PS round trip, ``t1`` the compute of one global batch split over
  ``n`` cores, ``t3`` the PS fan-in contention per extra worker core and ``t4`` the cross-node
  step; allowed sizes are powers of two up to two nodes;
* Poisson arrivals at ``rate_per_hour`` (the load knob), runtimes log-normal at the size the user
  requests (drawn from the sizes below each family's knee), and deadlines
  ``submit + λ × duration`` with ``λ ~ U[lam_min, lam_max]``, as in ElasticFlow's generator.

The output is ordinary :class:`~qosflow.sim.trace.TraceJob` rows and a
:class:`~qosflow.sim.trace.ThroughputTable`, so the simulator, the bound and the CLI treat it exactly
like a trace file (:func:`write_trace` writes it as one).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np

from qosflow.core.errors import SpecError
from qosflow.sim.trace import ThroughputTable, TraceJob, knee_of

BATCH = 256  # every family's global batch size (a row key of the table)


@dataclass(frozen=True, slots=True)
class Family:
    """One model family's step-time parameters (seconds).

    Attributes:
        name: Model name (the table key).
        t0: Fixed per-step overhead (PS round trip, optimiser).
        t1: Compute of one global batch on one core.
        t3: Contention per extra core (PS fan-in).
        t4: Extra step time once the job spans two nodes.
    """

    name: str
    t0: float
    t1: float
    t3: float
    t4: float

    def step_time(self, n: int, node_size: int) -> float:
        """Seconds per step on ``n`` cores."""
        return self.t0 + self.t1 / n + self.t3 * (n - 1) + (self.t4 if n > node_size else 0.0)

    def throughput(self, n: int, node_size: int) -> float:
        """Steps per second on ``n`` cores."""
        return 1.0 / self.step_time(n, node_size)


# Five families spanning "scales to a node" (cnn) to "stops scaling at 4 cores" (rnn), in the
# spirit of the CPU/PS workloads Optimus and the seed paper trained (ResNet/CIFAR, LSTM LM,
# Wide&Deep, Inception, a small Seq2Seq). Values are per-step seconds; only the shapes matter.
FAMILIES: tuple[Family, ...] = (
    Family("cnn-small", 0.02, 1.6, 0.002, 0.10),
    Family("cnn-large", 0.05, 6.0, 0.006, 0.20),
    Family("rnn-lm", 0.08, 1.2, 0.012, 0.30),
    Family("wide-deep", 0.03, 0.9, 0.004, 0.05),
    Family("seq2seq", 0.06, 3.0, 0.010, 0.25),
)


@dataclass(frozen=True, slots=True)
class SeedWorkload:
    """Knobs of the seed-paper generator.

    Attributes:
        jobs: Number of jobs.
        rate_per_hour: Mean arrivals per hour (Poisson); the load knob.
        nodes: CPU nodes.
        cores_per_node: Cores per node.
        lam_min: Smallest deadline factor λ (deadline = submit + λ × duration).
        lam_max: Largest deadline factor.
        median_minutes: Median runtime at the requested size.
        sigma: Log-normal spread of runtimes.
        best_effort_fraction: Share of jobs without a deadline.
        feasible_only: Redraw λ until the job could finish alone on the cluster (so "100 %" is
            reachable when resources suffice).
        latency_s: Decision latency a feasible job must leave room for on top of 5 % slack:
            a slotted scheduler sees an arrival at the next slot boundary and then pays a start
            overhead, so a deadline closer than that to the fastest run cannot be met by any
            scheduler (the default covers two 60 s slots).
    """

    jobs: int = 120
    rate_per_hour: float = 6.0
    nodes: int = 4
    cores_per_node: int = 16
    lam_min: float = 0.5
    lam_max: float = 1.5
    median_minutes: float = 40.0
    sigma: float = 0.8
    best_effort_fraction: float = 0.0
    feasible_only: bool = True
    latency_s: float = 120.0

    @property
    def capacity(self) -> int:
        """Total cores."""
        return self.nodes * self.cores_per_node

    def levels(self) -> tuple[int, ...]:
        """Allowed core counts: powers of two up to two nodes (and the cluster)."""
        top = min(2 * self.cores_per_node, self.capacity)
        return tuple(2**i for i in range(int(math.log2(top)) + 1))


def _check(w: SeedWorkload) -> None:
    rules = (
        ("jobs", w.jobs >= 1, "must be >= 1"),
        ("rate_per_hour", w.rate_per_hour > 0, "must be > 0"),
        ("nodes", w.nodes >= 1, "must be >= 1"),
        ("cores_per_node", w.cores_per_node >= 1, "must be >= 1"),
        ("lam_min", 0 < w.lam_min <= w.lam_max, "must satisfy 0 < lam_min <= lam_max"),
        ("median_minutes", w.median_minutes > 0, "must be > 0"),
        ("latency_s", w.latency_s >= 0, "must be >= 0"),
        ("best_effort_fraction", 0 <= w.best_effort_fraction <= 1, "must lie in [0, 1]"),
    )
    for name, ok, rule in rules:
        if not ok:
            raise SpecError(name, rule)


Knob = int | float | bool
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_knobs(text: str, *, flag: str = "--trace") -> tuple[SeedWorkload, dict[str, Knob]]:
    """Parse ``key=value,...`` (``jobs=120,rate_per_hour=48``) into a checked workload.

    Args:
        text: The knobs, comma-separated; empty for the defaults.
        flag: The command-line flag they came from, for messages.

    Returns:
        The workload, and the knobs given (for a label).

    Raises:
        SpecError: Naming ``flag``, the knob and the rule: an unknown knob, a missing value, a
            value that is not an integer / finite number / boolean, or one out of range.
    """
    types = {f.name: str(f.type) for f in dataclasses.fields(SeedWorkload)}
    knobs: dict[str, Knob] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition("="))
        if key not in types:
            raise SpecError(flag, f"unknown seed workload knob {key!r} ({sorted(types)})")
        if not sep or not value:
            raise SpecError(flag, f"seed workload knob {key}: needs a value ({key}=...)")
        knobs[key] = _knob(flag, key, types[key], value)
    workload = SeedWorkload(**knobs)  # type: ignore[arg-type]
    try:
        _check(workload)
    except SpecError as exc:
        raise SpecError(flag, f"seed workload knob {exc.field}: {exc.rule}") from None
    return workload, knobs


def _knob(flag: str, key: str, kind: str, value: str) -> Knob:
    if kind == "bool":
        if value.lower() not in (*_TRUE, *_FALSE):
            raise SpecError(
                flag, f"seed workload knob {key}: must be true or false (got {value!r})"
            )
        return value.lower() in _TRUE
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        noun = "an integer" if kind == "int" else "a finite number"
        raise SpecError(flag, f"seed workload knob {key}: must be {noun} (got {value!r})")
    if kind == "int":
        if not number.is_integer():
            raise SpecError(flag, f"seed workload knob {key}: must be an integer (got {value!r})")
        return int(number)
    return number


def seed_table(w: SeedWorkload) -> ThroughputTable:
    """The throughput table (steps/s by cores) of every family on this cluster."""
    curves = {
        (f.name, BATCH): MappingProxyType(
            {n: f.throughput(n, w.cores_per_node) for n in w.levels()}
        )
        for f in FAMILIES
    }
    return ThroughputTable(gpu_type="CPU", curves=MappingProxyType(curves))


def generate(w: SeedWorkload, rng: np.random.Generator) -> tuple[TraceJob, ...]:
    """Draw a seeded workload.

    Args:
        w: The knobs.
        rng: The random generator (the only source of randomness).

    Returns:
        The jobs in arrival order, ids ``job-0000``, ``job-0001``, ...
    """
    _check(w)
    table = seed_table(w)
    jobs: list[TraceJob] = []
    now = 0.0
    for i in range(w.jobs):
        now += float(rng.exponential(3600.0 / w.rate_per_hour))
        family = FAMILIES[int(rng.integers(len(FAMILIES)))]
        curve = table.curve(family.name, BATCH)
        knee = knee_of(curve)
        requested = int(rng.choice([n for n in curve if n <= min(knee, w.cores_per_node)]))
        duration = float(
            np.clip(rng.lognormal(math.log(w.median_minutes * 60), w.sigma), 600, 12 * 3600)
        )
        iterations = max(1, round(duration * curve[requested]))
        best_effort = bool(rng.random() < w.best_effort_fraction)
        fastest = iterations / curve[knee]
        lam = float(rng.uniform(w.lam_min, w.lam_max))
        least = fastest * 1.05 + w.latency_s
        while w.feasible_only and lam * duration < least:
            lam = float(rng.uniform(w.lam_min, w.lam_max))
            if w.lam_max * duration < least:  # cannot be made feasible: widen
                lam = least / duration
        submit = float(round(now))
        jobs.append(
            TraceJob(
                job_id=f"job-{i:04d}",
                submit=submit,
                deadline=math.inf if best_effort else float(round(submit + lam * duration)),
                iterations=iterations,
                model=family.name,
                batch_size=BATCH,
                num_gpu=requested,
                duration=round(duration),
                best_effort=best_effort,
            )
        )
    return tuple(jobs)


def write_trace(jobs: tuple[TraceJob, ...], path: Path) -> None:
    """Write jobs as a trace CSV in the ElasticFlow format (with ``best_effort``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle, lineterminator="\n")
        out.writerow(
            [
                "job_id",
                "submit_time",
                "iteration",
                "model_name",
                "ddl",
                "batch_size",
                "num_gpu",
                "duration",
                "best_effort",
            ]
        )
        for j in jobs:
            ddl = 0 if j.best_effort else int(j.deadline)
            out.writerow(
                [
                    j.job_id,
                    int(j.submit),
                    j.iterations,
                    j.model,
                    ddl,
                    j.batch_size,
                    j.num_gpu,
                    int(j.duration),
                    int(j.best_effort),
                ]
            )


def write_table(table: ThroughputTable, folder: Path) -> None:
    """Write a throughput table as ``<folder>/<model>.csv`` files (the ElasticFlow layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    by_model: dict[str, list[tuple[int, dict[int, float]]]] = {}
    for (model, batch), curve in sorted(table.curves.items()):
        by_model.setdefault(model, []).append((batch, dict(curve)))
    for model, rows in by_model.items():
        levels = sorted({n for _, curve in rows for n in curve})
        with (folder / f"{model}.csv").open("w", newline="", encoding="utf-8") as handle:
            out = csv.writer(handle, lineterminator="\n")
            out.writerow(["global_batch_size", *levels])
            for batch, curve in rows:
                out.writerow([batch, *(repr(curve[n]) if n in curve else "" for n in levels)])
