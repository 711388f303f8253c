"""Fixtures of the local-cluster tests: a virtual-clock cluster with scripted pods, HTTP clients
and validators for the Argo (schema.json / swagger.json) and Kubernetes (kubernetes-validate)
shapes."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import requests
from jsonschema import Draft4Validator, Draft202012Validator
from referencing import Registry, Resource

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock

SCHEMAS = Path(str(files("qosflow_argo") / "schemas"))  # the copies packaged with qosflow_argo
NS = "qosflow"


@functools.cache
def _argo_schema() -> dict[str, Any]:
    root = json.loads((SCHEMAS / "schema.json").read_text())
    schema = {k: v for k, v in root.items() if k != "oneOf"}
    defs = schema["definitions"]
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["string", "integer"]}
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["string", "number"]}
    defs["io.k8s.apimachinery.pkg.apis.meta.v1.Time"] = {
        "type": ["string", "null"],
        "format": "date-time",
    }
    return schema


def argo_validator(definition: str) -> Draft202012Validator:
    schema = dict(_argo_schema())
    schema["$ref"] = f"#/definitions/io.argoproj.workflow.v1alpha1.{definition}"
    return Draft202012Validator(schema)


@functools.cache
def _swagger() -> dict[str, Any]:
    swagger = json.loads((SCHEMAS / "swagger.json").read_text())
    defs = swagger["definitions"]
    defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {"type": ["string", "integer"]}
    defs["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {"type": ["string", "number"]}
    defs["io.k8s.apimachinery.pkg.apis.meta.v1.Time"] = {"type": ["string", "null"]}
    return swagger


def swagger_validator(definition: str) -> Draft4Validator:
    return Draft4Validator(
        {"$ref": f"#/definitions/{definition}", "definitions": _swagger()["definitions"]}
    )


@functools.cache
def kube_validator(kind: str, api_version: str = "v1") -> Draft202012Validator:
    base = files("kubernetes_validate") / "kubernetes-json-schema" / "v1.35.0-local-strict"
    defs = Resource.from_contents(json.loads((base / "_definitions.json").read_text()))
    stem = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = json.loads((base / f"{kind.lower()}-{stem}.json").read_text())
    return Draft202012Validator(
        schema, registry=Resource.from_contents(schema) @ (defs @ Registry())
    )


def errors_of(validator: Any, doc: Any) -> list[str]:
    return [
        "/".join(map(str, e.absolute_path)) + ": " + e.message for e in validator.iter_errors(doc)
    ]


class Api:
    """A tiny authenticated HTTP client for one listener."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def __call__(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        return self.session.request(method, self.base + path, timeout=10, **kwargs)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def runner() -> ScriptedRunner:
    return ScriptedRunner(default=Script())


@pytest.fixture
def cluster(tmp_path: Path, clock: VirtualClock, runner: ScriptedRunner) -> Iterator[LocalCluster]:
    with LocalCluster(
        cpus=2, state_dir=tmp_path / "state", clock=clock, runner=runner, grace_s=30
    ) as c:
        yield c


@pytest.fixture
def argo(cluster: LocalCluster) -> Api:
    return Api(cluster.argo_url, cluster.token)


@pytest.fixture
def kube(cluster: LocalCluster) -> Api:
    return Api(cluster.kube_url, cluster.token)


def container_wf(
    name: str,
    cpu: str = "1",
    *,
    labels: dict[str, str] | None = None,
    priority: int | None = None,
    priority_class: str | None = None,
    command: list[str] | None = None,
    steps: int = 20,
) -> dict[str, Any]:
    """A WorkflowCreateRequest with one container template."""
    container: dict[str, Any] = {
        "image": "ignored:latest",
        "command": command or ["python", "-c", "pass"],
        "resources": {
            "requests": {"cpu": cpu, "memory": "64Mi"},
            "limits": {"cpu": cpu, "memory": "64Mi"},
        },
        "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
    }
    if steps:
        container["env"] = [{"name": "QOSFLOW_TOTAL_STEPS", "value": str(steps)}]
    spec: dict[str, Any] = {
        "entrypoint": "main",
        "templates": [{"name": "main", "container": container}],
    }
    if priority is not None:
        spec["priority"] = priority
    if priority_class is not None:
        spec["podPriorityClassName"] = priority_class
    return {
        "workflow": {
            "metadata": {"name": name, "labels": labels or {"qosflow.dev/job": name}},
            "spec": spec,
        }
    }


def pod_of(kube: Api, workflow: str) -> dict[str, Any]:
    items = kube(
        "GET",
        f"/api/v1/namespaces/{NS}/pods",
        params={"labelSelector": f"workflows.argoproj.io/workflow={workflow}"},
    ).json()["items"]
    assert len(items) >= 1, f"no pod for {workflow}"
    return items[-1]
