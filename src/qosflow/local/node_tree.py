"""The Argo node tree of a running workflow: root and StepGroup nodes, and progress sums.

Pure functions over workflow documents, called by the controller after each sync: the Steps/DAG
root node and the ``StepGroup`` nodes (with Argo's FNV-32a ids), a ``Retry`` node's progress (the
sum of its attempts), ``status.progress`` (the sum over Pod nodes) and the ``PodRunning`` condition.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from qosflow.local.clock import rfc3339
from qosflow.local.workflow import Plan, PodStep, fnv32a

Obj = dict[str, Any]
DONE = ("Succeeded", "Failed", "Error")


def valid_progress(text: str) -> bool:
    """Whether ``text`` is a valid ``N/M`` (``0 <= N <= M``, ``M > 0``)."""
    parts = text.split("/")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return False
    return 0 <= int(parts[0]) <= int(parts[1]) and int(parts[1]) > 0


def aggregate(wf: Obj, p: Plan, now: float) -> None:
    """Root/group nodes, ``status.progress`` and the ``PodRunning`` condition."""
    status = wf["status"]
    nodes: dict[str, Obj] = status["nodes"]
    name = wf["metadata"]["name"]
    pods = [s for s in p.steps if s.node_id in nodes]
    if p.root_type != "Pod":
        _group_nodes(wf, p, pods, now)
    running = any(n.get("type") == "Pod" and n.get("phase") == "Running" for n in nodes.values())
    for node in nodes.values():
        if node.get("type") == "Retry":
            node["progress"] = sum_progress(nodes[c] for c in node.get("children") or [])
    status["conditions"] = [{"type": "PodRunning", "status": "True" if running else "False"}]
    summarise_progress(status)
    if name in nodes and p.root_type != "Pod":
        nodes[name]["progress"] = status["progress"]


def _group_nodes(wf: Obj, p: Plan, pods: list[PodStep], now: float) -> None:
    """The Steps/DAG root node and StepGroup nodes."""
    name = wf["metadata"]["name"]
    nodes: dict[str, Obj] = wf["status"]["nodes"]
    started = wf["status"].get("startedAt")
    root = nodes.setdefault(
        name,
        {
            "id": name,
            "name": name,
            "displayName": name,
            "type": p.root_type,
            "templateName": p.entrypoint,
            "templateScope": f"local/{name}",
            "phase": "Running",
            "startedAt": started,
            "finishedAt": None,
        },
    )
    if p.root_type == "DAG":
        root["children"] = [s.node_id for s in pods if s.group == 0]
        return
    children = []
    for index in sorted({s.group for s in pods}):
        group_name = f"{name}[{index}]"
        gid = f"{name}-{fnv32a(group_name)}"
        members = [s for s in pods if s.group == index]
        phases = {nodes[s.node_id].get("phase") for s in members}
        phase = (
            "Running"
            if phases - set(DONE)
            else ("Failed" if phases - {"Succeeded"} else "Succeeded")
        )
        nodes[gid] = {
            "id": gid,
            "name": group_name,
            "displayName": f"[{index}]",
            "type": "StepGroup",
            "templateScope": f"local/{name}",
            "boundaryID": name,
            "phase": phase,
            "startedAt": nodes.get(gid, {}).get("startedAt", rfc3339(now)),
            "finishedAt": None
            if phase == "Running"
            else nodes.get(gid, {}).get("finishedAt") or rfc3339(now),
            "children": [s.node_id for s in members],
        }
        children.append(gid)
    root["children"] = children[:1]


def summarise_progress(status: Obj) -> None:
    """``status.progress`` = sum of the pod nodes' ``N/M``."""
    status["progress"] = sum_progress((status.get("nodes") or {}).values())


def sum_progress(nodes: Iterable[Obj]) -> str:
    """Sum of the ``N/M`` of the Pod nodes among ``nodes`` (``0/1`` when none)."""
    done = total = 0
    for node in nodes:
        if node.get("type") == "Pod" and node.get("progress"):
            n, m = node["progress"].split("/")
            done, total = done + int(n), total + int(m)
    return f"{done}/{total}" if total else "0/1"
