"""Create-time validation (issue 15, A): everything the controller will parse later is checked at
create, with Argo's / Kubernetes' error shapes naming the field; names and namespaces are RFC 1123,
so no object can reach a path outside the state directory."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest

from qosflow.local import LocalCluster, VirtualClock
from qosflow.local.errors import LocalClusterError
from qosflow.local.names import pod_dir

from .conftest import NS, Api, container_wf

TEMPLATES = f"/api/v1/workflow-templates/{NS}"
WORKFLOWS = f"/api/v1/workflows/{NS}"


def _main(request: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = request["workflow"]["spec"]["templates"][0]
    return template


def _cpu(value: str) -> dict[str, Any]:
    request = container_wf("bad")
    _main(request)["container"]["resources"] = {"requests": {"cpu": value}}
    return request


def _retry(strategy: dict[str, Any]) -> dict[str, Any]:
    request = container_wf("bad")
    _main(request)["retryStrategy"] = strategy
    return request


def _patch(patch: str, *, workflow_level: bool = False) -> dict[str, Any]:
    request = container_wf("bad")
    target = request["workflow"]["spec"] if workflow_level else _main(request)
    target["podSpecPatch"] = patch
    return request


BAD_WORKFLOWS = [
    (_cpu("abc"), "templates.main.container.resources.requests.cpu: quantities must match"),
    (_cpu("1Gx"), "templates.main.container.resources.requests.cpu: quantities must match"),
    (_retry({"limit": "x"}), "templates.main.retryStrategy.limit: must be an integer"),
    (_retry({"limit": 1.5}), "templates.main.retryStrategy.limit: must be an integer"),
    (
        _retry({"limit": 1, "backoff": {"duration": "soon"}}),
        "templates.main.retryStrategy.backoff.duration: not a duration",
    ),
    (
        _retry({"limit": 1, "backoff": {"duration": "1s", "maxDuration": "later"}}),
        "templates.main.retryStrategy.backoff.maxDuration: not a duration",
    ),
    (
        _retry({"limit": 1, "backoff": {"factor": "two"}}),
        "templates.main.retryStrategy.backoff.factor: must be an integer",
    ),
    (_patch("{not: [json"), "templates.main.podSpecPatch: not valid JSON or YAML"),
    (_patch("[1, 2]"), "templates.main.podSpecPatch: must be a mapping"),
    (_patch('"just a string"'), "templates.main.podSpecPatch: must be a mapping"),
    (
        _patch('{"terminationGracePeriodSeconds": "soon"}'),
        "podSpecPatch.terminationGracePeriodSeconds: must be a non-negative integer",
    ),
    (_patch("[oops", workflow_level=True), "spec.podSpecPatch: not valid JSON or YAML"),
]


@pytest.mark.parametrize(("request_body", "message"), BAD_WORKFLOWS)
def test_create_refuses_what_the_controller_could_not_parse(
    argo: Api, clock: VirtualClock, request_body: dict[str, Any], message: str
) -> None:
    response = argo("POST", WORKFLOWS, json=request_body)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == 3 and message in response.json()["message"]
    assert argo("GET", f"{WORKFLOWS}/bad").status_code == 404
    template = {"template": {"metadata": {"name": "bad"}, "spec": request_body["workflow"]["spec"]}}
    response = argo("POST", TEMPLATES, json=template)
    assert response.status_code == 400 and message in response.json()["message"]
    clock.advance(1)  # and the controller still ticks


GO_QUANTITY = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def test_a_templated_quantity_is_refused_as_argos_decoder_refuses_it(argo: Api) -> None:
    request = container_wf("param")
    request["workflow"]["spec"]["arguments"] = {"parameters": [{"name": "cpu", "value": "1"}]}
    _main(request)["container"]["resources"] = {"requests": {"cpu": "{{workflow.parameters.cpu}}"}}
    response = argo("POST", WORKFLOWS, json=request)
    assert response.status_code == 400
    message = response.json()["message"]
    assert "templates.main.container.resources.requests.cpu" in message and GO_QUANTITY in message
    template = {"template": {"metadata": {"name": "param"}, "spec": request["workflow"]["spec"]}}
    response = argo("POST", TEMPLATES, json=template)
    assert response.status_code == 400 and GO_QUANTITY in response.json()["message"]
    spec = request["workflow"]["spec"]
    spec["templateDefaults"] = {"container": _main(request).pop("container") | {"image": "x"}}
    _main(request)["container"] = {"image": "x", "command": ["true"]}
    response = argo("POST", WORKFLOWS, json=request)
    assert response.status_code == 400
    assert "templateDefaults.container.resources.requests.cpu" in response.json()["message"]


def test_a_quantity_from_a_pod_spec_patch_is_checked_when_the_pod_is_created(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    patch = '{"containers": [{"name": "main", "resources": {"requests": {"cpu": "{{workflow.parameters.cpu}}"}}}]}'
    for name, cpu in (("lots", "lots"), ("one", "1")):
        request = container_wf(name)
        request["workflow"]["spec"]["arguments"] = {"parameters": [{"name": "cpu", "value": cpu}]}
        request["workflow"]["spec"]["podSpecPatch"] = patch
        assert argo("POST", WORKFLOWS, json=request).status_code == 200
    clock.advance(1)
    failed = argo("GET", f"{WORKFLOWS}/lots").json()
    node = failed["status"]["nodes"]["lots"]
    assert node["phase"] == "Error"
    assert node["message"].startswith("Error applying PodSpecPatch: invalid podSpecPatch ")
    assert GO_QUANTITY in node["message"]
    assert kube("GET", f"/api/v1/namespaces/{NS}/pods/lots").status_code == 404
    pod = kube("GET", f"/api/v1/namespaces/{NS}/pods/one").json()
    assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


def test_submit_with_a_parameter_the_controller_cannot_parse_is_400(argo: Api) -> None:
    spec = container_wf("x")["workflow"]["spec"]
    spec["arguments"] = {"parameters": [{"name": "grace", "value": "30"}]}
    spec["podSpecPatch"] = '{"terminationGracePeriodSeconds": {{workflow.parameters.grace}}}'
    template = {"template": {"metadata": {"name": "graceful"}, "spec": spec}}
    assert argo("POST", TEMPLATES, json=template).status_code == 200
    body = {
        "resourceKind": "WorkflowTemplate",
        "resourceName": "graceful",
        "submitOptions": {"name": "g-bad", "parameters": ["grace=[1"]},
    }
    response = argo("POST", f"{WORKFLOWS}/submit", json=body)
    assert response.status_code == 400
    assert "spec.podSpecPatch: not valid JSON or YAML" in response.json()["message"]
    body["submitOptions"] = {"name": "g-ok", "parameters": ["grace=7"]}
    assert argo("POST", f"{WORKFLOWS}/submit", json=body).status_code == 200


def test_substituted_pod_spec_patch_sets_the_grace_period(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    request = container_wf("grace")
    request["workflow"]["spec"]["arguments"] = {"parameters": [{"name": "g", "value": "7"}]}
    _main(request)["podSpecPatch"] = (
        "terminationGracePeriodSeconds: {{workflow.parameters.g}}"  # YAML, like upstream examples
    )
    assert argo("POST", WORKFLOWS, json=request).status_code == 200
    clock.advance(1)
    pod = kube("GET", f"/api/v1/namespaces/{NS}/pods/grace").json()
    assert pod["spec"]["terminationGracePeriodSeconds"] == 7


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda t: t.update(name="bad/name"),
            "templates.bad/name.name name must consist of alpha-numeric characters or '-'",
        ),
        (lambda t: t.pop("name"), "templates.name is required"),
    ],
)
def test_template_names_follow_argo_rules(argo: Api, mutate: Any, message: str) -> None:
    request = container_wf("names")
    mutate(_main(request))
    response = argo("POST", WORKFLOWS, json=request)
    assert response.status_code == 400 and message in response.json()["message"]


def test_nameless_parameters_steps_and_tasks_are_400_not_500(argo: Api) -> None:
    main = _main(container_wf("x"))
    bodies = [
        {"entrypoint": "main", "templates": [main], "arguments": {"parameters": [{"value": "1"}]}},
        {"entrypoint": "main", "templates": [main], "arguments": {"parameters": [None]}},
        {
            "entrypoint": "p",
            "templates": [{"name": "p", "steps": [[{"template": "main"}]]}, main],
        },
        {"entrypoint": "p", "templates": [{"name": "p", "steps": [[None]]}, main]},
        {"entrypoint": "d", "templates": [{"name": "d", "dag": {"tasks": [{}]}}, main]},
        {"entrypoint": "main", "templates": [None, main]},
    ]
    for spec in bodies:
        response = argo(
            "POST", WORKFLOWS, json={"workflow": {"metadata": {"name": "n"}, "spec": spec}}
        )
        assert response.status_code == 400, (spec, response.text)
        assert "is required" in response.json()["message"]


def _raw_post(url: str, token: str, path: str, body: Any) -> tuple[int, Any]:
    """POST with a path ``requests`` would normalise (``..``)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn.request("POST", path, body=json.dumps(body), headers=headers)
    response = conn.getresponse()
    status, data = response.status, json.loads(response.read())
    conn.close()
    return status, data


