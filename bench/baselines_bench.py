"""qosflow against every baseline, side by side in one run (issue 20, items 1-3).

Every figure is measured here, on the shipped allocator (the ``qosflow`` policy is a thin adapter
over :func:`qosflow.core.allocator.allocate`), except ElasticFlow's own simulator's ratios, which
are ``REFERENCE.md``'s (as ``bench/sim_fidelity.py`` carries them) and the fidelity set's
``summary.csv``.

1. The seed paper's CPU setting (4 x 16 cores, 120 jobs, 5 s in-place resize) at 8, 24, 32, 40
   and 48 jobs/h. Per regime: the upper bound, every baseline's ratio (``k8s-default``,
   ``xing19``, ``elasticflow``, ``elasticflow-exact``), qosflow's ratio, its guarantee
   violations, its fraction of the bound and ``seed.<regime>.qosflow_vs_best_baseline``
   (deadlines met by qosflow over the best baseline's), on workload seed 1; and the same summed
   over workload seeds 1-4 (``seed.<regime>.qosflow_vs_best_baseline_seeds_1_4``, with qosflow's
   violations over all four).
2. Every reference setting and every trace of the fidelity set: qosflow (oracle speeds) against
   the best of ``xing19``, ``elasticflow-exact`` and ElasticFlow's own simulator's published
   ratio (``ef-accessctrl``; on the fidelity set also its ``edf``):
   ``<trace>.qosflow_vs_best_baseline`` and which baseline that was.
3. Learned speeds (noise sigma 5 %) against oracle on 195job, cluster10 and elasticVpollux_e
   over noise seeds 1-10: ``<trace>.qosflow_learned_minus_oracle_worst_seed``, the mean, and
   the guarantee violations over all seeds.

``--quick`` skips cluster01 (the largest reference setting) and runs seeds 1-3 only;
``--sections seed,everywhere`` runs those sections only (to refresh a baseline's keys in
``bench/RESULTS.md`` without the learned section's 20 minutes:
``(echo "== bench/baselines_bench.py"; python bench/baselines_bench.py --sections
seed,everywhere) > part.log`` then ``python bench/results.py part.log --merge
bench/RESULTS.md``, which replaces those keys and keeps the learned section's).
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from qosflow.cli.simulate import Workload, bound_jobs, load_workload, run_policy
from qosflow.sim.bound import upper_bound
from qosflow.sim.metrics import RunMetrics
from qosflow.sim.trace import elasticflow_dir

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from sim_fidelity import SETTINGS, fidelity_set, say  # noqa: E402  (a sibling script)

SEED_REGIMES = (
    ("sufficient", 8.0),
    ("insufficient_24", 24.0),
    ("insufficient", 32.0),
    ("insufficient_40", 40.0),
    ("insufficient_heavy", 48.0),
)
"""Seed-paper regimes: name and arrival rate (jobs/h); the bound says which are sufficient."""
SEED_JOBS = 120
SEED_OVERHEAD = "rescale:5"  # in-place CPU resize (DESIGN §4): a few seconds to re-read the quota
SEED_BASELINES = ("k8s-default", "xing19", "elasticflow", "elasticflow-exact")
SEED_WORKLOADS = (1, 2, 3, 4)
"""Workload seeds of the seed paper's generator: the acceptance keys are seed 1's, the
``_seeds_1_4`` keys sum all four (a rule can win on one workload and break promises on another)."""
BASELINES = ("xing19", "elasticflow-exact")
"""Our baselines run beside qosflow on the reference settings and the fidelity set."""
LEARNED = ("195job", "cluster10", "elasticVpollux_e")
SEEDS = tuple(range(1, 11))
LARGE = {"cluster01"}


def metrics_of(
    w: Workload,
    policy: str,
    slot: int,
    *,
    speeds: str = "oracle",
    seed: int = 1,
    sigma: float = 0.0,
    overhead: str = "policy",
    timing: bool = False,
) -> RunMetrics:
    """The metrics of one run (``timing``: with its wall time and CPU per decision)."""
    return run_policy(
        w,
        policy,
        slot=slot,
        speeds=speeds,
        seed=seed,
        sigma=sigma,
        bound=None,
        timing=timing,
        overhead=overhead,
    ).metrics


def met_of(m: RunMetrics) -> tuple[int, int, int]:
    """Deadlines met, deadline jobs and guarantee violations of one run's metrics."""
    return m.met, m.deadline_jobs, m.guarantee_violations


