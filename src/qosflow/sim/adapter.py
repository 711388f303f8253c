"""The simulator's adapter: what the simulator knows of a job, turned into the core's inputs.

The core decides through :func:`qosflow.core.decide.decide` on a :class:`~qosflow.core.spec.JobSpec`, a
:class:`~qosflow.core.predict.Belief` and a :class:`~qosflow.core.decide.JobSnapshot`. The Airflow watch
(``qosflow_airflow.watch.Watcher.decide``, run by the deferrable trigger on every poll) builds
them from a job spec, the observed progress samples and the workflow's status; this module builds
them from a :class:`~qosflow.sim.policy.JobView` (its progress, its believed speeds) and the
policy's state (last rescale, calibration, rescale overhead). Given the same information both
must reach the same decision (``tests/sim/test_parity.py``), so:

* **Belief.** Learned speeds arrive as :class:`~qosflow.sim.truth.FittedSpeeds`, which carry the
  core's fit; :func:`belief_of` turns the fit into a belief with
  :func:`qosflow.core.predict.belief_from_fit` -- what :func:`qosflow.core.planning.belief_for` does for the
  watch: bootstrap-quantile conservative step times times the conformal factor, a linear slow-down
  below the smallest observed size, and the observed sizes the probe rule needs (the job's own and
  those its prior was fitted on, ``FittedSpeeds.known``, as the watch's ``known``). Oracle speeds
  (``calibration is None``) are the true table as both median and conservative; a plain table with
  a calibration (the oracle policy's promise, a hand-made view) is inflated by the factor.
* **Snapshot.** :func:`job_snapshot`: a job holding no units is *queued* and asks for its
  smallest level (the watch's ``PENDING`` workflow at the size it was submitted with); progress is
  whole steps; the last rescale and the rescale overhead are the policy's.

Known difference, outside the adapter: the engine records a progress sample when it applies a
decision, so the fit behind a view lacks the observation of ``now``, which the watch records
before deciding. Fed the same samples, the two adapters agree.
"""

from __future__ import annotations

from qosflow.core.decide import Decision, JobSnapshot, decide
from qosflow.core.predict import Belief, Calibration, belief_from_fit, oracle_belief
from qosflow.core.spec import IfNotGuaranteed, JobSpec, Resources
from qosflow.core.speed import TableCurve
from qosflow.sim.policy import JobView
from qosflow.sim.truth import FittedSpeeds


def job_spec(
    view: JobView,
    *,
    node_size: int,
    margin_s: float,
    dwell_s: float,
    if_not_guaranteed: IfNotGuaranteed = "run_best_effort",
) -> JobSpec:
    """The core's :class:`~qosflow.core.spec.JobSpec` of a simulated job (levels up to its cap)."""
    levels = tuple(n for n in sorted(view.speeds) if n <= view.max_units) or (min(view.speeds),)
    return JobSpec(
        name=view.job_id,
        key=f"{view.model}/{view.batch_size}",
        total_steps=max(int(view.total), 1),
        submitted_at=view.submit,
        deadline=view.deadline,
        resources=Resources("gpu", levels, node_size, "1Gi"),
        checkpoint_every_steps=max(int(view.total) // 100, 1),
        best_effort=view.best_effort,
        if_not_guaranteed=if_not_guaranteed,
        margin_seconds=margin_s,
        dwell_seconds=dwell_s,
        image="sim",
        command=("sim",),
    )


def belief_of(view: JobView, levels: tuple[int, ...], calibration: Calibration | None) -> Belief:
    """The belief a policy plans on (see the module docstring).

    Args:
        view: The job; its ``speeds`` are a true table or :class:`FittedSpeeds`.
        levels: The spec's levels.
        calibration: ``None``: trust the speeds as they are (oracle). Otherwise the conformal
            calibration: learned speeds go through :func:`qosflow.core.predict.belief_from_fit` (the
            watch's construction); a plain table is divided by the factor.
    """
    speeds = view.speeds
    if calibration is not None and isinstance(speeds, FittedSpeeds):
        return belief_from_fit(speeds.fit, levels, calibration, known=speeds.known)
    curve = TableCurve(speeds)
    base = oracle_belief(curve, levels)
    if calibration is None:
        return base
    factor = max(calibration.factor, 1.0)
    slower = TableCurve({n: x / factor for n, x in speeds.items()})
    return Belief(curve, slower, base.levels, base.knee, base.observed, base.settled)


def job_snapshot(
    view: JobView,
    spec: JobSpec,
    *,
    now: float,
    last_rescale_at: float | None,
    rescale_overhead_s: float,
) -> JobSnapshot:
    """The core's :class:`~qosflow.core.decide.JobSnapshot` of a simulated job at ``now``.

    A job holding no units is queued and asks for the spec's smallest level (its start pays the
    restart the core's predictions charge, :func:`~qosflow.core.predict.restart_charge`).
    """
    queued = view.units == 0
    return JobSnapshot(
        spec=spec,
        now=float(now),
        steps_done=int(view.done),
        units=spec.resources.levels[0] if queued else view.units,
        queued=queued,
        last_rescale_at=last_rescale_at,
        rescale_overhead_s=rescale_overhead_s,
    )


def decision(
    view: JobView,
    *,
    node_size: int,
    margin_s: float,
    dwell_s: float,
    calibration: Calibration | None,
    now: float,
    last_rescale_at: float | None,
    rescale_overhead_s: float,
    free_units: int,
) -> Decision:
    """The core's decision on a simulated job (spec, belief and snapshot built as above).

    Args:
        view: The job as the simulator shows it.
        node_size: Units per node.
        margin_s: The spec's absolute margin (the policy passes ``max(margin, slot + overhead)``).
        dwell_s: The spec's dwell time.
        calibration: ``None`` for oracle speeds, else the conformal calibration.
        now: Current time.
        last_rescale_at: When the policy last changed the job's size (``None``: never).
        rescale_overhead_s: Rescale cost the core's predictions assume.
        free_units: Units free for this job beyond what it holds.
    """
    spec = job_spec(view, node_size=node_size, margin_s=margin_s, dwell_s=dwell_s)
    belief = belief_of(view, spec.resources.levels, calibration)
    snap = job_snapshot(
        view,
        spec,
        now=now,
        last_rescale_at=last_rescale_at,
        rescale_overhead_s=rescale_overhead_s,
    )
    return decide(snap, belief, free_units=free_units)


__all__ = ["belief_of", "decision", "job_snapshot", "job_spec"]
