"""Plain objects of the emulated Kubernetes API through the official client and raw HTTP.

ConfigMaps, Secrets, PersistentVolumeClaims, ServiceAccounts, namespaces, the default
StorageClass and the RBAC kinds: the server's fields, 409/404/422/400 with upstream's Status
bodies, optimistic concurrency, patches, deletes, and what survives a restart. Every object
answered is checked against the Kubernetes 1.35 schema (kubernetes-validate, strict).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from qosflow.local import LocalCluster, Script, ScriptedRunner, VirtualClock

from .conftest import NS, Api, errors_of, kube_validator

MERGE = {"Content-Type": "application/merge-patch+json"}
SMP = {"Content-Type": "application/strategic-merge-patch+json"}
RBAC = "rbac.authorization.k8s.io"


def api_client(url: str, token: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = url
    cfg.api_key = {"BearerToken": token, "authorization": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}
    return client.ApiClient(cfg)


@pytest.fixture
def core(cluster: LocalCluster) -> Iterator[client.CoreV1Api]:
    with api_client(cluster.kube_url, cluster.token) as apis:
        yield client.CoreV1Api(apis)


@pytest.fixture
def rbac_api(cluster: LocalCluster) -> Iterator[client.RbacAuthorizationV1Api]:
    with api_client(cluster.kube_url, cluster.token) as apis:
        yield client.RbacAuthorizationV1Api(apis)


def status_of(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.value.body)
    assert body["kind"] == "Status" and body["status"] == "Failure"
    assert body["code"] == exc.value.status
    return body


def valid(doc: dict[str, Any], kind: str, api_version: str = "v1") -> dict[str, Any]:
    assert errors_of(kube_validator(kind, api_version), doc) == []
    return doc


def test_config_map_crud_through_the_client(kube: Api, core: client.CoreV1Api) -> None:
    body = {"metadata": {"name": "cfg", "labels": {"app": "q"}}, "data": {"a.txt": "one"}}
    created = core.create_namespaced_config_map(NS, body)
    assert created.metadata.uid and created.metadata.resource_version
    assert created.metadata.creation_timestamp is not None and created.data == {"a.txt": "one"}
    with pytest.raises(ApiException) as again:
        core.create_namespaced_config_map(NS, body)
    assert again.value.status == 409
    assert status_of(again)["message"] == 'configmaps "cfg" already exists'
    assert status_of(again)["details"] == {"name": "cfg", "kind": "configmaps"}
    read = kube("GET", f"/api/v1/namespaces/{NS}/configmaps/cfg").json()
    valid(read, "ConfigMap")
    patched = core.patch_namespaced_config_map("cfg", NS, {"data": {"b": "two"}})
    assert patched.data == {"a.txt": "one", "b": "two"}
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    selected = core.list_namespaced_config_map(NS, label_selector="app=q")
    assert [c.metadata.name for c in selected.items] == ["cfg"]
    listed = kube("GET", "/api/v1/configmaps").json()
    assert listed["kind"] == "ConfigMapList" and listed["apiVersion"] == "v1"
    assert listed["metadata"]["resourceVersion"]
    valid(listed, "ConfigMapList")
    deleted = kube("DELETE", f"/api/v1/namespaces/{NS}/configmaps/cfg").json()
    assert deleted["status"] == "Success" and deleted["details"]["uid"] == created.metadata.uid
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("cfg", NS)
    assert gone.value.status == 404 and status_of(gone)["message"] == 'configmaps "cfg" not found'
    assert status_of(gone)["reason"] == "NotFound"


def test_a_stale_resource_version_is_a_conflict(kube: Api) -> None:
    path = f"/api/v1/namespaces/{NS}/configmaps"
    first = kube("POST", path, json={"metadata": {"name": "c"}, "data": {"k": "1"}}).json()
    second = kube("PUT", f"{path}/c", json={**first, "data": {"k": "2"}})
    assert second.status_code == 200 and second.json()["data"] == {"k": "2"}
    stale = kube("PUT", f"{path}/c", json={**first, "data": {"k": "3"}})
    assert stale.status_code == 409 and stale.json()["reason"] == "Conflict"
    assert stale.json()["message"] == (
        'Operation cannot be fulfilled on configmaps "c": the object has been modified; please '
        "apply your changes to the latest version and try again"
    )
    stale_patch = kube(
        "PATCH",
        f"{path}/c",
        json={"metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}},
        headers=MERGE,
    )
    assert stale_patch.status_code == 409
    unchanged = kube("PUT", f"{path}/c", json=second.json())
    assert (
        unchanged.json()["metadata"]["resourceVersion"]
        == (second.json()["metadata"]["resourceVersion"])
    )  # an update that changes nothing writes nothing
    renamed = kube("PUT", f"{path}/c", json={**second.json(), "metadata": {"name": "d"}})
    assert renamed.status_code == 400
    assert "does not match the name on the URL (c)" in renamed.json()["message"]
    assert kube("PUT", f"{path}/missing", json={"metadata": {"name": "missing"}}).status_code == 404


def test_config_map_validation_is_422_with_causes(kube: Api) -> None:
    path = f"/api/v1/namespaces/{NS}/configmaps"
    bad = kube("POST", path, json={"metadata": {"name": "Bad_Name"}, "data": {"bad key": "x"}})
    assert bad.status_code == 422 and bad.json()["reason"] == "Invalid"
    details = bad.json()["details"]
    assert details["kind"] == "ConfigMap" and details["name"] == "Bad_Name"
    assert [c["field"] for c in details["causes"]] == ["metadata.name"]
    keys = kube("POST", path, json={"metadata": {"name": "k"}, "data": {"bad key": "x"}})
    assert keys.status_code == 422
    assert keys.json()["details"]["causes"][0]["field"] == "data[bad key]"
    assert "a valid config key must consist of alphanumeric" in keys.json()["message"]
    typed = kube("POST", path, json={"metadata": {"name": "t"}, "data": {"n": 1}})
    assert typed.status_code == 400
    assert typed.json()["message"].startswith(
        'ConfigMap in version "v1" cannot be handled as a ConfigMap: json: cannot unmarshal number'
    )
    nameless = kube("POST", path, json={"data": {}})
    assert nameless.status_code == 422
    assert nameless.json()["details"]["causes"] == [
        {
            "reason": "FieldValueRequired",
            "message": "Required value: name or generateName is required",
            "field": "metadata.name",
        }
    ]
    other_ns = kube("POST", path, json={"metadata": {"name": "o", "namespace": "elsewhere"}})
    assert other_ns.status_code == 400
    generated = kube("POST", path, json={"metadata": {"generateName": "gen-"}}).json()
    assert generated["metadata"]["name"].startswith("gen-")
    assert len(generated["metadata"]["name"]) == len("gen-") + 5
    frozen = kube(
        "POST", path, json={"metadata": {"name": "f"}, "data": {"a": "1"}, "immutable": True}
    )
    change = kube("PATCH", f"{path}/f", json={"data": {"a": "2"}}, headers=MERGE)
    assert frozen.status_code == 201 and change.status_code == 422
    assert "field is immutable when `immutable` is set" in change.json()["message"]


def test_secret_string_data_is_merged_base64_and_never_stored(
    kube: Api, core: client.CoreV1Api, cluster: LocalCluster
) -> None:
    body = {
        "metadata": {"name": "creds"},
        "data": {"user": base64.b64encode(b"alice").decode()},
        "stringData": {"password": "s3cret"},
    }
    created = core.create_namespaced_secret(NS, body)
    assert created.type == "Opaque"
    assert created.data == {"user": "YWxpY2U=", "password": base64.b64encode(b"s3cret").decode()}
    read = valid(kube("GET", f"/api/v1/namespaces/{NS}/secrets/creds").json(), "Secret")
    assert "stringData" not in read
    with cluster.store.lock:
        stored = cluster.store.get("Secret", NS, "creds")
        assert stored is not None and "stringData" not in stored
        assert base64.b64decode(stored["data"]["password"]) == b"s3cret"
    updated = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/secrets/creds",
        json={"stringData": {"user": "bob"}},
        headers=MERGE,
    ).json()
    assert base64.b64decode(updated["data"]["user"]) == b"bob" and "stringData" not in updated
    retype = kube(
        "PATCH", f"/api/v1/namespaces/{NS}/secrets/creds", json={"type": "x/y"}, headers=MERGE
    )
    assert (
        retype.status_code == 422
        and 'type: Invalid value: "x/y": field is immutable' in (retype.json()["message"])
    )


def test_secret_data_must_be_base64_and_typed_secrets_need_their_keys(kube: Api) -> None:
    path = f"/api/v1/namespaces/{NS}/secrets"
    raw = kube("POST", path, json={"metadata": {"name": "raw"}, "data": {"k": "not base64!"}})
    assert raw.status_code == 400 and raw.json()["reason"] == "BadRequest"
    assert raw.json()["message"] == (
        'Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte 3'
    )
    tls = kube("POST", path, json={"metadata": {"name": "tls"}, "type": "kubernetes.io/tls"})
    assert tls.status_code == 422
    assert [c["field"] for c in tls.json()["details"]["causes"]] == [
        "data[tls.crt]",
        "data[tls.key]",
    ]
    assert kube("GET", f"{path}/raw").status_code == 404
    listed = kube("GET", path, params={"fieldSelector": "type=Opaque"}).json()
    assert listed["kind"] == "SecretList" and listed["items"] == []


def test_a_claim_is_bound_at_once_by_the_default_class(kube: Api, core: client.CoreV1Api) -> None:
    body = {
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}},
    }
    created = kube("POST", f"/api/v1/namespaces/{NS}/persistentvolumeclaims", json=body)
    assert created.status_code == 201
    doc = valid(created.json(), "PersistentVolumeClaim")
    assert doc["status"] == {"phase": "Pending"}  # as created; the provisioner binds it next
    assert doc["spec"]["storageClassName"] == "local-folder"
    assert doc["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"]
    claim = core.read_namespaced_persistent_volume_claim("data", NS)
    assert claim.status.phase == "Bound"
    assert claim.spec.volume_name == f"pvc-{claim.metadata.uid}"
    assert claim.status.capacity == {"storage": "2Gi"}
    assert claim.status.access_modes == ["ReadWriteOnce"]
    grow = kube(
        "PATCH",
        f"/api/v1/namespaces/{NS}/persistentvolumeclaims/data",
        json={"spec": {"resources": {"requests": {"storage": "3Gi"}}}},
        headers=SMP,
    )
    assert grow.status_code == 422 and "must support resize" in grow.json()["message"]
    deleted = kube("DELETE", f"/api/v1/namespaces/{NS}/persistentvolumeclaims/data").json()
    assert deleted["kind"] == "PersistentVolumeClaim" and deleted["metadata"]["deletionTimestamp"]


def test_a_claim_needs_modes_and_a_storage_request(kube: Api) -> None:
    path = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
    empty = kube("POST", path, json={"metadata": {"name": "e"}, "spec": {}})
    assert empty.status_code == 422
    assert [c["field"] for c in empty.json()["details"]["causes"]] == [
        "spec.accessModes",
        "spec.resources[storage]",
    ]
    odd = {"accessModes": ["ReadWriteSometimes"], "resources": {"requests": {"storage": "abc"}}}
    assert kube("POST", path, json={"metadata": {"name": "o"}, "spec": odd}).status_code == 400
    other = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": "fast-ssd",
    }
    kube("POST", path, json={"metadata": {"name": "elsewhere"}, "spec": other})
    pending = kube("GET", f"{path}/elsewhere").json()
    assert pending["status"]["phase"] == "Pending" and "volumeName" not in pending["spec"]


def test_namespaces_and_the_default_storage_class(kube: Api, core: client.CoreV1Api) -> None:
    names = [n.metadata.name for n in core.list_namespace().items]
    assert {"default", "kube-system", NS} <= set(names) and names == sorted(names)
    ns = valid(kube("GET", f"/api/v1/namespaces/{NS}").json(), "Namespace")
    assert ns["status"]["phase"] == "Active"
    assert ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == NS
    created = core.create_namespace({"metadata": {"name": "team-a"}})
    assert created.status.phase == "Active"
    with pytest.raises(ApiException) as exists:
        core.create_namespace({"metadata": {"name": "team-a"}})
    assert exists.value.status == 409
    with pytest.raises(ApiException) as bad:
        core.create_namespace({"metadata": {"name": "Team_A"}})
    assert bad.value.status == 422
    missing = kube("GET", "/api/v1/namespaces/nope")
    assert missing.status_code == 404 and missing.json()["message"] == 'namespaces "nope" not found'
    kube("POST", "/api/v1/namespaces/team-b/configmaps", json={"metadata": {"name": "c"}})
    assert kube("GET", "/api/v1/namespaces/team-b").json()["status"]["phase"] == "Active"
    classes = kube("GET", "/apis/storage.k8s.io/v1/storageclasses").json()
    assert [c["metadata"]["name"] for c in classes["items"]] == ["local-folder"]
    local = valid(classes["items"][0], "StorageClass", "storage.k8s.io/v1")
    assert local["metadata"]["annotations"] == {
        "storageclass.kubernetes.io/is-default-class": "true"
    }
    assert local["provisioner"] == "qosflow.dev/local-folder"
    assert kube("GET", "/apis/storage.k8s.io/v1/storageclasses/fast").status_code == 404


def test_rbac_objects_through_the_client(
    rbac_api: client.RbacAuthorizationV1Api, kube: Api
) -> None:
    role = {
        "metadata": {"name": "reader"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get"]}],
    }
    created = rbac_api.create_namespaced_role(NS, role)
    assert created.rules[0].resources == ["pods", "pods/log"]
    binding = {
        "metadata": {"name": "reader"},
        "roleRef": {"kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot"}, {"kind": "User", "name": "ann"}],
    }
    made = kube("POST", f"/apis/{RBAC}/v1/namespaces/{NS}/rolebindings", json=binding).json()
    valid(made, "RoleBinding", f"{RBAC}/v1")
    assert made["roleRef"]["apiGroup"] == RBAC and made["subjects"][1]["apiGroup"] == RBAC
    moved = kube(
        "PATCH",
        f"/apis/{RBAC}/v1/namespaces/{NS}/rolebindings/reader",
        json={"roleRef": {"kind": "ClusterRole", "name": "view"}},
        headers=MERGE,
    )
    assert moved.status_code == 422 and "cannot change roleRef" in moved.json()["message"]
    cluster_role = {
        "metadata": {"name": "system:reader"},  # RBAC names are path segments
        "rules": [{"verbs": ["get"], "nonResourceURLs": ["/metrics"]}],
    }
    assert rbac_api.create_cluster_role(cluster_role).metadata.name == "system:reader"
    names = [r.metadata.name for r in rbac_api.list_cluster_role().items]
    assert {"cluster-admin", "system:basic-user", "system:reader"} <= set(names)
    unbound = {
        "metadata": {"name": "x"},
        "roleRef": {"kind": "ClusterRole", "name": "system:reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot"}],
    }
    with pytest.raises(ApiException) as no_ns:
        rbac_api.create_cluster_role_binding(unbound)
    assert no_ns.value.status == 422
    assert status_of(no_ns)["details"]["causes"][0]["field"] == "subjects[0].namespace"
    deleted = kube("DELETE", f"/apis/{RBAC}/v1/clusterroles/system:reader").json()
    assert deleted["details"] == {
        "name": "system:reader",
        "group": RBAC,
        "kind": "clusterroles",
        "uid": deleted["details"]["uid"],
    }


def test_rbac_rules_are_validated(kube: Api) -> None:
    roles = f"/apis/{RBAC}/v1/namespaces/{NS}/roles"
    bad = {
        "metadata": {"name": "bad"},
        "rules": [{"resources": ["pods"]}, {"verbs": ["get"], "nonResourceURLs": ["/x"]}],
    }
    answer = kube("POST", roles, json=bad)
    assert answer.status_code == 422
    assert [c["field"] for c in answer.json()["details"]["causes"]] == [
        "rules[0].verbs",
        "rules[0].apiGroups",
        "rules[1].nonResourceURLs",
    ]
    assert answer.json()["message"].startswith('Role.rbac.authorization.k8s.io "bad" is invalid: [')
    put = kube(
        "PUT", f"{roles}/made-by-put", json={"metadata": {"name": "made-by-put"}, "rules": []}
    )
    assert put.status_code == 201  # RBAC objects are created by an update


def test_objects_and_tokens_survive_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with LocalCluster(
        cpus=1, state_dir=state, clock=VirtualClock(), runner=ScriptedRunner(default=Script())
    ) as first:
        kube = Api(first.kube_url, first.token)
        kube("POST", f"/api/v1/namespaces/{NS}/secrets", json={"metadata": {"name": "s"}})
        kube("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", json={"metadata": {"name": "sa"}})
        token = first.token_for(NS, "sa")
        uid = kube("GET", f"/api/v1/namespaces/{NS}/secrets/s").json()["metadata"]["uid"]
    assert token not in (state / "state.json").read_text()
    assert not (state / "quarantine.json").exists()
    with LocalCluster(
        cpus=1, state_dir=state, clock=VirtualClock(), runner=ScriptedRunner(default=Script())
    ) as second:
        kube = Api(second.kube_url, second.token)
        assert kube("GET", f"/api/v1/namespaces/{NS}/secrets/s").json()["metadata"]["uid"] == uid
        review = Api(second.kube_url, token)(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", json={}
        )
        assert review.status_code == 201
        assert review.json()["status"]["userInfo"]["username"] == f"system:serviceaccount:{NS}:sa"


MALFORMED: list[Any] = [
    [],
    "x",
    {"metadata": []},
    {"metadata": {"name": 5}},
    {"metadata": {"name": "a", "labels": {"k": 5}}},
    {"metadata": {"name": "a", "finalizers": "x"}},
    {"metadata": {"name": "a"}, "data": {"k": None}},
    {"metadata": {"name": "a"}, "spec": None, "roleRef": None, "rules": [1]},
    {"metadata": {"name": "a"}, "spec": {"resources": [], "accessModes": "x"}},
    {"metadata": {"name": "a"}, "roleRef": {"kind": "Role", "name": "x"}, "subjects": [1]},
    {"spec": {"resourceAttributes": {"verb": 5}}},
]
PLAIN_PATHS = [
    f"/api/v1/namespaces/{NS}/configmaps",
    f"/api/v1/namespaces/{NS}/secrets",
    f"/api/v1/namespaces/{NS}/persistentvolumeclaims",
    f"/api/v1/namespaces/{NS}/serviceaccounts",
    "/api/v1/namespaces",
    f"/apis/{RBAC}/v1/namespaces/{NS}/roles",
    f"/apis/{RBAC}/v1/clusterrolebindings",
    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
    f"/api/v1/namespaces/{NS}/serviceaccounts/default/token",
]


@pytest.mark.parametrize("path", PLAIN_PATHS)
def test_malformed_bodies_are_answered_never_a_500(kube: Api, path: str) -> None:
    for body in MALFORMED:
        answer = kube("POST", path, data=json.dumps(body))
        assert answer.status_code < 500, (body, answer.text)
        assert answer.json()["kind"] != "Status" or answer.json()["code"] == answer.status_code
