"""The workflow controller: phases, nodes, pods, progress and shutdown, one tick at a time.

A Workflow goes ``""`` (just created) -> ``Running`` (first tick: its pods are created; they may
stay Pending on the node) -> ``Succeeded`` / ``Failed``. Group ``k + 1`` of a steps/dag workflow
starts when every pod of group ``k`` succeeded. ``spec.shutdown`` (stop / terminate) SIGTERMs the
running pods and fails the queued ones; every node then ends Failed with ``workflow shutdown with
strategy:  Stop`` and the workflow with ``Stopped with strategy 'Stop'``, as upstream. Progress is
read from each pod's progress file into ``status.nodes[].progress`` and summed into
``status.progress`` every tick.

One workflow the controller cannot run never stops the others: whatever goes wrong while syncing
it ends that workflow in ``Error`` with a message (its pods are stopped) and the tick moves on.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from qosflow.local.clock import Clock, parse_rfc3339, rfc3339
from qosflow.local.node import NODE_NAME, Node
from qosflow.local.node_tree import DONE, aggregate, summarise_progress, valid_progress
from qosflow.local.pods import (
    LABEL_COMPLETED,
    LABEL_WORKFLOW,
    build_pod,
    desired_cpu,
    desired_memory,
)
from qosflow.local.retry import attempt, backoff_s, may_retry
from qosflow.local.status import ApiError
from qosflow.local.store import Obj, Store
from qosflow.local.workflow import Plan, PodStep, effective_spec, plan

LABEL_PHASE = "workflows.argoproj.io/phase"
SHUTDOWN_NODE = "workflow shutdown with strategy:  {}"
SHUTDOWN_WORKFLOW = "Stopped with strategy '{}'"
PROGRESS_ANNOTATION = "workflows.argoproj.io/progress"
_LOG = logging.getLogger(__name__)


def pending_reason(pod: Obj) -> str:
    """Why a pod is Pending, as Argo's ``getPendingReason`` reads it.

    A waiting container first (``CreateContainerConfigError: secret "x" not found``), then an
    ``Unschedulable`` condition (``Unschedulable: 0/1 nodes are available: ...``).
    """
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting is not None:
            reason = str(waiting.get("reason") or "")
            return f"{reason}: {waiting['message']}" if waiting.get("message") else reason
    for cond in status.get("conditions") or []:
        if cond.get("reason") == "Unschedulable":
            return f"Unschedulable: {cond['message']}" if cond.get("message") else "Unschedulable"
    return ""


def workflow_finished(wf: Obj) -> bool:
    """Whether a workflow reached a terminal phase."""
    return (wf.get("status") or {}).get("phase") in DONE


class Controller:
    """Runs workflows on the node (callers hold ``store.lock``)."""

    def __init__(self, store: Store, clock: Clock, node: Node) -> None:
        self.store = store
        self.clock = clock
        self.node = node
        self._plans: dict[str, Plan] = {}

    # -- the loop ------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """One reconcile: kubelet poll, workflows, scheduling, workflows again."""
        self.node.poll(now)
        self._sync_all(now)
        self.node.schedule(now)
        self._sync_all(now)

    def settle(self, now: float) -> None:
        """Record pod outcomes in the workflows without starting anything (server shutdown)."""
        self._sync_all(now)

    def _sync_all(self, now: float) -> None:
        """Sync every unfinished workflow; bump its resourceVersion only when it changed."""
        for wf in list(self.store.items("Workflow")):
            if workflow_finished(wf):
                continue
            before = json.dumps(wf, sort_keys=True)
            try:
                self.sync(wf, now)
            except ApiError as exc:  # one broken workflow must not stop the others
                self.fail(wf, exc.message, now)
            except Exception as exc:  # a bug, or a value nobody checked: fail this one only
                meta = wf.get("metadata") or {}
                _LOG.exception(
                    "workflow %s/%s failed in the controller",
                    meta.get("namespace"),
                    meta.get("name"),
                )
                self.fail(wf, f"the local cluster could not run this workflow: {exc!r}", now)
            if json.dumps(wf, sort_keys=True) != before:
                self.store.touch(wf)

    def fail(self, wf: Obj, message: str, now: float) -> None:
        """End a workflow the controller cannot run in ``Error``, stopping its pods; never raises."""
        try:
            for pod in self._pods_of(wf):
                if pod["status"].get("phase") == "Running":
                    self.node.terminate(pod, now)
                elif pod["status"].get("phase") == "Pending":
                    self.node.fail_unstarted(pod, now, message)
            self._complete(wf, "Error", message, now)
        except Exception:  # the workflow is too broken to complete normally: the minimum
            _LOG.exception("could not complete workflow %s", (wf.get("metadata") or {}).get("name"))
            status = wf["status"] if isinstance(wf.get("status"), dict) else {}
            wf["status"] = status
            status.update(phase="Error", message=message, finishedAt=rfc3339(now))
            labels = wf.setdefault("metadata", {}).setdefault("labels", {})
            labels.update({LABEL_PHASE: "Error", LABEL_COMPLETED: "true"})
        self._plans.pop(str((wf.get("metadata") or {}).get("uid")), None)

    def lookup_template(self, namespace: str) -> Any:
        """``name -> WorkflowTemplate`` in one namespace."""
        return lambda name: self.store.get("WorkflowTemplate", namespace, name)

    def plan_of(self, wf: Obj) -> Plan:
        """The cached plan of a started workflow (rebuilt from the stored spec after a restart)."""
        uid = wf["metadata"]["uid"]
        if uid not in self._plans:
            stored = (wf.get("status") or {}).get("storedWorkflowTemplateSpec")
            self._plans[uid] = plan(wf, stored or wf["spec"])
        return self._plans[uid]

    def sync(self, wf: Obj, now: float) -> None:
        """Advance one unfinished workflow."""
        status = wf.setdefault("status", {})
        if not status.get("phase"):
            self._start(wf, now)
            return
        p = self.plan_of(wf)
        nodes: dict[str, Obj] = status.setdefault("nodes", {})
        steps = [s for s in p.steps if s.node_id in nodes]
        pods = [a for s in steps for a in self._attempts(wf, s) if a.node_id in nodes]
        reason = self._shutdown_reason(wf, now)
        for pod in pods:
            self._sync_node(wf, pod, nodes[pod.node_id], now, reason[0] if reason else "")
        if reason is None:
            for step in steps:
                self._update_retry(wf, p, step, now)
            self._advance(wf, p, steps, now)
            return
        active = [a for a in pods if nodes[a.node_id].get("phase") not in DONE]
        self._shut_down(wf, active, reason[0], now)
        if any(nodes[a.node_id].get("phase") not in DONE for a in pods):
            aggregate(wf, p, now)
            return
        for step in steps:
            if nodes[step.node_id].get("phase") not in DONE:
                nodes[step.node_id].update(
                    phase="Failed", message=reason[0], finishedAt=rfc3339(now)
                )
        self._complete(wf, "Failed", reason[1], now)

    def _advance(self, wf: Obj, p: Plan, steps: list[PodStep], now: float) -> None:
        """Start the next group, or finish the workflow, when the current group is done."""
        nodes = wf["status"]["nodes"]
        active = [s for s in steps if nodes[s.node_id].get("phase") not in DONE]
        failed = [s for s in steps if nodes[s.node_id].get("phase") in ("Failed", "Error")]
        if failed and not active:
            first = nodes[failed[0].node_id]
            message = first.get("message", "")
            if p.root_type != "Pod":
                message = f"child '{first['id']}' failed"
            self._complete(wf, "Failed", message, now)
            return
        if not active and not failed:
            group = (max(s.group for s in steps) + 1) if steps else 0
            if group >= len(p.groups):
                self._complete(wf, "Succeeded", "", now)
                return
            for step in p.groups[group]:
                self._start_step(wf, p, step, now)
        aggregate(wf, p, now)

    # -- start / finish ------------------------------------------------------------------------
    def _start(self, wf: Obj, now: float) -> None:
        """First tick of a workflow: resolve and plan it, mark it Running, create group 0."""
        status = wf["status"]
        meta = wf["metadata"]
        try:
            spec = effective_spec(wf, self.lookup_template(meta.get("namespace", "")))
            p = plan(wf, spec)
        except ApiError as exc:
            status.update(phase="Error", startedAt=rfc3339(now), message=exc.message)
            self._complete(wf, "Error", exc.message, now)
            return
        self._plans[meta["uid"]] = p
        if wf["spec"].get("workflowTemplateRef"):
            status["storedWorkflowTemplateSpec"] = spec
        labels = meta.setdefault("labels", {})
        labels.update({LABEL_PHASE: "Running", LABEL_COMPLETED: "false"})
        status.update(phase="Running", startedAt=rfc3339(now), finishedAt=None, progress="0/1")
        status["nodes"] = {}
        status["conditions"] = [{"type": "PodRunning", "status": "False"}]
        self.store.touch(wf)
        self.sync(wf, now)

    def _complete(self, wf: Obj, phase: str, message: str, now: float) -> None:
        """Terminal phase, labels, conditions and resource usage."""
        status = wf["status"]
        nodes = status.get("nodes") or {}
        if phase == "Succeeded":
            for node in nodes.values():
                if node.get("type") == "Pod" and node.get("progress"):
                    total = node["progress"].split("/")[1]
                    node["progress"] = f"{total}/{total}"
        status.update(phase=phase, finishedAt=rfc3339(now))
        if message:
            status["message"] = message
        for node in nodes.values():
            if node.get("phase") not in DONE and node.get("type") != "Pod":
                node.update(phase=phase, finishedAt=rfc3339(now))
        status["conditions"] = [
            {"type": "PodRunning", "status": "False"},
            {"type": "Completed", "status": "True"},
        ]
        status["resourcesDuration"] = self._usage(wf)
        wf["metadata"].setdefault("labels", {}).update(
            {LABEL_PHASE: phase, LABEL_COMPLETED: "true"}
        )
        for pod in self._pods_of(wf):
            pod["metadata"]["labels"][LABEL_COMPLETED] = "true"
            self.store.touch(pod)
        summarise_progress(status)
        self.store.touch(wf)

    def _usage(self, wf: Obj) -> dict[str, int]:
        """``resourcesDuration`` (cpu in core-seconds, memory in 100Mi-seconds), rounded up.

        A pod whose resources cannot be read (the node failed it for that) counts nothing.
        """
        cpu = memory = 0.0
        for pod in self._pods_of(wf):
            start = parse_rfc3339(pod["status"].get("startTime"))
            if start is None:
                continue
            seconds = max(0.0, self.clock.now() - start)
            try:
                pod_cpu, pod_memory = desired_cpu(pod), float(desired_memory(pod))
            except ValueError:
                continue
            cpu += seconds * pod_cpu / 1000
            memory += seconds * pod_memory / (100 * 2**20)
        return {"cpu": math.ceil(cpu), "memory": math.ceil(memory)}

    def _pods_of(self, wf: Obj) -> list[Obj]:
        name = wf["metadata"]["name"]
        ns = wf["metadata"].get("namespace", "")
        return [
            p
            for p in self.store.items("Pod", ns)
            if p["metadata"]["labels"].get(LABEL_WORKFLOW) == name
        ]

    # -- pods and nodes ------------------------------------------------------------------------
    def _start_step(self, wf: Obj, p: Plan, step: PodStep, now: float) -> None:
        """Create the node(s) of a step: its pod node, or a Retry node and attempt 0."""
        nodes = wf["status"]["nodes"]
        if step.retry is None:
            nodes[step.node_id] = self._create_pod(wf, p, step, now)
            return
        name = wf["metadata"]["name"]
        nodes[step.node_id] = {
            "id": step.node_id,
            "name": step.node_name,
            "displayName": step.display_name,
            "type": "Retry",
            "templateName": step.template,
            "templateScope": f"local/{name}",
            "phase": "Running",
            "startedAt": rfc3339(now),
            "finishedAt": None,
            "children": [],
        }
        if step.node_name != name:
            nodes[step.node_id]["boundaryID"] = name
        self._new_attempt(wf, p, step, now)

    def _new_attempt(self, wf: Obj, p: Plan, step: PodStep, now: float) -> None:
        """Start the next attempt of a retried step."""
        nodes = wf["status"]["nodes"]
        parent = nodes[step.node_id]
        first = attempt(step, len(parent["children"]), wf["metadata"]["name"])
        nodes[first.node_id] = self._create_pod(wf, p, first, now)
        parent["children"].append(first.node_id)

    def _attempts(self, wf: Obj, step: PodStep) -> list[PodStep]:
        """The pod steps of a logical step (its attempts when it retries)."""
        if step.retry is None:
            return [step]
        children = wf["status"]["nodes"][step.node_id].get("children") or []
        return [attempt(step, i, wf["metadata"]["name"]) for i in range(len(children))]

    def _create_pod(self, wf: Obj, p: Plan, step: PodStep, now: float) -> Obj:
        """Create the pod of a step (admission included); returns its Argo node."""
        wf_name = wf["metadata"]["name"]
        initial = step.metadata.get("annotations", {}).get(PROGRESS_ANNOTATION, "")
        node: Obj = {
            "id": step.node_id,
            "name": step.node_name,
            "displayName": step.display_name,
            "type": "Pod",
            "templateName": step.template,
            "templateScope": f"local/{wf_name}",
            "phase": "Pending",
            "startedAt": rfc3339(now),
            "finishedAt": None,
            "progress": initial if valid_progress(initial) else "0/1",
        }
        if step.node_name != wf_name:
            node["boundaryID"] = wf_name
        try:
            pod = build_pod(self.store, wf, step, rfc3339(now) or "", self.node.grace_s)
        except ApiError as exc:
            node.update(phase="Error", message=exc.message, finishedAt=rfc3339(now))
            return node
        self.store.put(pod)
        return node

    def _update_retry(self, wf: Obj, p: Plan, step: PodStep, now: float) -> None:
        """Phase of a Retry node from its last attempt; start the next attempt when due."""
        nodes = wf["status"]["nodes"]
        node = nodes[step.node_id]
        if step.retry is None or node.get("phase") in DONE:
            return
        attempts = self._attempts(wf, step)
        last = nodes[attempts[-1].node_id]
        phase = last.get("phase")
        if phase not in DONE:
            node["phase"] = "Running"
            return
        if phase == "Succeeded":
            node.update(phase="Succeeded", finishedAt=rfc3339(now))
            return
        started = parse_rfc3339(node.get("startedAt")) or now
        if not may_retry(step.retry, str(phase), len(attempts), now - started):
            node.update(phase="Failed", message=last.get("message", ""), finishedAt=rfc3339(now))
            return
        finished = parse_rfc3339(last.get("finishedAt")) or now
        wait = backoff_s(step.retry, len(attempts) - 1)
        if now >= finished + wait:
            node.pop("message", None)
            self._new_attempt(wf, p, step, now)
        else:
            node["message"] = f"Backoff for {wait:g} seconds"

    def _sync_node(self, wf: Obj, step: PodStep, node: Obj, now: float, shutdown: str) -> None:
        """Copy the pod's state into its Argo node (a shutdown fails every node that ends)."""
        if node.get("phase") in DONE:
            return
        pod = self.store.get("Pod", wf["metadata"].get("namespace", ""), step.pod)
        if pod is None:
            node.update(phase="Error", message="pod deleted", finishedAt=rfc3339(now))
            return
        pstatus = pod["status"]
        phase = pstatus.get("phase")
        progress = self.node.progress_of(pod)
        if progress is not None:
            node["progress"] = progress
        if phase == "Pending":
            reason = pending_reason(pod)
            if reason:
                node["message"] = reason
            return
        node["hostNodeName"] = NODE_NAME
        node.pop("message", None)
        if phase == "Running":
            node["phase"] = "Running"
            return
        node["finishedAt"] = rfc3339(now)
        if shutdown:
            node.update(phase="Failed", message=shutdown)
            return
        disruption = next(
            (c for c in pstatus.get("conditions") or [] if c["type"] == "DisruptionTarget"), None
        )
        if disruption is not None:  # preempted: upstream sees the pod deleted
            node.update(phase="Failed", message="pod deleted")
            return
        if phase == "Succeeded":
            node["phase"] = "Succeeded"
            return
        cstatus = (pstatus.get("containerStatuses") or [{}])[0]
        terminated = cstatus.get("state", {}).get("terminated") or {}
        code = terminated.get("exitCode")
        node["phase"] = "Failed"
        node["message"] = (
            terminated.get("message") or pstatus.get("message") or f"Error (exit code {code})"
        )

    # -- shutdown ------------------------------------------------------------------------------
    def _shutdown_reason(self, wf: Obj, now: float) -> tuple[str, str] | None:
        """(node message, workflow message) when the workflow must end now, else ``None``."""
        strategy = wf["spec"].get("shutdown")
        if strategy:
            return SHUTDOWN_NODE.format(strategy), SHUTDOWN_WORKFLOW.format(strategy)
        p = self._plans.get(wf["metadata"]["uid"])
        deadline = wf["spec"].get("activeDeadlineSeconds") or (
            p.spec.get("activeDeadlineSeconds") if p else None
        )
        started = parse_rfc3339((wf.get("status") or {}).get("startedAt"))
        if deadline and started is not None and now >= started + float(deadline):
            return (
                "Pod was active on the node longer than the specified deadline",
                "Step exceeded its deadline",
            )
        return None

    def _shut_down(self, wf: Obj, active: list[PodStep], message: str, now: float) -> None:
        """Fail queued pods at once; SIGTERM running ones (SIGKILL after their grace period)."""
        ns = wf["metadata"].get("namespace", "")
        nodes = wf["status"]["nodes"]
        for step in active:
            pod = self.store.get("Pod", ns, step.pod)
            if pod is None or pod["status"].get("phase") != "Running":
                if pod is not None:
                    self.node.fail_unstarted(pod, now, message)
                nodes[step.node_id].update(phase="Failed", message=message, finishedAt=rfc3339(now))
            else:
                self.node.terminate(pod, now)
        self.store.touch(wf)
