"""Core model bench: prediction accuracy and coverage, and the cost of a decision and of admission.

Everything is measured in one run and printed as ``key: value`` lines, each figure followed by its
target and the ratio value / target.

* Accuracy: synthetic progress streams from the ElasticFlow A100 throughput tables (every model and
  batch size, sizes up to the table's knee), lognormal step-time noise sigma = 5 %, a slow warm-up
  after every (re)start and occasional 20 %-slower phases; half the streams start at a smaller size
  and are rescaled after 5 % of the steps. After 10 % of the steps the core fits the speed, and
  predicts the finish at the current size; the error is |predicted - actual| / actual remaining
  time. Coverage is the share of streams finishing by the conservative finish; the conformal
  factor is learnt on one half of the streams and checked on the other half.
* Extrapolation: fitted on one size only, the step time one level up (where the probe rule lets a
  job go next): how often the conservative step time is at least the truth, and the median's bias.
* Cost: fit + belief + decide for one job on its progress at half-way (median of all streams), and
  ``qosflow.core.admission.admit`` of one job against 1,000 and 10,000 guaranteed jobs.

Traces: ``$QOSFLOW_SHARED`` or ``<repo>/../shared``.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from qosflow.core.admission import Candidate, admit
from qosflow.core.decide import JobSnapshot, decide
from qosflow.core.fit import FitResult, fit
from qosflow.core.predict import Calibration, belief_from_fit, calibrate, predict
from qosflow.core.spec import JobSpec, load_job
from qosflow.core.speed import ProgressSample, TableCurve, knee

SHARED = Path(os.environ.get("QOSFLOW_SHARED") or Path(__file__).resolve().parents[2] / "shared")
TABLES = SHARED / "traces/elasticflow/pkusys-ElasticFlow/ElasticFlow/scheduler/throughputs_A100"
NODE = 8
SIGMA = 0.05
SLOW = 1.2
STEPS = 6000
EVERY = 20  # steps between progress samples
SEED = 20261129
NOW = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Curve:
    """One (model, global batch) throughput curve: steps/s by GPUs."""

    name: str
    table: dict[int, float]


def read_tables(folder: Path) -> list[Curve]:
    """Read every ``<model>.csv``: header ``global_batch_size,1,2,...``; empty or 0 = no value."""
    curves = []
    for path in sorted(folder.glob("*.csv")):
        with path.open(newline="") as fh:
            rows = list(csv.reader(fh))
        sizes = [int(h) for h in rows[0][1:]]
        for row in rows[1:]:
            if not row:
                continue
            table = {
                n: float(v) for n, v in zip(sizes, row[1:], strict=False) if v and float(v) > 0
            }
            if len(table) >= 2:
                curves.append(Curve(f"{path.stem}/bs{row[0]}", table))
    return curves


def slow_mask(total: int, rng: np.random.Generator) -> np.ndarray:
    """Occasional 20 %-slower phases: Poisson(2) phases, each 2-8 % of the steps long."""
    mask = np.zeros(total, dtype=bool)
    for _ in range(rng.poisson(2.0)):
        length = int(rng.uniform(0.02, 0.08) * total)
        start = int(rng.integers(0, total - length))
        mask[start : start + length] = True
    return mask


@dataclass(frozen=True)
class Stream:
    """One synthetic job: per-step finish times and the sizes it ran at."""

    curve: Curve
    units: np.ndarray  # size of every step
    finish: np.ndarray  # wall time at which step i+1 completes
    start: float


def make_stream(curve: Curve, plan: list[tuple[int, int]], rng: np.random.Generator) -> Stream:
    """A job running ``plan`` = [(units, steps), ...]; 30 s restart and 3x slow warm-up per part."""
    total = sum(k for _, k in plan)
    slow = slow_mask(total, rng)
    per_step = np.empty(total)
    units = np.empty(total, dtype=np.int64)
    at = 0
    for i, (n, k) in enumerate(plan):
        tau = 1.0 / curve.table[n]
        part = tau * rng.lognormal(0.0, SIGMA, k) * np.where(slow[at : at + k], SLOW, 1.0)
        part[:10] *= 3.0  # warm-up after every (re)start
        if i:
            part[0] += 30.0  # checkpoint-restart
        per_step[at : at + k], units[at : at + k] = part, n
        at += k
    start = NOW.timestamp()
    return Stream(curve, units, start + np.cumsum(per_step), start)


def samples_until(s: Stream, steps: int) -> list[ProgressSample]:
    """Progress samples every ``EVERY`` steps (and at each size change) up to ``steps``."""
    out = [ProgressSample(s.start, 0, int(s.units[0]))]
    for k in range(1, steps + 1):
        changes = k < len(s.units) and s.units[k] != s.units[k - 1]
        if k % EVERY == 0 or changes or k == steps:
            out.append(ProgressSample(float(s.finish[k - 1]), k, int(s.units[k - 1])))
    return out


def build_streams(curves: list[Curve], rng: np.random.Generator) -> list[Stream]:
    """Per curve: every level up to the knee, run straight and after a rescale from below."""
    streams = []
    for c in curves:
        levels = sorted(c.table)
        top = knee(TableCurve(c.table), levels)
        for n in [m for m in levels if m <= top]:
            streams.append(make_stream(c, [(n, STEPS)], rng))
            smaller = [m for m in levels if m < n]
            if smaller:
                first = STEPS // 20
                streams.append(make_stream(c, [(smaller[-1], first), (n, STEPS - first)], rng))
    return streams


@dataclass(frozen=True)
class Outcome:
    """One stream's prediction after 10 % of its steps."""

    error: float
    predicted_remaining: float
    realised_remaining: float
    fit_result: FitResult
    levels: tuple[int, ...]
    now: float
    units: int
    steps_done: int
    total_steps: int
    actual: float