def versus(key: str, ours: int, total: int, best: tuple[str, float]) -> float:
    """Print and return qosflow's count over the best baseline's (on the same jobs)."""
    name, ratio = best
    score = ours / max(ratio * total, 1e-9)
    say(f"{key}.best_baseline", f"{name} ({ratio:.3f})")
    say(f"{key}.qosflow_vs_best_baseline", f"{score:.3f}")
    return score


def seed_workload(rate: float, workload: int) -> Workload:
    """The seed paper's CPU setting at ``rate`` jobs/h, drawn with generator seed ``workload``."""
    return load_workload(f"seed:rate_per_hour={rate},jobs={SEED_JOBS}", "4x16", "A100", workload)


def seed_paper() -> None:
    """Section 1: the seed paper's CPU setting at five arrival rates."""
    for regime, rate in SEED_REGIMES:
        start = time.perf_counter()
        w = seed_workload(rate, SEED_WORKLOADS[0])
        ub = upper_bound(bound_jobs(w), w.shape.total, slot=600.0, time_limit=60.0)
        named = "sufficient" if ub.sufficient else "insufficient"
        say(f"seed.{regime}.rate_per_hour", rate)
        say(f"seed.{regime}.bound_regime", f"{named} (bound {ub.value}/{ub.deadline_jobs})")
        best, got = ("none", 0.0), {}
        for policy in SEED_BASELINES:
            met, total, _ = got[policy] = met_of(metrics_of(w, policy, 60, overhead=SEED_OVERHEAD))
            say(f"seed.{regime}.{policy}_ratio", f"{met / total:.3f}")
            if met / total > best[1]:
                best = (policy, met / total)
        m = metrics_of(w, "qosflow", 60, overhead=SEED_OVERHEAD)
        met, total = m.met, m.deadline_jobs
        say(f"seed.{regime}.qosflow_ratio", f"{met / total:.3f}")
        say(f"seed.{regime}.qosflow_utilisation", f"{m.utilisation:.3f}")
        say(f"seed.{regime}.qosflow_violations", m.guarantee_violations)
        say(f"seed.{regime}.qosflow_fraction_of_bound", f"{met / max(ub.value, 1):.3f}")
        base = max(got["k8s-default"][0], 1)
        say(f"seed.{regime}.qosflow_vs_k8s_default", f"{met / base:.2f}x")
        say(f"seed.{regime}.xing19_vs_k8s_default", f"{got['xing19'][0] / base:.2f}x")
        versus(f"seed.{regime}", met, total, best)
        over_workloads(regime, rate, {p: got[p][0] for p in got} | {"qosflow": met}, m)
        say(f"seed.{regime}.wall_s", f"{time.perf_counter() - start:.0f}")


def over_workloads(regime: str, rate: float, first: dict[str, int], m: RunMetrics) -> None:
    """Seed paper at one rate over every workload seed: deadlines met, summed, and violations.

    ``first`` holds each policy's met count on the first workload seed (run already); the bound is
    not solved for the others (its time limit would dominate the section).
    """
    sums, violations, jobs = dict(first), m.guarantee_violations, m.deadline_jobs
    for workload in SEED_WORKLOADS[1:]:
        w = seed_workload(rate, workload)
        for policy in (*SEED_BASELINES, "qosflow"):
            run = metrics_of(w, policy, 60, overhead=SEED_OVERHEAD)
            sums[policy] += run.met
            if policy == "qosflow":
                violations, jobs = violations + run.guarantee_violations, jobs + run.deadline_jobs
    best = max(SEED_BASELINES, key=lambda p: sums[p])
    seeds = f"seeds_{SEED_WORKLOADS[0]}_{SEED_WORKLOADS[-1]}"
    say(f"seed.{regime}.qosflow_met_{seeds}", f"{sums['qosflow']}/{jobs}")
    say(f"seed.{regime}.best_baseline_{seeds}", f"{best} ({sums[best]})")
    say(
        f"seed.{regime}.qosflow_vs_best_baseline_{seeds}",
        f"{sums['qosflow'] / max(sums[best], 1):.3f}",
    )
    say(f"seed.{regime}.qosflow_violations_{seeds}", violations)


