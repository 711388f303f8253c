"""Reading workflows, pods and nodes — pure functions over server-shaped JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from qosflow.core.cluster import Phase, ResizeState
from qosflow_argo.capacity import free_capacity
from qosflow_argo.workflow_status import job_status, parse_progress, phase_of, pod_for, resize_state


def wf(
    phase: str | None = "Running",
    *,
    shutdown: str | None = None,
    nodes: Any = None,
    steps: str = "100",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "arguments": {
            "parameters": [{"name": "steps", "value": steps}, {"name": "units", "value": "1"}]
        },
        "priority": 7,
        "podPriorityClassName": "qosflow-low",
    }
    if shutdown:
        spec["shutdown"] = shutdown
    status: dict[str, Any] = {"startedAt": None, "finishedAt": None}
    if phase is not None:
        status["phase"] = phase
    if nodes is not None:
        status["nodes"] = nodes
    return {
        "metadata": {
            "name": "j-s0",
            "labels": {"qosflow.dev/job": "j", "qosflow.dev/segment": "0"},
        },
        "spec": spec,
        "status": status,
    }


def test_phases() -> None:
    assert phase_of(wf(None)) is Phase.PENDING
    assert phase_of(wf("")) is Phase.PENDING
    assert phase_of(wf("Pending")) is Phase.PENDING
    assert phase_of(wf("Running", shutdown="Stop")) is Phase.RUNNING  # still ending
    assert phase_of(wf("Failed", shutdown="Stop")) is Phase.STOPPED
    assert phase_of(wf("Error", shutdown="Stop")) is Phase.STOPPED
    assert phase_of(wf("Failed", shutdown="Terminate")) is Phase.FAILED
    assert phase_of(wf("Error")) is Phase.FAILED
    assert phase_of(wf("Succeeded")) is Phase.SUCCEEDED


def test_progress_strings() -> None:
    assert parse_progress("37/100") == (37, 100)
    for bad in ("", None, "101/100", "3/0", "-1/5", "a/b", "3 of 5"):
        assert parse_progress(bad) is None


def test_progress_of_the_newest_training_attempt() -> None:
    nodes = {
        "j-s0": {"id": "j-s0", "type": "Retry", "phase": "Running", "progress": "40/200"},
        "j-s0-1": {
            "id": "j-s0-1",
            "name": "j-s0(0)",
            "type": "Pod",
            "phase": "Failed",
            "progress": "30/100",
            "startedAt": "2026-11-29T10:00:00Z",
        },
        "j-s0-2": {
            "id": "j-s0-2",
            "name": "j-s0(1)",
            "type": "Pod",
            "phase": "Running",
            "progress": "40/100",
            "startedAt": "2026-11-29T10:05:00Z",
        },
    }
    st = job_status(wf(nodes=nodes))
    assert (st.steps_done, st.total_steps) == (40, 100)
    assert st.started_at == datetime(2026, 11, 29, 10, 5, tzinfo=UTC).timestamp()
    assert (st.priority, st.priority_class, st.job, st.segment) == (7, "qosflow-low", "j", 0)


def test_a_multi_pod_segments_progress_is_the_pod_torchrun_made_rank_0() -> None:
    """The rendezvous, not Argo's numbering, decides which pod holds rank 0 (and reports)."""

    def pod(name: str, progress: str, phase: str = "Running") -> dict[str, Any]:
        return {
            "id": name,
            "displayName": name,
            "type": "Pod",
            "phase": phase,
            "progress": progress,
            "templateName": "rendezvous" if name == "rendezvous" else "worker-cpu",
            "startedAt": "2026-11-29T10:00:00Z",
        }

    nodes = {
        "r": pod("rendezvous", "0/1"),
        "w0": pod("worker(0:0)", "0/1"),
        "w1": pod("worker(1:1)", "771/1000"),
    }
    st = job_status(wf(nodes=nodes, steps="1000"))
    assert (st.steps_done, st.total_steps) == (771, 1000)
    # a failed attempt's higher count never hides the running attempt's
    nodes["w1"] = pod("worker(1:1)", "900/1000", phase="Failed")
    nodes["w2"] = pod("worker(1:1)(1)", "800/1000")
    assert job_status(wf(nodes=nodes, steps="1000")).steps_done == 800


def test_a_segment_whose_workers_cannot_all_start_says_which_wait_and_why() -> None:
    def worker(i: int, phase: str, message: str = "") -> dict[str, Any]:
        name = f"worker({i}:{i})"
        node = {"id": name, "displayName": name, "type": "Pod", "phase": phase}
        return {**node, "templateName": "worker-cpu", "message": message}

    why = "Unschedulable: 0/2 nodes are available: 2 Insufficient cpu."
    nodes = {"a": worker(0, "Running"), "b": worker(1, "Pending", why)}
    st = job_status(wf(nodes=nodes))
    assert st.message == f"1 of 2 worker pods have not started: {why}"
    nodes["b"] = worker(1, "Running")
    assert job_status(wf(nodes=nodes)).message == ""


