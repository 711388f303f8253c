"""Contract tests of the emulated Argo Server: shapes against schema.json / swagger.json, status
codes and ``{code, message}`` bodies of the real server (v4.1.2)."""

from __future__ import annotations

import json

import requests

from qosflow.local import LocalCluster, VirtualClock

from .conftest import NS, Api, argo_validator, container_wf, errors_of, swagger_validator

WORKFLOW = argo_validator("Workflow")
TEMPLATE = argo_validator("WorkflowTemplate")
ERROR = swagger_validator("grpc.gateway.runtime.Error")
LIST = swagger_validator("io.argoproj.workflow.v1alpha1.WorkflowList")


def test_version_and_header(argo: Api) -> None:
    response = argo("GET", "/api/v1/version")
    assert response.status_code == 200
    assert response.headers["Grpc-Metadata-Argo-Version"] == "v4.1.2"
    assert (
        errors_of(swagger_validator("io.argoproj.workflow.v1alpha1.Version"), response.json()) == []
    )
    info = argo("GET", "/api/v1/info")
    assert info.status_code == 200
    assert (
        errors_of(swagger_validator("io.argoproj.workflow.v1alpha1.InfoResponse"), info.json())
        == []
    )


def test_missing_or_wrong_token_is_401_without_version_header(cluster: LocalCluster) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}):
        response = requests.get(
            f"{cluster.argo_url}/api/v1/workflows/{NS}", headers=headers, timeout=5
        )
        assert response.status_code == 401
        assert response.json() == {
            "code": 16,
            "message": "token not valid. see https://argo-workflows.readthedocs.io/en/latest/faq/",
        }
        assert "Grpc-Metadata-Argo-Version" not in response.headers


def test_create_returns_stored_workflow_with_null_times(argo: Api) -> None:
    response = argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("wf-a"))
    assert response.status_code == 200
    body = response.json()
    assert errors_of(WORKFLOW, body) == []
    meta = body["metadata"]
    assert meta["name"] == "wf-a" and meta["namespace"] == NS
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"]
    assert body["status"] == {"startedAt": None, "finishedAt": None}


def test_generate_name_gets_five_char_suffix(argo: Api) -> None:
    request = container_wf("x")
    del request["workflow"]["metadata"]["name"]
    request["workflow"]["metadata"]["generateName"] = "train-"
    name = argo("POST", f"/api/v1/workflows/{NS}", json=request).json()["metadata"]["name"]
    assert name.startswith("train-") and len(name) == len("train-") + 5


def test_duplicate_name_is_409_already_exists(argo: Api) -> None:
    assert argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("dup")).status_code == 200
    response = argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("dup"))
    assert response.status_code == 409
    assert response.json() == {"code": 6, "message": 'workflows.argoproj.io "dup" already exists'}
    assert errors_of(ERROR, response.json()) == []


def test_validation_errors_are_400_invalid_argument(argo: Api) -> None:
    request = container_wf("bad")
    del request["workflow"]["spec"]["entrypoint"]
    response = argo("POST", f"/api/v1/workflows/{NS}", json=request)
    assert (response.status_code, response.json()) == (
        400,
        {"code": 3, "message": "spec.entrypoint is required"},
    )
    request = container_wf("bad")
    request["workflow"]["spec"]["entrypoint"] = "nope"
    response = argo("POST", f"/api/v1/workflows/{NS}", json=request)
    assert response.status_code == 400 and "'nope' undefined" in response.json()["message"]
    request = container_wf("bad")
    request["workflow"]["spec"]["templates"][0]["script"] = {"image": "x", "source": "y"}
    response = argo("POST", f"/api/v1/workflows/{NS}", json=request)
    assert response.status_code == 400 and "multiple template types" in response.json()["message"]
    response = argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        json={"workflow": {"metadata": {"name": "Bad_Name"}, "spec": {}}},
    )
    assert response.status_code == 400 and response.json()["code"] == 3


