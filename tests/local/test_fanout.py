"""Fan-out (issue 18): ``withSequence`` and ``withItems`` name, number and parameterise the
children as Argo does (``<wf>[1].worker(0:0)``, ids ``<wf>-<fnv32a(name)>``, pods
``<wf>-<template>-<hash>``), an empty fan-out is a Skipped node, and what Argo's validation
refuses is refused at create. Scripted pods on a virtual clock."""

from __future__ import annotations

from typing import Any

import pytest

from qosflow.local import VirtualClock
from qosflow.local.workflow import fnv32a

from .conftest import NS, Api, argo_validator, container_wf, errors_of
from .segments import by_name, node_id, request

WORKFLOW = argo_validator("Workflow")


def _fanned(step: dict[str, Any]) -> dict[str, Any]:
    """A steps workflow with one step ``x`` over the ``work`` template (input ``v``)."""
    work = container_wf("w", steps=2)["workflow"]["spec"]["templates"][0]
    work = {
        **work,
        "name": "work",
        "inputs": {"parameters": [{"name": "v"}]},
        "metadata": {"labels": {"qosflow.dev/v": "{{inputs.parameters.v}}"}},
    }
    base = {
        "name": "x",
        "template": "work",
        "arguments": {"parameters": [{"name": "v", "value": "{{item}}"}]},
    }
    return {
        "entrypoint": "main",
        "arguments": {"parameters": [{"name": "n", "value": "3"}]},
        "templates": [{"name": "main", "steps": [[{**base, **step}]]}, work],
    }


def _run(argo: Api, clock: VirtualClock, name: str, spec: dict[str, Any], ticks: int = 6) -> Any:
    answer = argo("POST", f"/api/v1/workflows/{NS}", json=request(name, spec))
    assert answer.status_code == 200, answer.text
    for _ in range(ticks):
        clock.advance(1)
    return argo("GET", f"/api/v1/workflows/{NS}/{name}").json()


@pytest.mark.parametrize(
    ("loop", "names", "values"),
    [
        (
            {"withSequence": {"count": "{{workflow.parameters.n}}"}},
            ["x(0:0)", "x(1:1)", "x(2:2)"],
            ["0", "1", "2"],
        ),
        (
            {"withSequence": {"start": "5", "end": "3"}},
            ["x(0:5)", "x(1:4)", "x(2:3)"],
            ["5", "4", "3"],
        ),
        (
            {"withSequence": {"start": 1, "count": 2, "format": "r%02d"}},
            ["x(0:r01)", "x(1:r02)"],
            ["r01", "r02"],
        ),
        (
            {"withItems": ["a(b)", 7, 2.5, True]},
            ["x(0:ab)", "x(1:7)", "x(2:2.5)", "x(3:true)"],
            ["a(b)", "7", "2.5", "true"],
        ),
    ],
)
def test_names_ids_pods_and_items(
    argo: Api,
    kube: Api,
    clock: VirtualClock,
    loop: dict[str, Any],
    names: list[str],
    values: list[str],
) -> None:
    wf = _run(argo, clock, "fan", _fanned(loop))
    assert wf["status"]["phase"] == "Succeeded"
    assert errors_of(WORKFLOW, wf) == []
    nodes = by_name(wf)
    group = nodes["fan[0]"]
    assert group["children"] == [node_id("fan", f"fan[0].{n}") for n in names]
    pods = kube("GET", f"/api/v1/namespaces/{NS}/pods").json()["items"]
    labels = {p["metadata"]["name"]: p["metadata"]["labels"]["qosflow.dev/v"] for p in pods}
    for name, value in zip(names, values, strict=True):
        node = nodes[f"fan[0].{name}"]
        assert node["id"] == f"fan-{fnv32a(f'fan[0].{name}')}"
        assert (node["displayName"], node["type"], node["boundaryID"]) == (name, "Pod", "fan")
        assert node["inputs"] == {"parameters": [{"name": "v", "value": value}]}
        assert labels[f"fan-work-{fnv32a(f'fan[0].{name}')}"] == value
    assert nodes["fan"]["outboundNodes"] == group["children"]


def test_an_empty_fan_out_is_skipped(argo: Api, clock: VirtualClock) -> None:
    wf = _run(argo, clock, "none", _fanned({"withSequence": {"count": "0"}}), ticks=2)
    node = by_name(wf)["none[0].x"]
    assert (node["type"], node["phase"], node["message"]) == (
        "Skipped",
        "Skipped",
        "Skipped, empty params",
    )
    assert wf["status"]["phase"] == "Succeeded"
    assert errors_of(WORKFLOW, wf) == []