def test_running_workflow_with_a_pending_pod_is_queued() -> None:
    nodes = {
        "n": {
            "id": "n",
            "type": "Pod",
            "phase": "Pending",
            "progress": "0/1",
            "startedAt": "2026-11-29T10:05:00Z",
            "message": "Unschedulable: 0/1 nodes are available: 1 Insufficient cpu.",
        }
    }
    st = job_status(wf(nodes=nodes))
    assert st.phase is Phase.PENDING and st.started_at is None
    assert "Insufficient cpu" in st.message


def test_automatic_zero_of_one_is_not_a_report() -> None:
    nodes = {"n": {"id": "n", "type": "Pod", "phase": "Running", "progress": "0/1"}}
    st = job_status(wf(nodes=nodes))
    assert st.steps_done is None and st.total_steps == 100


def pod(
    spec_cpu: str,
    actual_cpu: str,
    conditions: list[dict[str, str]] | None = None,
    gen: int = 2,
    observed: int = 2,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "j-s0-train-cpu-1",
            "generation": gen,
            "creationTimestamp": "t",
            "labels": {"workflows.argoproj.io/workflow": "j-s0"},
            "annotations": {"workflows.argoproj.io/node-id": "n"},
        },
        "spec": {
            "nodeName": "node-a",
            "containers": [
                {"name": "wait", "resources": {"requests": {"cpu": "10m"}}},
                {
                    "name": "main",
                    "resources": {"requests": {"cpu": spec_cpu}, "limits": {"cpu": spec_cpu}},
                },
            ],
        },
        "status": {
            "phase": "Running",
            "observedGeneration": observed,
            "conditions": conditions or [],
            "containerStatuses": [
                {
                    "name": "main",
                    "resources": {"requests": {"cpu": actual_cpu}, "limits": {"cpu": actual_cpu}},
                }
            ],
        },
    }


def test_resize_states_follow_the_pod_conditions() -> None:
    assert resize_state(pod("2", "2"), 2)[0] is ResizeState.DONE
    assert resize_state(pod("2", "1"), 2)[0] is ResizeState.IN_PROGRESS
    assert resize_state(pod("2", "1", gen=3, observed=2), 2)[0] is ResizeState.IN_PROGRESS
    deferred = [
        {
            "type": "PodResizePending",
            "status": "True",
            "reason": "Deferred",
            "message": "Node didn't have enough capacity: cpu",
        }
    ]
    assert resize_state(pod("2", "1", deferred), 2) == (
        ResizeState.DEFERRED,
        "Node didn't have enough capacity: cpu",
    )
    infeasible = [{"type": "PodResizePending", "status": "True", "reason": "Infeasible"}]
    assert resize_state(pod("64", "1", infeasible), 64)[0] is ResizeState.INFEASIBLE
    running = [{"type": "PodResizeInProgress", "status": "True"}]
    assert resize_state(pod("2", "2", running), 2)[0] is ResizeState.IN_PROGRESS


def test_units_come_from_the_pod_actual_resources() -> None:
    nodes = {"n": {"id": "n", "type": "Pod", "phase": "Running", "progress": "5/100"}}
    w = wf(nodes=nodes)
    p = pod_for(w, [pod("2", "1500m")])
    assert p is not None
    st = job_status(w, p, ResizeState.IN_PROGRESS)
    assert st.units == 1 and st.pod_name == "j-s0-train-cpu-1"
    assert job_status(w).units == 1  # no pod: the units argument


def test_capacity_is_allocatable_minus_active_requests() -> None:
    nodes = [
        {"metadata": {"name": "node-a"}, "status": {"allocatable": {"cpu": "8", "pods": "110"}}},
        {"metadata": {"name": "node-b"}, "status": {"allocatable": {"cpu": "3500m"}}},
        {
            "metadata": {"name": "cordoned"},
            "spec": {"unschedulable": True},
            "status": {"allocatable": {"cpu": "16"}},
        },
    ]
    running = pod("2", "2")
    pending_resize = pod("3", "2")
    pending_resize["status"]["containerStatuses"][0]["allocatedResources"] = {"cpu": "4"}
    done = pod("4", "4")
    done["status"]["phase"] = "Succeeded"
    unscheduled = pod("1", "1")
    del unscheduled["spec"]["nodeName"]
    cap = free_capacity("cpu", nodes, [running, pending_resize, done, unscheduled])
    # node-a: 8 - (2.01 + 4.01) = 1.98 -> 1 ; node-b: 3.5 -> 3
    assert (cap.total, cap.free, dict(cap.free_per_node)) == (11, 4, {"node-a": 1, "node-b": 3})
    assert free_capacity("gpu", nodes, [running]).total == 0
    assert free_capacity("worker", nodes, [running, pending_resize]).free_per_node["node-a"] == 108