@pytest.mark.parametrize("namespace", ["..", ".", "Bad_NS", "a.b", "-x", "x" * 64])
def test_namespace_must_be_an_rfc1123_label(cluster: LocalCluster, namespace: str) -> None:
    before = sorted(p.name for p in cluster.state_dir.iterdir())
    status, body = _raw_post(
        cluster.argo_url,
        cluster.token,
        f"/api/v1/workflows/{namespace}",
        container_wf("state.json"),
    )
    assert status == 400 and body["code"] == 3
    assert "metadata.namespace: Invalid value" in body["message"]
    status, body = _raw_post(
        cluster.argo_url,
        cluster.token,
        f"/api/v1/workflow-templates/{namespace}",
        {"template": {"metadata": {"name": "t"}, "spec": container_wf("t")["workflow"]["spec"]}},
    )
    assert status == 400 and "metadata.namespace" in body["message"]
    assert sorted(p.name for p in cluster.state_dir.iterdir()) == before


def test_name_must_be_an_rfc1123_subdomain(argo: Api) -> None:
    for name in ("..", "a..b", "UPPER", "x" * 254, "a/b"):
        request = container_wf("x")
        request["workflow"]["metadata"]["name"] = name
        response = argo("POST", WORKFLOWS, json=request)
        assert (
            response.status_code == 400
            and "metadata.name: Invalid value" in (response.json()["message"])
        ), name


