"""ServiceAccount tokens and RBAC: SelfSubjectAccessReview and per-request enforcement on both APIs.

The admin token may do everything (``system:masters``); a ServiceAccount token may do what the
stored Roles and ClusterRoles bound to it allow, and nothing else: the Kubernetes API answers 403
with upstream's Status, the Argo Server ``{"code": 7, ...}`` with the message the real server
relays. The SelfSubjectAccessReview answers with the same authorizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from qosflow.local import LocalCluster, VirtualClock

from .conftest import NS, Api, container_wf, errors_of, kube_validator, pod_of
from .test_objects import api_client

RBAC = "rbac.authorization.k8s.io"
ROLES = f"/apis/{RBAC}/v1/namespaces/{NS}/roles"
BINDINGS = f"/apis/{RBAC}/v1/namespaces/{NS}/rolebindings"
SA_USER = f"system:serviceaccount:{NS}:bot"
SMP = {"Content-Type": "application/strategic-merge-patch+json"}


def grant(kube: Api, name: str, rules: list[dict[str, Any]], *, account: str = "bot") -> None:
    """A Role ``name`` with ``rules``, bound to the ServiceAccount ``account``."""
    assert kube("POST", ROLES, json={"metadata": {"name": name}, "rules": rules}).status_code == 201
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NS}],
    }
    assert kube("POST", BINDINGS, json=binding).status_code == 201


@pytest.fixture
def bot(cluster: LocalCluster, kube: Api) -> str:
    """The token of a ServiceAccount ``bot`` with no rights yet."""
    created = kube(
        "POST", f"/api/v1/namespaces/{NS}/serviceaccounts", json={"metadata": {"name": "bot"}}
    )
    assert created.status_code == 201
    return cluster.token_for(NS, "bot")


@pytest.fixture
def authz(cluster: LocalCluster, bot: str) -> Iterator[client.AuthorizationV1Api]:
    """The authorization API as the ``bot`` ServiceAccount."""
    with api_client(cluster.kube_url, bot) as apis:
        yield client.AuthorizationV1Api(apis)


def can_i(authz: client.AuthorizationV1Api, verb: str, resource: str, **attrs: str) -> Any:
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=attrs.pop("namespace", NS), verb=verb, resource=resource, **attrs
            )
        )
    )
    return authz.create_self_subject_access_review(review).status


def test_the_admin_may_do_everything(cluster: LocalCluster) -> None:
    with api_client(cluster.kube_url, cluster.token) as apis:
        review = client.AuthorizationV1Api(apis).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}}
        )
    assert review.status.allowed is True
    who = requests.post(
        f"{cluster.kube_url}/apis/authentication.k8s.io/v1/selfsubjectreviews",
        headers={"Authorization": f"Bearer {cluster.token}"},
        json={},
        timeout=10,
    ).json()
    assert "system:masters" in who["status"]["userInfo"]["groups"]


def test_access_review_follows_rules_names_and_subresources(
    kube: Api, bot: str, authz: client.AuthorizationV1Api
) -> None:
    assert can_i(authz, "get", "pods").allowed is False
    grant(
        kube,
        "qosflow",
        [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
            {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]},
            {
                "apiGroups": ["argoproj.io"],
                "resources": ["workflowtemplates"],
                "verbs": ["get", "update"],
                "resourceNames": ["qosflow-train"],
            },
            {"apiGroups": ["*"], "resources": ["*/log"], "verbs": ["get"]},
        ],
    )
    allowed = can_i(authz, "get", "pods", name="p")
    assert allowed.allowed is True
    assert allowed.reason == (
        f'RBAC: allowed by RoleBinding "qosflow/{NS}" of Role "qosflow" to ServiceAccount "bot/{NS}"'
    )
    assert can_i(authz, "patch", "pods", subresource="resize", name="p").allowed is True
    assert can_i(authz, "patch", "pods", name="p").allowed is False  # pods/resize is not pods
    assert can_i(authz, "get", "pods", subresource="log").allowed is True  # */log
    tmpl = {"group": "argoproj.io"}
    assert can_i(authz, "get", "workflowtemplates", name="qosflow-train", **tmpl).allowed is True
    assert can_i(authz, "get", "workflowtemplates", name="other", **tmpl).allowed is False
    assert can_i(authz, "list", "workflowtemplates", **tmpl).allowed is False  # names never list
    assert can_i(authz, "get", "pods", namespace="elsewhere").allowed is False
    raw = Api(kube.base, bot)(
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        json={
            "spec": {"resourceAttributes": {"namespace": NS, "verb": "list", "resource": "pods"}}
        },
    )
    assert raw.status_code == 201  # the raw answer, as the client received it
    body = raw.json()
    assert (
        errors_of(kube_validator("SelfSubjectAccessReview", "authorization.k8s.io/v1"), body) == []
    )
    assert body["metadata"] == {} and body["status"]["allowed"] is True


def test_cluster_roles_bind_cluster_wide_or_per_namespace(
    kube: Api, authz: client.AuthorizationV1Api
) -> None:
    nodes = {
        "metadata": {"name": "nodes"},
        "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list"]}],
    }
    assert kube("POST", f"/apis/{RBAC}/v1/clusterroles", json=nodes).status_code == 201
    per_ns = {
        "metadata": {"name": "nodes-here"},
        "roleRef": {"kind": "ClusterRole", "name": "nodes"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot"}],  # the binding's namespace
    }
    assert kube("POST", BINDINGS, json=per_ns).status_code == 201
    assert can_i(authz, "list", "pods").allowed is True
    assert can_i(authz, "list", "pods", namespace="").allowed is False
    assert can_i(authz, "list", "nodes", namespace="").allowed is False
    everywhere = {
        "metadata": {"name": "nodes"},
        "roleRef": {"kind": "ClusterRole", "name": "nodes"},
        "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}],
    }
    assert kube("POST", f"/apis/{RBAC}/v1/clusterrolebindings", json=everywhere).status_code == 201
    status = can_i(authz, "list", "nodes", namespace="")
    assert status.allowed is True
    assert status.reason == (
        'RBAC: allowed by ClusterRoleBinding "nodes" of ClusterRole "nodes" to Group '
        '"system:serviceaccounts"'
    )


def test_a_binding_to_a_missing_role_says_so(kube: Api, authz: client.AuthorizationV1Api) -> None:
    binding = {
        "metadata": {"name": "dangling"},
        "roleRef": {"kind": "Role", "name": "not-yet"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot"}],
    }
    kube("POST", BINDINGS, json=binding)
    status = can_i(authz, "get", "pods")
    assert status.allowed is False
    assert status.reason == 'RBAC: role.rbac.authorization.k8s.io "not-yet" not found'


def test_a_token_is_refused_what_its_role_lacks_until_a_binding_grants_it(
    cluster: LocalCluster, argo: Api, kube: Api, bot: str, clock: VirtualClock
) -> None:
    argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("rs", cpu="1"))
    clock.advance(1)
    pod = pod_of(kube, "rs")["metadata"]["name"]
    as_bot = Api(cluster.kube_url, bot)
    grant(
        kube,
        "reader",
        [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}],
    )
    assert as_bot("GET", f"/api/v1/namespaces/{NS}/pods/{pod}").status_code == 200
    body = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "resources": {
                        "requests": {"cpu": "2", "memory": "64Mi"},
                        "limits": {"cpu": "2", "memory": "64Mi"},
                    },
                }
            ]
        }
    }
    resize = f"/api/v1/namespaces/{NS}/pods/{pod}/resize"
    refused = as_bot("PATCH", resize, json=body, headers=SMP)
    assert refused.status_code == 403
    assert refused.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": (
            f'pods "{pod}" is forbidden: User "{SA_USER}" cannot patch resource "pods/resize" '
            f'in API group "" in the namespace "{NS}"'
        ),
        "reason": "Forbidden",
        "details": {"name": pod, "kind": "pods"},
        "code": 403,
    }
    grant(kube, "resizer", [{"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["patch"]}])
    done = as_bot("PATCH", resize, json=body, headers=SMP)
    assert done.status_code == 200
    assert done.json()["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "2"
    cluster_scope = as_bot("GET", "/api/v1/nodes")
    assert cluster_scope.status_code == 403 and cluster_scope.json()["message"] == (
        f'nodes is forbidden: User "{SA_USER}" cannot list resource "nodes" in API group "" at '
        "the cluster scope"
    )
    assert as_bot("GET", "/version").status_code == 200  # discovery is for every user
    assert as_bot("GET", "/metrics").json()["message"] == (
        f'forbidden: User "{SA_USER}" cannot get path "/metrics"'
    )


def test_the_argo_server_relays_the_denials_with_code_7(
    cluster: LocalCluster, argo: Api, kube: Api, bot: str
) -> None:
    as_bot = Api(cluster.argo_url, bot)
    listed = as_bot("GET", f"/api/v1/workflows/{NS}")
    assert listed.status_code == 403 and listed.json() == {
        "code": 7,
        "message": (
            f'Permission denied, you are not allowed to list workflows in namespace "{NS}". '
            f"Maybe you want to specify a namespace with query parameter `.namespace={NS}`?"
        ),
    }
    assert listed.headers["Grpc-Metadata-Argo-Version"] == "v4.1.2"
    created = as_bot("POST", f"/api/v1/workflows/{NS}", json=container_wf("w1"))
    assert created.status_code == 403 and created.json()["message"] == (
        f'workflows.argoproj.io is forbidden: User "{SA_USER}" cannot create resource '
        f'"workflows" in API group "argoproj.io" in the namespace "{NS}"'
    )
    template = as_bot("GET", f"/api/v1/workflow-templates/{NS}/qosflow-train")
    assert template.json() == {"code": 7, "message": "permission denied"}
    grant(
        kube,
        "runner",
        [
            {
                "apiGroups": ["argoproj.io"],
                "resources": ["workflows"],
                "verbs": ["create", "get", "list"],
            }
        ],
    )
    assert as_bot("POST", f"/api/v1/workflows/{NS}", json=container_wf("w1")).status_code == 200
    assert as_bot("GET", f"/api/v1/workflows/{NS}/w1").status_code == 200
    stop = as_bot("PUT", f"/api/v1/workflows/{NS}/w1/stop", json={})
    assert stop.status_code == 403 and 'cannot patch resource "workflows"' in stop.json()["message"]
    watch = as_bot("GET", f"/api/v1/workflow-events/{NS}")
    assert (
        watch.status_code == 403 and 'cannot watch resource "workflows"' in watch.json()["message"]
    )
    assert as_bot("GET", "/api/v1/version").status_code == 200
    assert Api(cluster.argo_url, "nonsense")("GET", "/api/v1/version").status_code == 401


def test_token_request_expiry_and_deletion(
    cluster: LocalCluster, kube: Api, bot: str, clock: VirtualClock
) -> None:
    with api_client(cluster.kube_url, cluster.token) as apis:
        core = client.CoreV1Api(apis)
        made = core.create_namespaced_service_account_token(
            "bot", NS, {"spec": {"expirationSeconds": 600}}
        )
        with pytest.raises(ApiException) as missing:
            core.create_namespaced_service_account_token("ghost", NS, {"spec": {}})
        with pytest.raises(ApiException) as short:
            core.create_namespaced_service_account_token(
                "bot", NS, {"spec": {"expirationSeconds": 60}}
            )
    assert made.status.token and made.spec.expiration_seconds == 600
    assert made.spec.audiences == ["https://kubernetes.default.svc.cluster.local"]
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["message"] == 'serviceaccounts "ghost" not found'
    assert short.value.status == 422
    assert (
        "may not specify a duration less than 10 minutes" in json.loads(short.value.body)["message"]
    )
    short_lived = Api(cluster.kube_url, made.status.token)
    whoami = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    assert short_lived("POST", whoami, json={}).status_code == 201
    clock.advance(601)
    expired = short_lived("POST", whoami, json={})
    assert expired.status_code == 401 and expired.json()["reason"] == "Unauthorized"
    assert Api(cluster.kube_url, bot)("POST", whoami, json={}).status_code == 201
    kube("DELETE", f"/api/v1/namespaces/{NS}/serviceaccounts/bot")
    kube("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", json={"metadata": {"name": "bot"}})
    assert Api(cluster.kube_url, bot)("POST", whoami, json={}).status_code == 401  # new uid
    assert Api(cluster.argo_url, bot)("GET", "/api/v1/version").status_code == 401


def test_a_token_cannot_grant_what_it_does_not_hold(
    cluster: LocalCluster, kube: Api, bot: str
) -> None:
    grant(
        kube,
        "rbac-writer",
        [{"apiGroups": [RBAC], "resources": ["roles", "rolebindings"], "verbs": ["create"]}],
    )
    as_bot = Api(cluster.kube_url, bot)
    wide = {
        "metadata": {"name": "wide"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
    }
    refused = as_bot("POST", ROLES, json=wide)
    assert refused.status_code == 403
    assert refused.json()["message"].startswith(
        f'roles.rbac.authorization.k8s.io "wide" is forbidden: user "{SA_USER}" (groups=['
    )
    assert (
        'is attempting to grant RBAC permissions not currently held:\n{APIGroups:[""], Resources:["secrets"], Verbs:["get"]}'
        in refused.json()["message"]
    )
    held = {
        "metadata": {"name": "held"},
        "rules": [{"apiGroups": [RBAC], "resources": ["roles"], "verbs": ["create"]}],
    }
    assert as_bot("POST", ROLES, json=held).status_code == 201


def test_rules_review_lists_what_a_token_may_do(cluster: LocalCluster, kube: Api, bot: str) -> None:
    grant(kube, "reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])
    with api_client(cluster.kube_url, bot) as apis:
        rules = (
            client.AuthorizationV1Api(apis)
            .create_self_subject_rules_review({"spec": {"namespace": NS}})
            .status
        )
    mine = rules.resource_rules[-1]
    assert (mine.verbs, mine.api_groups, mine.resources) == (["get"], [""], ["pods"])
    assert any("/version" in r.non_resource_urls for r in rules.non_resource_rules)
    assert rules.incomplete is False


def test_kubernetes_1_32_has_no_resize_subresource(
    tmp_path: Any, clock: VirtualClock, runner: Any
) -> None:
    with LocalCluster(
        cpus=2, state_dir=tmp_path / "old", clock=clock, runner=runner, kubernetes_version="1.32"
    ) as old:
        kube, argo = Api(old.kube_url, old.token), Api(old.argo_url, old.token)
        version = kube("GET", "/version").json()
        assert (version["major"], version["minor"]) == ("1", "32")
        assert "emulationMinor" not in version
        argo("POST", f"/api/v1/workflows/{NS}", json=container_wf("old"))
        clock.advance(1)
        pod = pod_of(kube, "old")["metadata"]["name"]
        body = {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}]}}
        missing = kube(
            "PATCH", f"/api/v1/namespaces/{NS}/pods/{pod}/resize", json=body, headers=SMP
        )
        assert missing.status_code == 404
        assert missing.json() == {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "the server could not find the requested resource",
            "reason": "NotFound",
            "details": {},
            "code": 404,
        }
        review = kube(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json={"spec": {"nonResourceAttributes": {"verb": "get", "path": "/version"}}},
        )
        assert review.json()["metadata"] == {"creationTimestamp": None}  # before 1.34
    with pytest.raises(Exception, match="kubernetes_version"):
        LocalCluster(state_dir=tmp_path / "bad", kubernetes_version="2.0")