def test_malformed_json_is_400(argo: Api) -> None:
    response = argo(
        "POST",
        f"/api/v1/workflows/{NS}",
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["code"] == 3 and "invalid character" in response.json()["message"]
    assert set(response.json()) == {"code", "message"}


def test_get_missing_is_404_and_unknown_route_is_404(argo: Api) -> None:
    response = argo("GET", f"/api/v1/workflows/{NS}/ghost")
    assert (response.status_code, response.json()) == (
        404,
        {"code": 5, "message": 'workflows.argoproj.io "ghost" not found'},
    )
    assert argo("DELETE", f"/api/v1/workflows/{NS}/ghost").status_code == 404
    assert argo("PUT", f"/api/v1/workflows/{NS}/ghost/stop").status_code == 404
    assert argo("GET", "/api/v1/nothing-here").status_code == 404


def test_list_label_selector_fields_and_null_items(argo: Api, clock: VirtualClock) -> None:
    empty = argo("GET", f"/api/v1/workflows/{NS}").json()
    assert empty["items"] is None
    for name, job in (("l-1", "a"), ("l-2", "b"), ("l-3", "a")):
        argo(
            "POST",
            f"/api/v1/workflows/{NS}",
            json=container_wf(name, labels={"qosflow.dev/job": job}),
        )
        clock.advance(1)
    full = argo("GET", f"/api/v1/workflows/{NS}").json()
    assert errors_of(LIST, full) == []
    assert [w["metadata"]["name"] for w in full["items"]] == ["l-3", "l-2", "l-1"]  # newest first
    selected = argo(
        "GET", f"/api/v1/workflows/{NS}", params={"listOptions.labelSelector": "qosflow.dev/job=a"}
    ).json()
    assert sorted(w["metadata"]["name"] for w in selected["items"]) == ["l-1", "l-3"]
    selected = argo(
        "GET",
        f"/api/v1/workflows/{NS}",
        params={"listOptions.labelSelector": "qosflow.dev/job in (b),!missing"},
    ).json()
    assert [w["metadata"]["name"] for w in selected["items"]] == ["l-2"]
    trimmed = argo(
        "GET",
        f"/api/v1/workflows/{NS}",
        params={"fields": "items.metadata.name,items.status.phase"},
    ).json()
    assert trimmed["items"][0].keys() == {"metadata", "status"}
    assert trimmed["items"][0]["metadata"] == {"name": "l-3"}
    dropped = argo(
        "GET", f"/api/v1/workflows/{NS}/l-1", params={"fields": "-spec,status.nodes"}
    ).json()
    assert (
        "spec" not in dropped
        and "nodes" not in dropped["status"]
        and dropped["metadata"]["name"] == "l-1"
    )
    page = argo("GET", f"/api/v1/workflows/{NS}", params={"listOptions.limit": "2"}).json()
    assert len(page["items"]) == 2 and page["metadata"]["continue"] == "2"
    rest = argo(
        "GET",
        f"/api/v1/workflows/{NS}",
        params={"listOptions.limit": "2", "listOptions.continue": "2"},
    ).json()
    assert [w["metadata"]["name"] for w in rest["items"]] == ["l-1"]


def test_running_and_finished_workflows_validate(argo: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("shape", steps=5))
    clock.advance(1)
    clock.advance(2)
    running = argo("GET", f"/api/v1/workflows/{NS}/shape").json()
    assert errors_of(WORKFLOW, running) == []
    assert running["status"]["phase"] == "Running"
    assert running["metadata"]["labels"]["workflows.argoproj.io/phase"] == "Running"
    assert running["metadata"]["labels"]["workflows.argoproj.io/completed"] == "false"
    assert running["status"]["finishedAt"] is None
    clock.advance(10)
    done = argo("GET", f"/api/v1/workflows/{NS}/shape").json()
    assert errors_of(WORKFLOW, done) == []
    assert done["status"]["phase"] == "Succeeded" and done["status"]["progress"] == "5/5"
    assert {"type": "Completed", "status": "True"} in done["status"]["conditions"]
    assert done["metadata"]["labels"]["workflows.argoproj.io/completed"] == "true"
    assert done["status"]["resourcesDuration"]["cpu"] >= 1


def test_stop_of_completed_workflow_is_500(argo: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("fin", steps=2))
    for _ in range(4):
        clock.advance(1)
    assert argo("GET", f"/api/v1/workflows/{NS}/fin").json()["status"]["phase"] == "Succeeded"
    for action in ("stop", "terminate"):
        response = argo("PUT", f"/api/v1/workflows/{NS}/fin/{action}")
        assert response.status_code == 500
        assert response.json() == {
            "code": 13,
            "message": f'cannot shutdown a completed workflow: workflow: "fin", namespace: "{NS}"',
        }


def test_delete_returns_empty_object_then_404(argo: Api, kube: Api, clock: VirtualClock) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("gone"))
    clock.advance(1)
    assert len(kube("GET", f"/api/v1/namespaces/{NS}/pods").json()["items"]) == 1
    response = argo("DELETE", f"/api/v1/workflows/{NS}/gone")
    assert (response.status_code, response.json()) == (200, {})
    assert argo("DELETE", f"/api/v1/workflows/{NS}/gone").status_code == 404
    assert kube("GET", f"/api/v1/namespaces/{NS}/pods").json()["items"] == []