def test_pod_log_of_a_dot_dot_path_is_404(cluster: LocalCluster, kube: Api) -> None:
    outside = cluster.state_dir.parent / "main.log"
    outside.write_text("secret\n")
    host, port = cluster.kube_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(
        "GET",
        "/api/v1/namespaces/../pods/../log",
        headers={"Authorization": f"Bearer {cluster.token}"},
    )
    response = conn.getresponse()
    assert response.status == 404 and b"secret" not in response.read()


def test_pod_dir_refuses_names_and_paths_outside_the_pods_folder(tmp_path: Path) -> None:
    assert pod_dir(tmp_path, "qosflow", "wf-main-1") == (tmp_path / "pods/qosflow/wf-main-1")
    for namespace, name in (("..", "x"), ("qosflow", ".."), ("qosflow", "a/../../b"), ("", "x")):
        with pytest.raises(LocalClusterError):
            pod_dir(tmp_path, namespace, name)
    (tmp_path / "pods").mkdir()
    (tmp_path / "pods" / "qosflow").symlink_to(tmp_path.parent)  # a link out of the pods folder
    with pytest.raises(LocalClusterError, match="outside"):
        pod_dir(tmp_path, "qosflow", "x")


def test_pod_validation_failure_is_a_node_error_as_upstream(argo: Api, clock: VirtualClock) -> None:
    request = container_wf("limit")
    _main(request)["container"]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}
    _main(request)["container"]["env"] = [{"value": "no name"}]
    assert argo("POST", WORKFLOWS, json=request).status_code == 200  # Argo accepts it ...
    clock.advance(1)
    wf = argo("GET", f"{WORKFLOWS}/limit").json()
    node = wf["status"]["nodes"]["limit"]
    assert node["phase"] == "Error"  # ... and the pod creation fails, as the API server says
    assert "must be less than or equal to cpu limit of 1" in node["message"]
    assert "spec.containers[0].env[0].name: Required value" in node["message"]
    assert wf["status"]["phase"] == "Failed"
