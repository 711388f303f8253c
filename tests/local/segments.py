"""Multi-pod segment workflows for the tests: the shape of the ``train-workers-cpu`` steps template
(a rendezvous daemon step, then ``withSequence`` workers that reach it at ``{{steps.rendezvous.ip}}``)."""

from __future__ import annotations

import json
from typing import Any

from qosflow.local.workflow import fnv32a

RDZV_PORT = 29400
POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def segment_spec(
    *,
    pods: int = 2,
    daemon_command: list[str] | None = None,
    worker_command: list[str] | None = None,
    probe: dict[str, Any] | None = None,
    probed: bool = True,
    retry: dict[str, Any] | None = None,
    cpu: str = "1",
) -> dict[str, Any]:
    """A workflow spec of the multi-pod segment shape (entrypoint ``train-workers-cpu``)."""
    resources = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    patch = {"containers": [{"name": "main", "resources": resources}]}
    daemon: dict[str, Any] = {
        "image": "ignored",
        "command": daemon_command or ["python", "-c", "import time; time.sleep(600)"],
        "env": [POD_IP],
    }
    if probed:
        daemon["readinessProbe"] = probe or {"tcpSocket": {"port": RDZV_PORT}, "periodSeconds": 1}
    worker = {
        "name": "worker-cpu",
        "inputs": {"parameters": [{"name": "rank"}, {"name": "rdzv"}]},
        "metadata": {"labels": {"qosflow.dev/rank": "{{inputs.parameters.rank}}"}},
        "podSpecPatch": json.dumps(patch),
        "retryStrategy": retry or {"limit": 0},
        "container": {
            "image": "ignored",
            "command": worker_command or ["python", "-c", "pass"],
            "env": [
                {"name": "QOSFLOW_RANK", "value": "{{inputs.parameters.rank}}"},
                {
                    "name": "QOSFLOW_RDZV_ENDPOINT",
                    "value": f"{{{{inputs.parameters.rdzv}}}}:{RDZV_PORT}",
                },
                {"name": "QOSFLOW_TOTAL_STEPS", "value": "3"},
                POD_IP,
            ],
        },
    }
    arguments = [
        {"name": "rank", "value": "{{item}}"},
        {"name": "rdzv", "value": "{{steps.rendezvous.ip}}"},
    ]
    steps = [
        [{"name": "rendezvous", "template": "rendezvous"}],
        [
            {
                "name": "worker",
                "template": "worker-cpu",
                "withSequence": {"count": "{{workflow.parameters.pods}}"},
                "arguments": {"parameters": arguments},
            }
        ],
    ]
    return {
        "entrypoint": "train-workers-cpu",
        "arguments": {"parameters": [{"name": "pods", "value": str(pods)}]},
        "templates": [
            {"name": "train-workers-cpu", "steps": steps},
            {"name": "rendezvous", "daemon": True, "container": daemon},
            worker,
        ],
    }


def request(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A WorkflowCreateRequest."""
    return {"workflow": {"metadata": {"name": name}, "spec": spec}}


def node_id(workflow: str, node_name: str) -> str:
    """Argo's node id."""
    return workflow if node_name == workflow else f"{workflow}-{fnv32a(node_name)}"


def by_name(wf: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The workflow's nodes by node name."""
    return {n["name"]: n for n in wf["status"]["nodes"].values()}


def assert_segment_tree(wf: dict[str, Any], name: str, *, progress: str) -> None:
    """Argo's names, ids, types and links of the nodes of a two-worker segment."""
    nodes = by_name(wf)
    expected = {
        name: ("Steps", name),
        f"{name}[0]": ("StepGroup", "[0]"),
        f"{name}[0].rendezvous": ("Pod", "rendezvous"),
        f"{name}[1]": ("StepGroup", "[1]"),
        f"{name}[1].worker(0:0)": ("Retry", "worker(0:0)"),
        f"{name}[1].worker(0:0)(0)": ("Pod", "worker(0:0)(0)"),
        f"{name}[1].worker(1:1)": ("Retry", "worker(1:1)"),
        f"{name}[1].worker(1:1)(0)": ("Pod", "worker(1:1)(0)"),
    }
    assert set(nodes) == set(expected)
    for node_name, (kind, display) in expected.items():
        node = nodes[node_name]
        assert (node["id"], node["type"], node["displayName"]) == (
            node_id(name, node_name),
            kind,
            display,
        )

    def ids(*names: str) -> list[str]:
        return [node_id(name, f"{name}{n}") for n in names]

    assert nodes[name]["children"] == ids("[0]")
    assert nodes[f"{name}[0]"]["children"] == ids("[0].rendezvous")
    assert nodes[f"{name}[0].rendezvous"]["children"] == ids("[1]")
    assert nodes[f"{name}[1]"]["children"] == ids("[1].worker(0:0)", "[1].worker(1:1)")
    assert nodes[f"{name}[1].worker(0:0)"]["children"] == ids("[1].worker(0:0)(0)")
    assert nodes[name]["outboundNodes"] == ids("[1].worker(0:0)(0)", "[1].worker(1:1)(0)")
    assert nodes[name]["progress"] == wf["status"]["progress"] == progress
