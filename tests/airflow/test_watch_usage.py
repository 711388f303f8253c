"""The watch gives each sample the CPU share the pod reported, and keeps scaling on (issue 13)."""

from __future__ import annotations

from datetime import UTC, datetime

from qosflow.core.cluster import JobStatus, Phase
from qosflow.core.spec import load_job
from qosflow.core.usage import UsageReport
from qosflow_airflow.state import samples_from_rows, samples_to_rows
from qosflow_airflow.watch import Watcher

T0 = 1_800_000_000.0
SPEC = load_job(
    {
        "name": "unit-job",
        "total_steps": 3000,
        "deadline": "PT6M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "dwell_seconds": 10,
        "margin_seconds": 5,
    },
    now=datetime.fromtimestamp(T0, UTC),
)


def status(steps: int, units: int) -> JobStatus:
    return JobStatus("unit-job-s0", "unit-job", 0, Phase.RUNNING, steps, 3000, units, pod_name="p")


def usage(t: float, share: float, cpus: int) -> UsageReport:
    cpu = 2.0 * cpus * share
    return UsageReport(t=t, wall_s=2.0, cpu_s=cpu, wait_s=2.0 * cpus - cpu, cpus=cpus, steps=0)


def test_samples_get_the_reported_share_and_contended_windows_keep_two_cpus() -> None:
    # 60 s at 1 CPU (clean, 8 steps/s), then 60 s at 2 CPUs on a host busy with something else:
    # the job got 55 % of what it asked for and ran slower than on one (7.6 steps/s)
    w = Watcher(spec=SPEC, workflow="unit-job-s0", hold_s=0.0, last_rescale_at=T0 + 62)
    t, steps = T0, 0.0
    for _ in range(31):
        w.observe(status(int(steps), 1), now=t, free_units=1, usage=[usage(t, 0.99, 1)])
        t, steps = t + 2, steps + 16
    for _ in range(31):
        w.observe(status(int(steps), 2), now=t, free_units=0, usage=[usage(t, 0.55, 2)])
        t, steps = t + 2, steps + 15.2
    observed = w.observed()
    assert observed[0].share is None  # no interval before the first sample
    assert {round(s.share or 0, 2) for s in observed[1:31]} == {0.99}
    assert {round(s.share or 0, 2) for s in observed[32:]} == {0.55}
    decision = w.decide(status(int(steps), 2), now=t, free_units=0)
    assert decision.units == 2, decision.reason  # never "knee 1" on a contended window
    assert "knee 1" not in decision.reason
    # the shares travel with the samples (XCom rows, and so the history store)
    assert samples_from_rows(samples_to_rows(observed)) == list(observed)
    assert samples_from_rows([[T0, 5, 1]]) == [observed[0].__class__(T0, 5, 1)]  # old rows