def test_fan_out_in_a_dag(argo: Api, clock: VirtualClock) -> None:
    spec = _fanned({"withItems": ["p", "q"]})
    spec["templates"][0] = {"name": "main", "dag": {"tasks": spec["templates"][0]["steps"][0]}}
    wf = _run(argo, clock, "dag", spec)
    assert {"dag.x(0:p)", "dag.x(1:q)"} <= set(by_name(wf))
    assert wf["status"]["phase"] == "Succeeded"


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            {"withSequence": {"count": "2", "end": "3"}},
            "templates.main.steps[0].x only one of count or end can be defined in withSequence",
        ),
        ({"withSequence": {"start": "1"}}, "neither end nor count was specified in withSequence"),
        ({"withSequence": {"count": "two"}}, 'strconv.Atoi: parsing "two": invalid syntax'),
        (
            {"withItems": ["a"], "withSequence": {"count": "1"}},
            "only one of withItems, withParam, withSequence can be specified",
        ),
        ({"withParam": "[1, 2]"}, "not withParam"),
        ({"withItems": [{"k": "v"}]}, "strings, numbers or booleans"),
        (
            {"arguments": {"parameters": [{"name": "v", "value": "{{steps.nope.ip}}"}]}},
            "templates.main.steps failed to resolve {{steps.nope.ip}}",
        ),
    ],
)
def test_refused_at_create(argo: Api, step: dict[str, Any], message: str) -> None:
    answer = argo("POST", f"/api/v1/workflows/{NS}", json=request("bad", _fanned(step)))
    assert answer.status_code == 400
    assert message in answer.json()["message"]


def test_ip_only_of_an_earlier_daemon_step(argo: Api) -> None:
    spec = _fanned({})
    spec["templates"][0]["steps"] = [
        [
            {
                "name": "first",
                "template": "work",
                "arguments": {"parameters": [{"name": "v", "value": "a"}]},
            }
        ],
        [
            {
                "name": "x",
                "template": "work",
                "arguments": {"parameters": [{"name": "v", "value": "{{steps.first.ip}}"}]},
            }
        ],
    ]
    answer = argo("POST", f"/api/v1/workflows/{NS}", json=request("notdaemon", spec))
    assert answer.status_code == 400
    assert answer.json()["message"] == "templates.main.steps failed to resolve {{steps.first.ip}}"
    spec["templates"][0]["steps"][1][0]["arguments"]["parameters"][0]["value"] = (
        "{{steps.first.id}}"
    )
    assert argo("POST", f"/api/v1/workflows/{NS}", json=request("byid", spec)).status_code == 200


def test_a_step_variable_reaches_the_pod(argo: Api, clock: VirtualClock) -> None:
    spec = _fanned({})
    spec["templates"][0]["steps"] = [
        [
            {
                "name": "first",
                "template": "work",
                "arguments": {"parameters": [{"name": "v", "value": "a"}]},
            }
        ],
        [
            {
                "name": "x",
                "template": "work",
                "arguments": {"parameters": [{"name": "v", "value": "{{steps.first.status}}"}]},
            }
        ],
    ]
    wf = _run(argo, clock, "vars", spec)
    assert by_name(wf)["vars[1].x"]["inputs"]["parameters"][0]["value"] == "Succeeded"


def test_a_template_may_not_name_steps(argo: Api) -> None:
    spec = _fanned({})
    spec["templates"][1]["container"]["env"] = [{"name": "X", "value": "{{steps.x.id}}"}]
    answer = argo("POST", f"/api/v1/workflows/{NS}", json=request("leaf", spec))
    assert answer.status_code == 400
    assert answer.json()["message"] == "templates.work: failed to resolve {{steps.x.id}}"


def test_variables_of_a_fanned_out_step_are_its_groups(argo: Api, clock: VirtualClock) -> None:
    spec = _fanned({"withItems": ["a", "b"]})
    spec["templates"][0]["steps"].append(
        [
            {
                "name": "y",
                "template": "work",
                "arguments": {"parameters": [{"name": "v", "value": "{{steps.x.id}}"}]},
            }
        ]
    )
    wf = _run(argo, clock, "agg", spec)
    assert by_name(wf)["agg[1].y"]["inputs"]["parameters"][0]["value"] == node_id("agg", "agg[0]")