def test_dry_run_stores_nothing(argo: Api) -> None:
    request = {**container_wf("dry"), "createOptions": {"dryRun": ["All"]}}
    assert argo("POST", f"/api/v1/workflows/{NS}", json=request).status_code == 200
    assert argo("GET", f"/api/v1/workflows/{NS}/dry").status_code == 404


def test_workflow_templates_crud(argo: Api) -> None:
    template = {"metadata": {"name": "tmpl"}, "spec": container_wf("x")["workflow"]["spec"]}
    created = argo("POST", f"/api/v1/workflow-templates/{NS}", json={"template": template})
    assert created.status_code == 200 and errors_of(TEMPLATE, created.json()) == []
    again = argo("POST", f"/api/v1/workflow-templates/{NS}", json={"template": template})
    assert (again.status_code, again.json()["code"]) == (409, 6)
    listed = argo("GET", f"/api/v1/workflow-templates/{NS}").json()
    assert [t["metadata"]["name"] for t in listed["items"]] == ["tmpl"]
    update = {"metadata": {"name": "tmpl"}, "spec": {**template["spec"], "priority": 3}}
    no_version = argo("PUT", f"/api/v1/workflow-templates/{NS}/tmpl", json={"template": update})
    assert no_version.status_code == 400 and "resourceVersion" in no_version.json()["message"]
    update["metadata"]["resourceVersion"] = "1"
    stale = argo("PUT", f"/api/v1/workflow-templates/{NS}/tmpl", json={"template": update})
    assert (stale.status_code, stale.json()["code"]) == (409, 6)
    update["metadata"]["resourceVersion"] = created.json()["metadata"]["resourceVersion"]
    updated = argo("PUT", f"/api/v1/workflow-templates/{NS}/tmpl", json={"template": update})
    assert updated.status_code == 200 and updated.json()["spec"]["priority"] == 3
    assert argo("GET", f"/api/v1/workflow-templates/{NS}/tmpl").json()["spec"]["priority"] == 3
    assert argo("DELETE", f"/api/v1/workflow-templates/{NS}/tmpl").json() == {}
    assert argo("GET", f"/api/v1/workflow-templates/{NS}/tmpl").status_code == 404


