"""The Argo node tree of a running workflow: root, StepGroup and Skipped nodes, links, progress.

As Argo's ``executeSteps`` builds it: the Steps root's child is its first StepGroup
(``<wf>[0]``, display name ``[0]``); a StepGroup's children are its steps' nodes (a ``Retry``
node for a step with a ``retryStrategy``, whose children are the attempts; a ``Skipped`` node for
an empty fan-out); the *outbound* nodes of a group (a Pod node itself, a Retry node's last
attempt) have the next StepGroup as their child; and the root's ``outboundNodes`` are those of the
last group once it ends. A StepGroup ends once every child is fulfilled (finished, skipped, or a
running daemon): Failed with ``child '<id>' failed`` when one failed, else Succeeded, and it stays
so (a daemon that dies later does not change it). Node ids are Argo's FNV-32a ids.

Progress, as Argo's ``UpdateProgress``: a Succeeded Pod node is complete (``M/M``); every other
node (Retry, StepGroup, Steps) sums the Pod nodes it reaches through ``children`` (each once);
``status.progress`` is the sum over Pod nodes. A DAG root shows ``status.progress``.
"""

from __future__ import annotations

from collections.abc import Iterable

from qosflow.local.clock import rfc3339
from qosflow.local.store import Obj
from qosflow.local.workflow import Plan, fnv32a

DONE = ("Succeeded", "Failed", "Error")
FINAL = (*DONE, "Skipped", "Omitted")
"""Phases a node never leaves (``Skipped`` and ``Omitted`` count as success)."""


def valid_progress(text: str) -> bool:
    """Whether ``text`` is a valid ``N/M`` (``0 <= N <= M``, ``M > 0``)."""
    parts = text.split("/")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return False
    return 0 <= int(parts[0]) <= int(parts[1]) and int(parts[1]) > 0


def fulfilled(node: Obj) -> bool:
    """Argo's ``Fulfilled``: finished, skipped, or a daemon that runs (``daemoned``)."""
    phase = node.get("phase")
    return phase in FINAL or (bool(node.get("daemoned")) and phase != "Pending")


def group_name(workflow: str, index: int) -> str:
    """The node name of StepGroup ``index`` (``<wf>[i]``)."""
    return f"{workflow}[{index}]"


def group_id(workflow: str, index: int) -> str:
    """The node id of StepGroup ``index``."""
    return f"{workflow}-{fnv32a(group_name(workflow, index))}"


def ensure_root(wf: Obj, p: Plan) -> Obj:
    """The Steps/DAG root node (created Running with the workflow's start time)."""
    name = wf["metadata"]["name"]
    nodes: dict[str, Obj] = wf["status"]["nodes"]
    return nodes.setdefault(
        name,
        {
            "id": name,
            "name": name,
            "displayName": name,
            "type": p.root_type,
            "templateName": p.entrypoint,
            "templateScope": f"local/{name}",
            "phase": "Running",
            "startedAt": wf["status"].get("startedAt"),
            "finishedAt": None,
        },
    )


def start_group(wf: Obj, index: int, now: float) -> None:
    """Create StepGroup ``index`` (Running)."""
    name = wf["metadata"]["name"]
    gid = group_id(name, index)
    wf["status"]["nodes"][gid] = {
        "id": gid,
        "name": group_name(name, index),
        "displayName": f"[{index}]",
        "type": "StepGroup",
        "templateScope": f"local/{name}",
        "boundaryID": name,
        "phase": "Running",
        "startedAt": rfc3339(now),
        "finishedAt": None,
        "children": [],
    }


def skipped_node(wf: Obj, name: str, display: str, message: str, now: float) -> Obj:
    """A ``Skipped`` node (a fan-out over nothing)."""
    workflow = wf["metadata"]["name"]
    stamp = rfc3339(now)
    return {
        "id": f"{workflow}-{fnv32a(name)}",
        "name": name,
        "displayName": display,
        "type": "Skipped",
        "templateScope": f"local/{workflow}",
        "boundaryID": workflow,
        "phase": "Skipped",
        "message": message,
        "startedAt": stamp,
        "finishedAt": stamp,
    }


