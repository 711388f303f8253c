"""The workflow controller: phases, nodes, pods, progress and shutdown, one tick at a time.

A Workflow goes ``""`` (just created) -> ``Running`` (first tick: its pods are created; they may
stay Pending on a node) -> ``Succeeded`` / ``Failed``. Group ``k + 1`` of a steps/dag workflow
starts when every node of group ``k`` is fulfilled (succeeded, skipped, or a daemon running and
ready: :mod:`qosflow.local.daemons`), its fanned-out steps side by side; the pods of a group are
made once the variables of earlier steps they use (``{{steps.NAME.ip}}``) are known. When the
entrypoint ends (its last group succeeded, a group failed, or the workflow is shutting down) its
daemons are terminated, and the workflow takes its final phase once none of its pods runs.

``spec.shutdown`` (stop / terminate) SIGTERMs the running pods and fails the queued ones; every
node then ends Failed with ``workflow shutdown with strategy:  Stop`` and the workflow with
``Stopped with strategy 'Stop'``, as upstream (a running daemon is ended as above and its node
Succeeds, as upstream). Progress is read from each pod's progress file into
``status.nodes[].progress`` and summed (:mod:`qosflow.local.node_tree`) every tick.

One workflow the controller cannot run never stops the others: whatever goes wrong while syncing
it ends that workflow in ``Error`` with a message (its pods are stopped) and the tick moves on.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from qosflow.local.clock import Clock, parse_rfc3339, rfc3339
from qosflow.local.daemons import kill_daemons
from qosflow.local.expansion import node_variables, unresolved
from qosflow.local.node import Nodes
from qosflow.local.node_tree import (
    DONE,
    FINAL,
    aggregate,
    ensure_root,
    fulfilled,
    group_id,
    group_verdict,
    link_steps,
    outbound,
    skipped_node,
    start_group,
    summarise_progress,
)
from qosflow.local.pod_nodes import pending_reason, pod_node, retry_node, sync_pod_node
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
from qosflow.local.workflow import Plan, PodStep, effective_spec, node_id, plan, resolve_step

LABEL_PHASE = "workflows.argoproj.io/phase"
SHUTDOWN_NODE = "workflow shutdown with strategy:  {}"
SHUTDOWN_WORKFLOW = "Stopped with strategy '{}'"
Outcome = tuple[str, str]
"""How the entrypoint ended: (phase, message)."""
_LOG = logging.getLogger(__name__)

__all__ = ["Controller", "pending_reason", "workflow_finished"]


def workflow_finished(wf: Obj) -> bool:
    """Whether a workflow reached a terminal phase."""
    return (wf.get("status") or {}).get("phase") in DONE


class Controller:
    """Runs workflows on the nodes (callers hold ``store.lock``)."""

    def __init__(self, store: Store, clock: Clock, nodes: Nodes) -> None:
        self.store = store
        self.clock = clock
        self.nodes = nodes
        self._plans: dict[str, Plan] = {}

    # -- the loop ------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """One reconcile: kubelet poll, workflows, scheduling, workflows again."""
        self.nodes.poll(now)
        self._sync_all(now)
        self.nodes.schedule(now)
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
                    self.nodes.terminate(pod, now)
                elif pod["status"].get("phase") == "Pending":
                    self.nodes.fail_unstarted(pod, now, message)
            kill_daemons(wf, lambda pod_name: None)  # their pods got SIGTERM just above
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
        started = [s for s in p.steps if s.node_id in nodes]
        attempts = [a for s in started for a in self._attempts(wf, s) if a.node_id in nodes]
        reason = self._shutdown_reason(wf, now)
        for step in attempts:
            self._sync_node(wf, step, nodes[step.node_id], now, reason[0] if reason else "")
        root = nodes.get(wf["metadata"]["name"]) if p.root_type != "Pod" else None
        if root is not None and root.get("phase") in DONE:  # ended: waiting for its daemons
            failed = root["phase"] != "Succeeded"
            outcome: Outcome | None = (
                root["phase"],
                reason[1] if reason and failed else str(root.get("message") or ""),
            )
        elif reason is None:
            for step in started:
                self._update_retry(wf, p, step, now)
            outcome = self._advance(wf, p, now)
        else:
            outcome = self._shut_down(wf, started, attempts, reason, now)
        self._link(wf, p)
        if outcome is not None:
            self._end_entrypoint(wf, p, outcome, now)
        aggregate(wf, p)
        if outcome is not None and not self._live_pods(wf):
            self._complete(wf, outcome[0], outcome[1], now)

    # -- groups --------------------------------------------------------------------------------
    def _members(self, wf: Obj, p: Plan, index: int) -> list[str]:
        """Node ids of group ``index``: its empty fan-outs (``Skipped``) first, then its steps."""
        name = wf["metadata"]["name"]
        skipped = [node_id(name, s.node_name) for s in p.skipped if s.group == index]
        return skipped + [s.node_id for s in p.groups[index]]

    def _advance(self, wf: Obj, p: Plan, now: float) -> Outcome | None:
        """Start the next group when the current one is fulfilled; the outcome once all are."""
        name = wf["metadata"]["name"]
        nodes = wf["status"]["nodes"]
        for index in range(len(p.groups)):
            members = self._members(wf, p, index)
            gid = group_id(name, index) if p.root_type == "Steps" else ""
            group = nodes.get(gid) if gid else None
            if group is not None and group.get("phase") in DONE:  # a group's verdict stays
                if group["phase"] != "Succeeded":
                    return "Failed", str(group.get("message") or "")
                continue
            fresh = group is None and not any(m in nodes for m in members)
            if fresh and not self._start_group(wf, p, index, now):
                return None
            verdict = group_verdict(nodes, members)
            if verdict is None:
                return None
            if group is not None or gid in nodes:
                nodes[gid].update(phase=verdict[0], finishedAt=rfc3339(now))
                if verdict[1]:
                    nodes[gid]["message"] = verdict[1]
            if verdict[0] != "Succeeded":
                message = verdict[1] if p.root_type != "Pod" else nodes[name].get("message", "")
                return "Failed", str(message)
        return "Succeeded", ""

    def _variables(self, wf: Obj, p: Plan, group: int) -> dict[str, str]:
        """``{{steps.NAME.*}}`` (``tasks.`` in a DAG) of the steps of the groups before ``group``."""
        prefix = "steps" if p.root_type == "Steps" else "tasks"
        nodes = wf["status"]["nodes"]
        variables: dict[str, str] = {}
        for index, steps in enumerate(p.groups[:group]):
            for step in steps:
                node = nodes.get(step.node_id)
                if step.display_name != step.step:  # fanned out: the StepGroup's, as upstream
                    node = nodes.get(group_id(wf["metadata"]["name"], index))
                if node is not None:
                    last = nodes.get(outbound(nodes, node["id"])[0], node)
                    variables.update(node_variables(prefix, step.step, last))
        return variables

    def _start_group(self, wf: Obj, p: Plan, index: int, now: float) -> bool:
        """Create the nodes of group ``index``; False while earlier steps' variables are unknown."""
        variables = self._variables(wf, p, index)
        for step in p.groups[index]:
            resolved = resolve_step(step, variables)
            if unresolved([resolved.container, resolved.metadata, resolved.pod_spec_patches]):
                return False
        if p.root_type == "Steps":
            start_group(wf, index, now)
        nodes = wf["status"]["nodes"]
        for skip in (s for s in p.skipped if s.group == index):
            node = skipped_node(wf, skip.node_name, skip.display_name, skip.message, now)
            nodes[node["id"]] = node
        for step in p.groups[index]:
            self._start_step(wf, p, step, now)
        return True

    def _link(self, wf: Obj, p: Plan) -> None:
        """The children links of the root and its groups (Argo's tree)."""
        nodes = wf["status"]["nodes"]
        name = wf["metadata"]["name"]
        if p.root_type == "Steps":
            link_steps(wf, [self._members(wf, p, i) for i in range(len(p.groups))])
        elif p.root_type == "DAG" and name in nodes:
            nodes[name]["children"] = [m for m in self._members(wf, p, 0) if m in nodes]

    def _end_entrypoint(self, wf: Obj, p: Plan, outcome: Outcome, now: float) -> None:
        """The entrypoint ended: its node's phase and outbound nodes; its daemons terminated."""
        name = wf["metadata"]["name"]
        nodes = wf["status"]["nodes"]
        root = nodes.get(name)
        if p.root_type != "Pod" and root is not None and root.get("phase") not in DONE:
            root.update(phase=outcome[0], finishedAt=rfc3339(now))
            if outcome[0] != "Succeeded" and not wf["spec"].get("shutdown"):
                root["message"] = outcome[1]
            started = [i for i in range(len(p.groups)) if group_id(name, i) in nodes]
            if p.root_type == "Steps" and started:
                members = [m for m in self._members(wf, p, started[-1]) if m in nodes]
                root["outboundNodes"] = [o for m in members for o in outbound(nodes, m)]
        ns = wf["metadata"].get("namespace", "")

        def terminate(pod_name: str) -> None:
            pod = self.store.get("Pod", ns, pod_name)
            if pod is not None and pod["status"].get("phase") == "Running":
                self.nodes.terminate(pod, now)

        kill_daemons(wf, terminate)

    def _live_pods(self, wf: Obj) -> list[Obj]:
        """The workflow's pods that have not ended."""
        return [p for p in self._pods_of(wf) if p["status"].get("phase") in ("Pending", "Running")]

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
        if p.root_type != "Pod":
            ensure_root(wf, p)
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
            if node.get("phase") not in FINAL and node.get("type") != "Pod":
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
    def _resolved(self, wf: Obj, p: Plan, step: PodStep) -> PodStep:
        """``step`` with the variables of the steps before its group filled in."""
        return resolve_step(step, self._variables(wf, p, step.group))

    def _start_step(self, wf: Obj, p: Plan, step: PodStep, now: float) -> None:
        """Create the node(s) of a step: its pod node, or a Retry node and attempt 0."""
        nodes = wf["status"]["nodes"]
        if step.retry is None:
            nodes[step.node_id] = self._create_pod(wf, p, step, now)
            return
        nodes[step.node_id] = retry_node(wf, self._resolved(wf, p, step), now)
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
        step = self._resolved(wf, p, step)
        node = pod_node(wf, step, now)
        try:
            pod = build_pod(self.store, wf, step, rfc3339(now) or "", self.nodes.grace_s)
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
        if last.get("daemoned"):
            node["daemoned"] = True
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
        pod = self.store.get("Pod", wf["metadata"].get("namespace", ""), step.pod)
        progress = self.nodes.progress_of(pod) if pod is not None else None
        sync_pod_node(step, node, pod, progress, now, shutdown)

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

    def _shut_down(
        self,
        wf: Obj,
        started: list[PodStep],
        attempts: list[PodStep],
        reason: tuple[str, str],
        now: float,
    ) -> Outcome | None:
        """Stop the pods of unfinished nodes; the outcome once every node is fulfilled.

        Queued pods fail at once; running ones get SIGTERM (SIGKILL after their grace period). A
        running daemon is left to :func:`~qosflow.local.daemons.kill_daemons`, as upstream.
        """
        nodes = wf["status"]["nodes"]
        active = [a for a in attempts if not fulfilled(nodes[a.node_id])]
        ns = wf["metadata"].get("namespace", "")
        for step in active:
            pod = self.store.get("Pod", ns, step.pod)
            if pod is None or pod["status"].get("phase") != "Running":
                if pod is not None:
                    self.nodes.fail_unstarted(pod, now, reason[0])
                nodes[step.node_id].update(
                    phase="Failed", message=reason[0], finishedAt=rfc3339(now)
                )
            else:
                self.nodes.terminate(pod, now)
        if any(not fulfilled(nodes[a.node_id]) for a in attempts):
            return None
        for step in started:
            if not fulfilled(nodes[step.node_id]):
                nodes[step.node_id].update(
                    phase="Failed", message=reason[0], finishedAt=rfc3339(now)
                )
        return "Failed", reason[1]