def test_template_ref_parameters_are_substituted(argo: Api, kube: Api, clock: VirtualClock) -> None:
    container = {
        "image": "{{workflow.parameters.image}}",
        "command": ["python", "-m", "train", "--steps", "{{workflow.parameters.steps}}"],
        "env": [{"name": "JOB", "value": "{{workflow.parameters.job}}-{{workflow.name}}"}],
    }
    units = "{{inputs.parameters.units}}"  # quantities are parameterised through podSpecPatch
    resources = {"requests": {"cpu": units}, "limits": {"cpu": units}}
    patch = json.dumps({"containers": [{"name": "main", "resources": resources}]})
    template = {
        "metadata": {"name": "train"},
        "spec": {
            "entrypoint": "run",
            "arguments": {
                "parameters": [
                    {"name": "steps", "value": "10"},
                    {"name": "job", "value": "j"},
                    {"name": "image", "value": "img"},
                    {"name": "units", "value": "1"},
                ]
            },
            "templates": [
                {
                    "name": "run",
                    "inputs": {"parameters": [{"name": "units"}]},
                    "container": container,
                    "podSpecPatch": patch,
                }
            ],
        },
    }
    assert (
        argo("POST", f"/api/v1/workflow-templates/{NS}", json={"template": template}).status_code
        == 200
    )
    request = {
        "workflow": {
            "metadata": {"name": "ref-s0"},
            "spec": {
                "workflowTemplateRef": {"name": "train"},
                "arguments": {
                    "parameters": [{"name": "steps", "value": "7"}, {"name": "units", "value": "2"}]
                },
            },
        }
    }
    assert argo("POST", f"/api/v1/workflows/{NS}", json=request).status_code == 200
    clock.advance(1)
    pod = kube("GET", f"/api/v1/namespaces/{NS}/pods/ref-s0").json()
    main = pod["spec"]["containers"][0]
    assert main["command"] == ["python", "-m", "train", "--steps", "7"]
    assert main["image"] == "img" and main["env"] == [{"name": "JOB", "value": "j-ref-s0"}]
    assert main["resources"]["requests"]["cpu"] == "2"
    wf = argo("GET", f"/api/v1/workflows/{NS}/ref-s0").json()
    assert wf["status"]["storedWorkflowTemplateSpec"]["entrypoint"] == "run"
    assert errors_of(WORKFLOW, wf) == []
    missing = {
        "workflow": {
            "metadata": {"name": "ref-x"},
            "spec": {"workflowTemplateRef": {"name": "nope"}},
        }
    }
    response = argo("POST", f"/api/v1/workflows/{NS}", json=missing)
    assert (
        response.status_code == 404
        and response.json()["message"] == 'workflowtemplates.argoproj.io "nope" not found'
    )


def test_submit_from_template(argo: Api, clock: VirtualClock) -> None:
    template = {
        "metadata": {"name": "sub"},
        "spec": {
            **container_wf("x")["workflow"]["spec"],
            "arguments": {"parameters": [{"name": "p", "value": "1"}]},
        },
    }
    argo("POST", f"/api/v1/workflow-templates/{NS}", json={"template": template})
    body = {
        "resourceKind": "WorkflowTemplate",
        "resourceName": "sub",
        "submitOptions": {"name": "sub-1", "parameters": ["p=2"], "labels": "a=b", "priority": 5},
    }
    response = argo("POST", f"/api/v1/workflows/{NS}/submit", json=body)
    assert response.status_code == 200
    wf = response.json()
    assert wf["spec"]["priority"] == 5 and wf["metadata"]["labels"]["a"] == "b"
    assert wf["spec"]["arguments"]["parameters"] == [{"name": "p", "value": "2"}]
    bad = {**body, "submitOptions": {"parameters": ["novalue"]}}
    assert argo("POST", f"/api/v1/workflows/{NS}/submit", json=bad).status_code == 500


def test_wrong_json_types_are_400_like_gos_decoder(
    argo: Api, kube: Api, clock: VirtualClock
) -> None:
    request = container_wf("typed")
    request["workflow"]["spec"]["templates"] = "not-a-list"
    response = argo("POST", f"/api/v1/workflows/{NS}", json=request)
    assert response.status_code == 400
    assert response.json() == {
        "code": 3,
        "message": "json: cannot unmarshal string into Go struct field "
        "WorkflowCreateRequest.workflow.spec.templates of type []struct",
    }
    request = container_wf("typed")
    request["workflow"]["spec"]["templates"][0]["container"]["command"] = "python -c pass"
    assert argo("POST", f"/api/v1/workflows/{NS}", json=request).status_code == 400
    request = container_wf("typed")
    request["workflow"]["spec"]["priority"] = "high"
    assert argo("POST", f"/api/v1/workflows/{NS}", json=request).status_code == 400
    request = container_wf("typed")
    request["workflow"]["spec"]["unknownField"] = {
        "x": 1
    }  # unknown fields are ignored, as upstream
    assert argo("POST", f"/api/v1/workflows/{NS}", json=request).status_code == 200
    clock.advance(1)
    bad = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/typed/resize",
        json={"spec": {"containers": {"main": 1}}},
        headers={"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert bad.status_code == 400 and bad.json()["kind"] == "Status"
