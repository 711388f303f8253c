"""Fidelity of our ``elasticflow`` (and ``edf-elastic``) against ElasticFlow's own simulator.

Two sets, both run through the CLI's own path (``qosflow.cli.simulate.run_policy``, so the figures
are what ``qosflow simulate --policies elasticflow`` prints):

* the settings of ``shared/traces/elasticflow/REFERENCE.md`` (``SETTINGS``), with the artifact's
  per-job outcomes in ``tests/sim/fixtures/elasticflow_artifact/`` (its README says how they were
  recorded);
* the fidelity set, ``shared/traces/elasticflow/fidelity/`` (twelve traces with the artifact's
  per-job outcomes).

A job *agrees* when our admission flag (not refused) and our met flag both equal the artifact's.
Run as a script it prints ``key: value`` lines: per reference setting ``ef_ratio_<s>``,
``ef_ref_<s>``, ``ef_diff_<s>``, ``ef_agree_<s>``, ``ef_exact_ratio_<s>`` (``elasticflow-exact``:
the same decisions on the exact engine), ``edf_ratio_<s>``, ...; per fidelity trace
``ef_fid_ratio_<t>``, ``ef_fid_ref_<t>``, ``ef_fid_agree_<t>``, ``ef_fid_exact_ratio_<t>``; over
both sets ``ef_fidelity_jobs_agree`` (share of jobs that agree), ``ef_fidelity_jobs`` and
``ef_fidelity_max_abs_diff`` (largest per-trace ratio difference); and ``ef_cluster01_wall_s`` /
``ef_cluster01_speedup_vs_artifact``. Wall time is measured here, never inside the simulator.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from qosflow.cli.simulate import load_workload, run_policy
from qosflow.sim.metrics import JobOutcome
from qosflow.sim.trace import elasticflow_dir

HERE = Path(__file__).resolve().parent
ARTIFACT_JOBS = HERE.parent / "tests/sim/fixtures/elasticflow_artifact"
MS = "microsoft-elasticflow-traces/data/elasticflow-traces"
# (setting, trace, cluster, GPU type, slot, ElasticFlow reference, EDF reference)
SETTINGS: tuple[tuple[str, str, str, str, int, float, float], ...] = (
    ("generated100", "generated/100jobs_1500lam.csv", "16x8", "A100", 240, 1.00, 0.92),
    ("195job", f"{MS}/195job.csv", "16x8", "A100", 240, 146 / 195, 17 / 195),
    ("cluster10", f"{MS}/cluster10.csv", "32x8", "A100", 60, 250 / 260, 202 / 260),
    (
        "elasticVpollux_e",
        "pkusys-ElasticFlow/ElasticFlow/traces_for_ElasticFlow/elasticVpollux_e.csv",
        "16x4",
        "T4",
        60,
        142 / 195,
        23 / 195,
    ),
    # n64g8 is two switches of 32 nodes (node ids restart per switch, which the placement sees)
    ("cluster01", f"{MS}/cluster01.csv", "n64g8", "A100", 60, 1352 / 1595, 298 / 1595),
)
ARTIFACT_CLUSTER01_WALL_S = 1345.0


@dataclass(frozen=True, slots=True)
class Compared:
    """One trace: our ``elasticflow`` against the artifact, job by job.

    Attributes:
        name: Setting or fidelity trace name.
        ratio: Our ratio (``elasticflow``, the artifact's timekeeping).
        reference: The artifact's ratio.
        agree: Jobs whose admission and met flags both equal the artifact's.
        jobs: Jobs compared.
        rejected: Jobs we refused.
        wall_s: Our wall time.
    """

    name: str
    ratio: float
    reference: float
    agree: int
    jobs: int
    rejected: int
    wall_s: float

    @property
    def diff(self) -> float:
        """Our ratio minus the artifact's."""
        return self.ratio - self.reference


def artifact_flags(path: Path) -> dict[str, tuple[bool, bool]]:
    """The artifact's ``(admitted, met)`` per job id from a ``*_jobs.csv`` file."""
    with path.open(newline="", encoding="utf-8") as handle:
        return {
            r["job_id"]: (r["admitted"] == "1", r["met"] == "1") for r in csv.DictReader(handle)
        }


def agreement(outcomes: tuple[JobOutcome, ...], flags: dict[str, tuple[bool, bool]]) -> int:
    """Deadline jobs whose admission and met flags both equal the artifact's."""
    return sum((not o.rejected, o.met) == flags[o.job_id] for o in outcomes if not o.best_effort)


def compare(
    name: str,
    trace: Path,
    cluster: str,
    gpu: str,
    slot: int,
    artifact: Path,
    published: float | None = None,
) -> Compared:
    """Run ``elasticflow`` on one trace and compare it with the artifact's per-job file.

    Without that file (``published``: the artifact's ratio from REFERENCE.md), only the ratio is
    compared and no job counts towards the agreement.
    """
    w = load_workload(str(trace), cluster, gpu, 1)
    run = run_policy(
        w, "elasticflow", slot=slot, speeds="oracle", seed=1, sigma=0.0, bound=None, timing=True
    )
    if not artifact.is_file() and published is not None:
        rejected = sum(o.rejected for o in run.outcomes)
        return Compared(name, run.metrics.ratio, published, 0, 0, rejected, run.metrics.wall_s)
    flags = artifact_flags(artifact)
    deadline_flags = [
        f for o, f in ((o, flags[o.job_id]) for o in run.outcomes) if not o.best_effort
    ]
    reference = sum(met for _, met in deadline_flags) / max(len(deadline_flags), 1)
    return Compared(
        name,
        run.metrics.ratio,
        reference,
        agreement(run.outcomes, flags),
        len(deadline_flags),
        sum(o.rejected for o in run.outcomes),
        run.metrics.wall_s,
    )


def ratio_of(policy: str, trace: Path, cluster: str, gpu: str, slot: int) -> float:
    """The ratio of another policy (``elasticflow-exact``, ``edf-elastic``) on one trace."""
    w = load_workload(str(trace), cluster, gpu, 1)
    run = run_policy(
        w, policy, slot=slot, speeds="oracle", seed=1, sigma=0.0, bound=None, timing=False
    )
    return run.metrics.ratio


def fidelity_set() -> Iterator[tuple[str, Path, str, int]]:
    """The fidelity traces: (name, trace, cluster ``NxG``, slot), from its ``summary.csv``."""
    root = elasticflow_dir() / "fidelity"
    with (root / "summary.csv").open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            nodes, _, per_node = row["cluster"].removeprefix("n").partition("g")
            yield (
                row["trace"],
                root / "traces" / f"{row['trace']}.csv",
                f"{nodes}x{per_node}",
                int(row["slot"]),
            )


def say(key: str, value: object) -> None:
    """Print one ``key: value`` line, flushed."""
    print(f"{key}: {value}", flush=True)


def reference_settings() -> list[Compared]:
    """Every REFERENCE.md setting: ``elasticflow``, ``elasticflow-exact`` and ``edf-elastic``."""
    out = []
    for s, trace, cluster, gpu, slot, ef_ref, edf_ref in SETTINGS:
        path = elasticflow_dir() / trace
        c = compare(s, path, cluster, gpu, slot, ARTIFACT_JOBS / f"{s}_jobs.csv", ef_ref)
        out.append(c)
        say(f"ef_ratio_{s}", f"{c.ratio:.4f}")
        say(f"ef_ref_{s}", f"{c.reference:.4f}")
        say(f"ef_diff_{s}", f"{c.diff:+.4f}")
        say(f"ef_agree_{s}", f"{c.agree}/{c.jobs}" if c.jobs else "per-job outcomes not recorded")
        say(f"ef_rejected_{s}", c.rejected)
        say(f"ef_wall_s_{s}", f"{c.wall_s:.1f}")
        say(f"ef_exact_ratio_{s}", f"{ratio_of('elasticflow-exact', path, cluster, gpu, slot):.4f}")
        edf = ratio_of("edf-elastic", path, cluster, gpu, slot)
        say(f"edf_ratio_{s}", f"{edf:.4f}")
        say(f"edf_ref_{s}", f"{edf_ref:.4f}")
        say(f"edf_diff_{s}", f"{edf - edf_ref:+.4f}")
        if s == "cluster01":
            say("ef_cluster01_wall_s", f"{c.wall_s:.1f}")
            say("ef_cluster01_speedup_vs_artifact", f"{ARTIFACT_CLUSTER01_WALL_S / c.wall_s:.1f}")
    return out


def fidelity_traces() -> list[Compared]:
    """The twelve traces of the fidelity set: ``elasticflow`` and ``elasticflow-exact``."""
    out = []
    artifact = elasticflow_dir() / "fidelity" / "artifact"
    for t, path, cluster, slot in fidelity_set():
        c = compare(t, path, cluster, "A100", slot, artifact / f"{t}_jobs.csv")
        out.append(c)
        say(f"ef_fid_ratio_{t}", f"{c.ratio:.4f}")
        say(f"ef_fid_ref_{t}", f"{c.reference:.4f}")
        say(f"ef_fid_agree_{t}", f"{c.agree}/{c.jobs}")
        say(
            f"ef_fid_exact_ratio_{t}",
            f"{ratio_of('elasticflow-exact', path, cluster, 'A100', slot):.4f}",
        )
    return out


def main() -> None:
    """Print the fidelity figures as ``key: value`` lines."""
    rows = fidelity_traces() + reference_settings()
    agree, jobs = sum(c.agree for c in rows), sum(c.jobs for c in rows)
    say("ef_fidelity_jobs_agree", f"{agree / jobs:.4f}")
    per_job = sum(1 for c in rows if c.jobs)
    say("ef_fidelity_jobs", f"{agree}/{jobs} in {per_job} traces (the others by ratio only)")
    worst = max(rows, key=lambda c: abs(c.diff))
    say("ef_fidelity_max_abs_diff", f"{abs(worst.diff):.4f}")
    say("ef_fidelity_max_abs_diff_trace", worst.name)


if __name__ == "__main__":
    main()