def predict_at_10pct(s: Stream, rng: np.random.Generator) -> Outcome:
    k = len(s.units) // 10
    result = fit(samples_until(s, k), node_size=NODE, rng=rng)
    levels = tuple(sorted(s.curve.table))
    belief = belief_from_fit(result, levels, Calibration())
    now, units, actual = float(s.finish[k - 1]), int(s.units[k - 1]), float(s.finish[-1])
    p = predict(
        belief, now=now, steps_done=k, total_steps=len(s.units), units=units, current_units=units
    )
    realised = actual - now
    return Outcome(
        abs(p.median_finish - actual) / realised,
        p.median_finish - now,
        realised,
        result,
        levels,
        now,
        units,
        k,
        len(s.units),
        actual,
    )


def covered(o: Outcome, cal: Calibration) -> bool:
    """Whether the stream finished by its conservative finish under calibration ``cal``."""
    belief = belief_from_fit(o.fit_result, o.levels, cal)
    p = predict(
        belief,
        now=o.now,
        steps_done=o.steps_done,
        total_steps=o.total_steps,
        units=o.units,
        current_units=o.units,
    )
    return o.actual <= p.conservative_finish


def probe_report(curves: list[Curve], rng: np.random.Generator) -> None:
    """Extrapolation one level up from a single observed size (what the probe rule allows)."""
    covers, errors = [], []
    for c in curves:
        levels = sorted(c.table)
        top = knee(TableCurve(c.table), levels)
        for n, m in itertools.pairwise([k for k in levels if k <= top]):
            s = make_stream(c, [(n, 600)], rng)
            belief = belief_from_fit(
                fit(samples_until(s, 600), node_size=NODE, rng=rng), levels, Calibration()
            )
            truth = 1.0 / c.table[m]
            covers.append(belief.conservative.step_time(m) >= truth)
            errors.append(belief.median.step_time(m) / truth - 1.0)
    print(f"probe_cases: {len(covers)}")
    print(f"probe_conservative_coverage: {float(np.mean(covers)):.4f}")
    print(f"probe_median_signed_error_p50: {float(np.median(errors)):.4f}")


def spec_for(s: Stream) -> JobSpec:
    levels = sorted(s.curve.table)
    duration = float(s.finish[-1] - s.start)
    return load_job(
        {
            "name": "bench",
            "total_steps": len(s.units),
            "deadline": f"PT{max(duration * 1.1, 60):.0f}S",
            "resources": {"unit": "gpu", "min": levels[0], "max": levels[-1], "levels": levels},
            "margin_seconds": 30.0,
        },
        now=NOW,
    )


def decide_ms(streams: list[Stream], rng: np.random.Generator) -> tuple[float, float, float]:
    """Median wall and CPU ms of fit + belief + decide on each job's progress at half-way."""
    times, cpu = [], []
    sizes = []
    for s in streams:
        half = len(s.units) // 2
        samples = samples_until(s, half)
        spec = spec_for(s)
        units = int(s.units[half - 1])
        snap = JobSnapshot(spec, float(s.finish[half - 1]), half, units, False, None)
        levels = spec.resources.levels
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            result = fit(samples, node_size=NODE, rng=rng)
            belief = belief_from_fit(result, levels, Calibration())
            decide(snap, belief, free_units=8)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        sizes.append(len(samples))
    return statistics.median(times) * 1e3, statistics.median(cpu) * 1e3, statistics.median(sizes)


