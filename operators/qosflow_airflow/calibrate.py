"""How fast the trainer steps on this cluster right now: measured as pods of the cluster.

``make demo`` and the multi-tenant example DAG size their jobs from it: the pods go the way the
runs will go (a pod of the cluster, progress through the Argo API), so what they measure is what
a job will get on this host now, with whatever else runs beside it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qosflow.core.pod import PodDefaults
    from qosflow.core.speed import ProgressSample
    from qosflow_airflow.restart import Cluster


def measure_pods(
    cluster: Cluster,
    sizes: Sequence[int],
    *,
    seconds: float,
    defaults: PodDefaults,
    width: int,
    name: str = "measure",
) -> list[list[ProgressSample]]:
    """Run one trainer pod per entry of ``sizes`` (CPUs) side by side; each pod's progress.

    Timing starts once every pod runs and has reported; it ends after ``seconds`` or as soon as
    one pod is no longer running. The pods keep nothing (their checkpoint interval is longer
    than the run; the folder on the connection's checkpoint claim stays empty) and are stopped on
    the way out, whatever happens. ``defaults``: the connection's (image, checkpoint claim).

    Returns:
        Per pod, a sample per progress report (cluster time, steps done, its size).
    """
    from qosflow.core.cluster import Phase, SubmitRequest
    from qosflow.core.pod import PodSettings, with_defaults
    from qosflow.core.speed import ProgressSample

    pod, checkpoint = with_defaults(PodSettings(), None, defaults)
    root = checkpoint.path if checkpoint is not None else ""
    stamp = int(time.time())
    names = []
    try:
        for i, units in enumerate(sizes):
            job = f"{name}-{stamp}-{i}-{units}cpu"
            request = SubmitRequest(
                job=job,
                segment=0,
                units=units,
                unit="cpu",
                total_steps=1_000_000,
                resume=False,
                priority_class="qosflow-normal",
                priority=0,
                image=defaults.image,
                command=("python", "-m", "qosflow_trainer", "--width", str(width)),
                memory_per_unit="1Gi",
                deadline=time.time() + 600,
                checkpoint_dir=f"{root}/{job}",
                checkpoint_every_steps=1_000_000,  # a measurement keeps nothing
                pod=pod,
                checkpoint=checkpoint,
            )
            names.append(cluster.submit(request).name)
        samples: list[list[ProgressSample]] = [[] for _ in names]
        started: float | None = None
        while started is None or time.monotonic() - started < seconds:
            time.sleep(0.5)
            statuses = [cluster.status(n) for n in names]
            if any(st.phase.finished for st in statuses):
                break
            if all(st.steps_done is not None and st.phase is Phase.RUNNING for st in statuses):
                started = started or time.monotonic()
                now = cluster.now()
                for out, st in zip(samples, statuses, strict=True):
                    if not out or out[-1].steps_done != st.steps_done:  # a sample per report
                        out.append(ProgressSample(now, int(st.steps_done or 0), st.units))
    finally:
        for n in names:
            cluster.stop(n, message=f"qosflow {name}: measured")
    return samples


def steady_rate(samples: Sequence[ProgressSample], skip: float = 1 / 3) -> float:
    """Steps per second over a pod's samples, the first ``skip`` share left out (warm-up).

    ``0.0`` when the pod made no progress over what is left.
    """
    warm = samples[int(len(samples) * skip) :]
    if len(warm) < 2 or warm[-1].steps_done <= warm[0].steps_done:
        return 0.0
    return (warm[-1].steps_done - warm[0].steps_done) / (warm[-1].time - warm[0].time)
