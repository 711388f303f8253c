"""Truth: how fast each simulated job really runs, kept apart from what policies believe.

The true speed of a job on ``k`` units is the trace's throughput table (iterations per second,
ElasticFlow's profiles). An optional :class:`Noise` model perturbs each interval between two
decisions: the step time is multiplied by a lognormal factor (median 1, shape ``sigma``) and,
with probability ``slow_prob``, by ``slow_factor`` as well (a slow phase: a noisy neighbour, a
straggler, a throttled link). Noise is drawn from the run's seeded ``numpy.random.Generator`` only,
so a run is reproducible.

Belief is separate: :class:`OracleBelief` shows policies the true table (as ElasticFlow assumes);
:class:`LearnedBelief` shows them only a speed model fitted by the core (``qosflow.core.fit.fit``) on
the progress samples the simulator observed, as :class:`FittedSpeeds`: the fitted model tabulated
on the allowed levels *and* the fit itself, so the simulator's adapter
(:mod:`qosflow.sim.adapter`) builds the same belief from it as the Airflow watch does
(:func:`qosflow.core.predict.belief_from_fit`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from qosflow.core import fit as core_fit
from qosflow.core import speed as core_speed
from qosflow.core.errors import SpecError
from qosflow.core.prior import HISTORY_LIMIT, end_to_end, fit_of, stated_prior, timed
from qosflow.sim.trace import ThroughputTable, TraceJob


@dataclass(frozen=True, slots=True)
class Noise:
    """Noise of the true step time per interval.

    Attributes:
        sigma: Lognormal shape of the step-time factor (0 = no noise).
        slow_prob: Probability that an interval is a slow phase.
        slow_factor: Step-time multiplier during a slow phase (>= 1).
    """

    sigma: float = 0.0
    slow_prob: float = 0.0
    slow_factor: float = 1.0

    def __post_init__(self) -> None:
        """Validate the parameters."""
        if self.sigma < 0 or not 0 <= self.slow_prob <= 1 or self.slow_factor < 1:
            raise SpecError("noise", "need sigma >= 0, 0 <= slow_prob <= 1, slow_factor >= 1")

    @property
    def active(self) -> bool:
        """True when the model perturbs anything."""
        return self.sigma > 0 or (self.slow_prob > 0 and self.slow_factor > 1)

    def factor(self, rng: np.random.Generator) -> float:
        """Draw one speed factor (the inverse of the step-time factor)."""
        if not self.active:
            return 1.0
        step = float(rng.lognormal(0.0, self.sigma)) if self.sigma > 0 else 1.0
        if self.slow_prob > 0 and rng.random() < self.slow_prob:
            step *= self.slow_factor
        return 1.0 / step


@dataclass(frozen=True, slots=True)
class Truth:
    """True speeds of every job of a run.

    Attributes:
        table: The throughput table of the trace's GPU type.
        noise: The noise model.
    """

    table: ThroughputTable
    noise: Noise = field(default_factory=Noise)

    def curve(self, job: TraceJob) -> Mapping[int, float]:
        """True iterations per second by allowed unit count of one job."""
        return self.table.curve(job.model, job.batch_size)

    def speed(self, job: TraceJob, units: int) -> float:
        """True iterations per second at ``units`` (0 when not running or not allowed)."""
        return self.curve(job).get(units, 0.0) if units > 0 else 0.0

    def max_units(self, job: TraceJob) -> int:
        """The generic cap of a job (largest allowed count, <= 64 and <= batch size)."""
        return self.table.generic_cap(job.model, job.batch_size)


class Belief:
    """What policies are told about speeds (the base shows nothing; see the subclasses)."""

    def speeds(
        self, job: TraceJob, samples: Sequence[tuple[float, float, int]]
    ) -> Mapping[int, float]:
        """Believed iterations/s by unit count, given the job's observed (time, done, units)."""
        raise NotImplementedError

    def finished(self, job: TraceJob, samples: Sequence[tuple[float, float, int]]) -> None:
        """A job completed with these progress samples (the base forgets them)."""

    def profiled(self, job: TraceJob, samples: Sequence[tuple[float, float, int]]) -> None:
        """A running job's profile ladder ended with these samples (the base forgets them)."""


class OracleBelief(Belief):
    """Policies see the true tables (ElasticFlow's assumption)."""

    def __init__(self, truth: Truth) -> None:
        """Wrap the truth."""
        self._truth = truth

    def speeds(
        self, job: TraceJob, samples: Sequence[tuple[float, float, int]]
    ) -> Mapping[int, float]:
        """The true table."""
        return self._truth.curve(job)