def admission_set(curves: list[Curve], count: int, rng: np.random.Generator) -> list[Candidate]:
    """``count`` guaranteed jobs with deadlines over a week, on ElasticFlow speeds (x 1.15)."""
    now = NOW.timestamp()
    jobs = []
    for i in range(count):
        c = curves[int(rng.integers(len(curves)))]
        levels = sorted(c.table)
        top = knee(TableCurve(c.table), levels)
        levels = [n for n in levels if n <= top]
        taus = tuple(1.15 / c.table[n] for n in levels)
        window = float(rng.uniform(3600.0, 7 * 86400.0))
        # sized to take 30-90 % of its window at its smallest level
        steps = int(rng.uniform(0.3, 0.9) * window / taus[0])
        jobs.append(
            Candidate(
                f"j{i}", now + window, max(steps, 1), 60.0, tuple(levels), taus, guaranteed=True
            )
        )
    return jobs


def sufficient_capacity(jobs: list[Candidate], slack: float) -> int:
    """Units that fit every prefix (by deadline) of ``jobs`` at its smallest level, times ``slack``."""
    now = NOW.timestamp()
    need, peak = 0.0, 0.0
    for c in sorted(jobs, key=lambda c: c.deadline):
        need += c.remaining_steps * c.step_time[0] * c.levels[0]
        peak = max(peak, need / (c.deadline - c.margin - now))
    return max(64, math.ceil(peak * slack))


def admission_ms(
    curves: list[Curve], count: int, reps: int, rng: np.random.Generator, *, slack: float
) -> tuple[float, str, int]:
    """Median ms of admitting one new job next to ``count`` guaranteed ones; verdict; capacity."""
    admitted = admission_set(curves, count, rng)
    new = admission_set(curves, 1, rng)[0]
    new = Candidate("new", new.deadline, new.remaining_steps, 60.0, new.levels, new.step_time)
    capacity = sufficient_capacity([*admitted, new], slack)
    times, cpu = [], []
    kind = ""
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        kind = admit(new, admitted, capacity=capacity, now=NOW.timestamp()).kind
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(
        f"admission_{count}_{'fits' if slack >= 1 else 'overloaded'}_cpu_ms_p50: "
        f"{statistics.median(cpu) * 1e3:.4f}"
    )
    return statistics.median(times) * 1e3, kind, capacity


def admission_report(curves: list[Curve], rng: np.random.Generator) -> None:
    """Admission cost when the new job fits (slack 2x) and when it does not (slack 0.5x)."""
    for count, reps, target in ((1000, 9, 50.0), (10_000, 3, None)):
        ms, kind, cap = admission_ms(curves, count, reps, rng, slack=2.0)
        print(f"admission_{count}_capacity: {cap}")
        print(f"admission_{count}_verdict: {kind}")
        report(f"admission_{count}_ms_p50", ms, target)
        ms, kind, cap = admission_ms(curves, count, reps, rng, slack=0.5)
        print(f"admission_{count}_overloaded_capacity: {cap}")
        print(f"admission_{count}_overloaded_verdict: {kind}")
        report(f"admission_{count}_overloaded_ms_p50", ms, None)


def report(key: str, value: float, target: float | None, *, at_least: bool = False) -> None:
    print(f"{key}: {value:.4f}")
    if target is not None:
        print(f"{key}_target: {target}")
        print(f"{key}_ratio_vs_target: {value / target:.3f}")
        ok = value >= target if at_least else value <= target
        print(f"{key}_meets_target: {str(ok).lower()}")


def main() -> None:
    rng = np.random.default_rng(SEED)
    curves = read_tables(TABLES)
    streams = build_streams(curves, rng)
    outcomes = [predict_at_10pct(s, rng) for s in streams]
    errors = [o.error for o in outcomes]
    calib, check = outcomes[0::2], outcomes[1::2]
    cal = calibrate([(o.predicted_remaining, o.realised_remaining) for o in calib])
    coverage = float(np.mean([covered(o, cal) for o in check]))
    default_cov = float(np.mean([covered(o, Calibration()) for o in outcomes]))
    print(f"load_average_1min: {os.getloadavg()[0]:.2f}")
    print(f"cpus: {os.cpu_count()}")
    print(f"curves: {len(curves)}")
    print(f"streams: {len(streams)}")
    print(f"steps_per_stream: {STEPS}")
    report("prediction_error_p50_after_10pct", float(np.median(errors)), 0.05)
    print(f"prediction_error_p90_after_10pct: {float(np.quantile(errors, 0.9)):.4f}")
    report("conservative_coverage", coverage, 0.90, at_least=True)
    print(f"conformal_factor: {cal.factor:.4f}")
    print(f"conformal_pairs: {cal.n}")
    print(f"conservative_coverage_default_factor: {default_cov:.4f}")
    probe_report(curves, rng)
    ms, cpu_ms, n_samples = decide_ms(streams, rng)
    print(f"decide_samples_per_job: {n_samples:.0f}")
    report("decide_ms_p50", ms, 2.0)
    print(f"decide_cpu_ms_p50: {cpu_ms:.4f}")
    admission_report(curves, rng)


if __name__ == "__main__":
    main()