def everywhere(quick: bool) -> None:
    """Section 2: every reference setting and the fidelity set."""
    rows: list[tuple[str, Path, str, str, int, dict[str, float]]] = []
    for key, trace, cluster, gpu, slot, ef_ref, _ in SETTINGS:
        if quick and key in LARGE:
            continue
        ref = {"elasticflow-artifact": ef_ref}  # REFERENCE.md's ratio
        rows.append((key, elasticflow_dir() / trace, cluster, gpu, slot, ref))
    summary = elasticflow_dir() / "fidelity" / "summary.csv"
    with summary.open(newline="", encoding="utf-8") as handle:
        artifact = {r["trace"]: r for r in csv.DictReader(handle)}
    for name, path, cluster, slot in fidelity_set():
        row = artifact[name]
        ref = {
            "elasticflow-artifact": float(row["artifact_ef_ratio"]),
            "edf-artifact": float(row["artifact_edf_ratio"]),
        }
        rows.append((f"fidelity_{name}", path, cluster, "A100", slot, ref))
    worst = ("none", float("inf"))
    for key, path, cluster, gpu, slot, ref in rows:
        w = load_workload(str(path), cluster, gpu, 1)
        met, total, viol = met_of(metrics_of(w, "qosflow", slot))
        ratios = dict(ref)
        for policy in BASELINES:
            ratios[policy] = metrics_of(w, policy, slot).met / total
        best = max(ratios.items(), key=lambda kv: kv[1])
        say(f"{key}.qosflow_ratio", f"{met / total:.3f}")
        say(f"{key}.qosflow_violations", viol)
        score = versus(key, met, total, best)
        if score < worst[1]:
            worst = (key, score)
    say("everywhere.worst_qosflow_vs_best_baseline", f"{worst[1]:.3f} ({worst[0]})")


def learned(quick: bool) -> None:
    """Section 3: learned minus oracle speeds over noise seeds 1-10."""
    seeds = SEEDS[:3] if quick else SEEDS
    for key, trace, cluster, gpu, slot, _, _ in SETTINGS:
        if key not in LEARNED:
            continue
        w = load_workload(str(elasticflow_dir() / trace), cluster, gpu, 1)
        oracle, total, o_viol = met_of(metrics_of(w, "qosflow", slot))
        gaps, viol = [], o_viol
        for seed in seeds:
            m = metrics_of(w, "qosflow", slot, speeds="learned", sigma=0.05, seed=seed)
            met, v = m.met, m.guarantee_violations
            gaps.append((met - oracle) / total)
            viol += v
            say(f"{key}.qosflow_learned_met_seed_{seed}", f"{met}/{total}")
        say(f"{key}.qosflow_oracle_met", f"{oracle}/{total}")
        say(f"{key}.qosflow_learned_seeds", f"{seeds[0]}-{seeds[-1]}")
        say(f"{key}.qosflow_learned_minus_oracle_mean", f"{sum(gaps) / len(gaps):+.3f}")
        say(f"{key}.qosflow_learned_minus_oracle_worst_seed", f"{min(gaps):+.3f}")
        say(f"{key}.qosflow_violations_oracle_and_learned", viol)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip cluster01, seeds 1-3 only")
    parser.add_argument(
        "--sections",
        default="seed,everywhere,learned",
        help="comma-separated sections to run (default all): seed, everywhere, learned",
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    unknown = sections - {"seed", "everywhere", "learned"}
    if unknown:
        parser.error(f"--sections: unknown section(s) {', '.join(sorted(unknown))}")
    start = time.perf_counter()
    if "seed" in sections:
        seed_paper()
    if "everywhere" in sections:
        everywhere(args.quick)
    if "learned" in sections:
        learned(args.quick)
    say("baselines_bench_wall_s", f"{time.perf_counter() - start:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