@dataclass(frozen=True, slots=True, eq=False)
class FittedSpeeds(Mapping[int, float]):
    """Learned speeds: the fitted model tabulated by unit count, with the fit it comes from.

    It reads as the plain ``{units: iterations/s}`` mapping every policy expects (and compares
    equal to one with the same items); the qosflow policy's adapter reads :attr:`fit` to build
    its belief with the core's :func:`qosflow.core.predict.belief_from_fit`, the function the Airflow
    watch uses, instead of re-deriving bounds from the tabulated medians.

    Attributes:
        fit: The core's fit on the observed progress (``success=False``: the prior's shape).
        table: Median iterations/s at each allowed level with a finite step time: the measured
            median where the job or its key's history measured the level, else ``fit.model``'s
            (the median of :func:`qosflow.core.predict.belief_from_fit`).
        known: What the history the fit's prior was fitted on measured (earlier runs of the
            key): those sizes count as observed and anchor the belief (``known`` of
            :func:`qosflow.core.predict.belief_from_fit`).
    """

    fit: core_fit.FitResult
    table: Mapping[int, float]
    known: tuple[core_fit.Measured, ...] = ()

    def __getitem__(self, units: int) -> float:
        """Median iterations/s at ``units``."""
        return self.table[units]

    def __iter__(self) -> Iterator[int]:
        """Unit counts, ascending."""
        return iter(self.table)

    def __len__(self) -> int:
        """Number of tabulated unit counts."""
        return len(self.table)


def request_prior(
    truth: Truth, job: TraceJob, node_size: int
) -> tuple[core_speed.SpeedModel, tuple[core_fit.Measured, ...]]:
    """The speed a user knows before the job ran: the table at ``num_gpu``, the core's prior shape.

    The value measured once at the requested size is the user's ``step_seconds_estimate`` at
    that size, turned into a prior by :func:`qosflow.core.prior.stated_prior` as the Airflow
    plan step turns a spec's estimate into one: the core's pessimistic shape through it, and
    above one node one window measured there. When the table has no value at the request, the
    smallest level's value anchors the shape; a request that is not an allowed size counts as
    nothing measured. A key with history plans on the history's prior instead; the window
    above one node is the key's from then on (:class:`LearnedBelief` keeps it as the plan
    step records it, ``HistoryStore.timings``).

    Returns:
        The prior and what it counts as measured (``known``).
    """
    levels = sorted(truth.curve(job))
    value = truth.speed(job, job.num_gpu)
    rate = value or truth.curve(job)[levels[0]]
    prior, stated = stated_prior(node_size, step_time=1.0 / rate, units=job.num_gpu)
    return prior, stated if value and job.num_gpu in levels else ()


def fitted_speeds(
    samples: Sequence[tuple[float, float, int]],
    *,
    levels: Sequence[int],
    node_size: int,
    prior: core_speed.SpeedModel,
    known: Sequence[core_fit.Measured] = (),
    timings: Sequence[core_fit.Measured] = (),
) -> FittedSpeeds:
    """Fit ``qosflow.core.speed`` on observed ``(time, done, units)`` samples; tabulate on ``levels``.

    The tabulated median is exactly the median :func:`qosflow.core.predict.belief_from_fit` plans on:
    the measured median at the levels this run or the key's history (``known``) measured, or
    the key's users timed (``timings``, newest first, where neither measured:
    :func:`qosflow.core.prior.timed`, as :func:`qosflow.core.planning.belief_for` counts
    them), the fit's model elsewhere, whether or not the fit succeeded (a fit without a steady
    window is the prior's shape).
    """
    progress = [core_speed.ProgressSample(t, int(d), u) for t, d, u in samples]
    result = core_fit.fit(progress, node_size=node_size, prior=prior)
    known = (*known, *timed(timings, known, result.measured))
    return FittedSpeeds(result, _median_table(result, levels, known), tuple(known))


def _median_table(
    fit: core_fit.FitResult, levels: Sequence[int], known: Sequence[core_fit.Measured] = ()
) -> Mapping[int, float]:
    """Median iterations/s on ``levels``: the belief's median (measurements, else the model)."""
    median = core_fit.anchored(fit.model, fit.measured, known)
    rates = {k: 1.0 / t for k in sorted(levels) if 0.0 < (t := median.step_time(k)) < math.inf}
    return MappingProxyType(rates)