def outbound(nodes: dict[str, Obj], node_id: str) -> list[str]:
    """Argo's outbound nodes of a group member: a Retry node's last attempt, else itself."""
    node = nodes.get(node_id) or {}
    children = node.get("children") or []
    return [children[-1]] if node.get("type") == "Retry" and children else [node_id]


def group_verdict(nodes: dict[str, Obj], members: list[str]) -> tuple[str, str] | None:
    """``(phase, message)`` of a StepGroup whose members are all fulfilled, else ``None``."""
    present = [nodes[m] for m in members if m in nodes]
    if len(present) < len(members) or not all(fulfilled(n) for n in present):
        return None
    failed = next((n for n in present if n.get("phase") in ("Failed", "Error")), None)
    if failed is not None:
        return "Failed", f"child '{failed['id']}' failed"
    return "Succeeded", ""


def link_steps(wf: Obj, members: list[list[str]]) -> None:
    """Children of the Steps root, its StepGroups and their outbound nodes (see module doc)."""
    name = wf["metadata"]["name"]
    nodes: dict[str, Obj] = wf["status"]["nodes"]
    started = [i for i in range(len(members)) if group_id(name, i) in nodes]
    if started:
        nodes[name]["children"] = [group_id(name, 0)]
    for index in started:
        nodes[group_id(name, index)]["children"] = [m for m in members[index] if m in nodes]
        following = group_id(name, index + 1)
        if following in nodes:
            for member in members[index]:
                for out in outbound(nodes, member):
                    if out in nodes:
                        nodes[out]["children"] = [following]


def aggregate(wf: Obj, p: Plan) -> None:
    """Progress of every node and of the workflow, and the ``PodRunning`` condition."""
    status = wf["status"]
    nodes: dict[str, Obj] = status["nodes"]
    for node in nodes.values():
        if node.get("type") == "Pod" and node.get("phase") == "Succeeded":
            progress = str(node.get("progress") or "0/1")
            if valid_progress(progress):
                total = progress.split("/")[1]
                node["progress"] = f"{total}/{total}"
    for node in nodes.values():
        if node.get("type") not in ("Pod", "DAG"):
            node["progress"] = _reachable_progress(nodes, node)
    running = any(n.get("type") == "Pod" and n.get("phase") == "Running" for n in nodes.values())
    status["conditions"] = [{"type": "PodRunning", "status": "True" if running else "False"}]
    summarise_progress(status)
    name = wf["metadata"]["name"]
    if name in nodes and p.root_type == "DAG":
        nodes[name]["progress"] = status["progress"]


def _reachable_progress(nodes: dict[str, Obj], node: Obj) -> str:
    """Sum of the progress of the Pod nodes reachable from ``node`` (Argo's ``sumProgress``)."""
    seen: set[str] = set()
    stack = list(node.get("children") or [])
    reached: list[Obj] = []
    while stack:
        child = stack.pop()
        if child in seen or child not in nodes:
            continue
        seen.add(child)
        reached.append(nodes[child])
        stack.extend(nodes[child].get("children") or [])
    return sum_progress(reached)


def summarise_progress(status: Obj) -> None:
    """``status.progress`` = sum of the pod nodes' ``N/M``."""
    status["progress"] = sum_progress((status.get("nodes") or {}).values())


def sum_progress(nodes: Iterable[Obj]) -> str:
    """Sum of the valid ``N/M`` of the Pod nodes among ``nodes`` (``0/1`` when none)."""
    done = total = 0
    for node in nodes:
        progress = str(node.get("progress") or "")
        if node.get("type") == "Pod" and valid_progress(progress):
            n, m = progress.split("/")
            done, total = done + int(n), total + int(m)
    return f"{done}/{total}" if total else "0/1"