class LearnedBelief(Belief):
    """Policies see speeds fitted by the core from the observed progress of each job.

    A job's key is its model and batch size. Every job that completes leaves its progress samples
    in the key's history, as the Airflow finish step records them in the history store; the
    history is read as the store serves it (the newest :data:`HISTORY_LIMIT` samples, runs laid
    end to end: :func:`qosflow.core.prior.end_to_end`) and fitted once per new run
    (:func:`qosflow.core.prior.fit_of`). Until a job has a steady window of its own it is believed
    that fit, as the Airflow plan step plans on the key's history; once it has measured, its own
    fit rules, with the history's model as the prior and what the history measured as ``known``
    (as the Airflow watch does). Before any job of the key has completed, the prior is the job's
    own request: the table value at ``num_gpu`` (what a user could measure once) extrapolated
    with the core's pessimistic prior shape. A request above one node is a timing of the key
    there: the plan step records it (``HistoryStore.timings``) and every later job of the key
    counts it as one window where no run of the key measured (:func:`qosflow.core.prior.timed`).
    """

    def __init__(self, truth: Truth, *, node_size: int) -> None:
        """Wrap the truth (used only for the levels that exist and the single known point)."""
        self._truth = truth
        self._node_size = node_size
        self._cache: dict[str, tuple[int, int, FittedSpeeds]] = {}
        self._version: dict[tuple[str, int], int] = {}
        self._runs: dict[tuple[str, int], list[core_speed.ProgressSample]] = {}
        self._history: dict[tuple[str, int], FittedSpeeds | None] = {}
        self._timings: dict[tuple[str, int], dict[int, core_fit.Measured]] = {}
        self._recorded: dict[str, int] = {}  # samples of a running job in its key's history

    def finished(self, job: TraceJob, samples: Sequence[tuple[float, float, int]]) -> None:
        """Record a completed job's samples in its key's history (the finish step's record).

        Samples recorded already when its profile ladder ended are skipped, as the history
        store skips samples it holds (``HistoryStore.record_samples``).
        """
        self._record(job, samples[self._recorded.pop(job.job_id, 0) :])

    def profiled(self, job: TraceJob, samples: Sequence[tuple[float, float, int]]) -> None:
        """Record a profiler's samples so far in its key's history (the watch's record)."""
        self._record(job, samples[self._recorded.get(job.job_id, 0) :])
        self._recorded[job.job_id] = len(samples)

    def _record(self, job: TraceJob, samples: Sequence[tuple[float, float, int]]) -> None:
        if not samples:
            return
        key = (job.model, job.batch_size)
        runs = self._runs.setdefault(key, [])
        runs.extend(core_speed.ProgressSample(t, int(d), u) for t, d, u in samples)
        del runs[: max(len(runs) - HISTORY_LIMIT, 0)]
        self._history.pop(key, None)
        self._version[key] = self._version.get(key, 0) + 1

    def _key_history(self, job: TraceJob, levels: Sequence[int]) -> FittedSpeeds | None:
        key = (job.model, job.batch_size)
        if key not in self._history:
            runs = end_to_end(self._runs.get(key, ()))
            # staleness counts from the key's newest run (the history changes only when one ends)
            newest = max((r.time for r in runs), default=None)
            fitted = fit_of(runs, self._node_size, now=newest)
            self._history[key] = None
            if fitted is not None:
                self._history[key] = FittedSpeeds(fitted, _median_table(fitted, levels))
        return self._history[key]

    def speeds(
        self, job: TraceJob, samples: Sequence[tuple[float, float, int]]
    ) -> Mapping[int, float]:
        """The core's fit on the samples, tabulated on the allowed levels (:class:`FittedSpeeds`)."""
        key = (job.model, job.batch_size)
        cached = self._cache.get(job.job_id)
        if cached is not None and cached[:2] == (len(samples), self._version.get(key, 0)):
            return cached[2]
        levels = sorted(self._truth.curve(job))
        request, stated = request_prior(self._truth, job, self._node_size)
        self._time(key, stated)  # the plan step records the request's timing for the key
        timings = tuple(self._timings.get(key, {}).values())[::-1]  # newest first
        history = self._key_history(job, levels)
        known: tuple[core_fit.Measured, ...] = ()
        prior = request
        if history is not None:
            prior, known = history.fit.model, tuple(history.fit.measured)
        out = fitted_speeds(
            samples,
            levels=levels,
            node_size=self._node_size,
            prior=prior,
            known=known,
            timings=timings,
        )
        if not out.fit.observed_units and history is not None and not timed(timings, known):
            out = history  # nothing measured yet: what the key's history measured
        self._cache[job.job_id] = (len(samples), self._version.get(key, 0), out)
        return out

    def _time(self, key: tuple[str, int], stated: Sequence[core_fit.Measured]) -> None:
        """Record a job's stated timing for its key (newest per size; ``HistoryStore.timings``)."""
        book = self._timings.setdefault(key, {})
        for m in stated:
            if book.get(m.units) != m:
                book.pop(m.units, None)  # re-inserted: the newest is last
                book[m.units] = m
                self._version[key] = self._version.get(key, 0) + 1
