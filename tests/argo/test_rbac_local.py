"""qosflow's shipped RBAC on the local cluster: it can be created, and it covers the client.

``qosflow_argo.rbac.rbac(namespace)`` (committed as ``argo_templates/rbac.yaml``) is created through
the emulated Kubernetes API with the official client, a token of the ``qosflow`` ServiceAccount is
requested through the TokenRequest API, and ``ArgoCluster`` runs a whole job with it: install
check, capacity, submit, status, list, usage, in-place resize, priority bump, stop. The local
cluster enforces RBAC on every request of a ServiceAccount token, so a rule missing from the
shipped RBAC fails here with the request it refused.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from kubernetes import client

from qosflow.core.cluster import Phase, ResizeState
from qosflow.core.errors import ClusterError
from qosflow.local import LocalCluster
from qosflow.local.rbac import Attributes, User
from qosflow_argo.argo_cluster import ArgoCluster
from qosflow_argo.manifests import CLIENT_ACCOUNT
from qosflow_argo.rbac import CLIENT_ACCESS, rbac

from .conftest import CLAIM, Target, checked_session

Decision = tuple[str, Attributes, str | None]


def _client(local: LocalCluster, token: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = local.kube_url
    cfg.api_key = {"BearerToken": token, "authorization": token}
    cfg.api_key_prefix = {"BearerToken": "Bearer", "authorization": "Bearer"}
    return client.ApiClient(cfg)


def apply_shipped_rbac(local: LocalCluster) -> list[str]:
    """Create every object of ``rbac(namespace)`` as the admin; ``Kind/name`` of each."""
    made = []
    with _client(local, local.token) as apis:
        core, authz = client.CoreV1Api(apis), client.RbacAuthorizationV1Api(apis)
        ns = local.namespace
        create = {
            "ServiceAccount": lambda body: core.create_namespaced_service_account(ns, body),
            "Role": lambda body: authz.create_namespaced_role(ns, body),
            "RoleBinding": lambda body: authz.create_namespaced_role_binding(ns, body),
            "ClusterRole": authz.create_cluster_role,
            "ClusterRoleBinding": authz.create_cluster_role_binding,
        }
        for obj in rbac(ns):
            created = create[obj["kind"]](obj)
            assert created.metadata.uid and created.metadata.name == obj["metadata"]["name"]
            made.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return made


def client_token(local: LocalCluster) -> str:
    """A token of the ``qosflow`` ServiceAccount, from the TokenRequest API."""
    with _client(local, local.token) as apis:
        answer = client.CoreV1Api(apis).create_namespaced_service_account_token(
            CLIENT_ACCOUNT, local.namespace, {"spec": {"expirationSeconds": 7 * 86400}}
        )
    token: str = answer.status.token
    return token


@pytest.fixture
def decisions(local_target: Target, monkeypatch: pytest.MonkeyPatch) -> list[Decision]:
    """Every authorization decision of the local cluster: ``(user, attributes, denial or None)``."""
    access = local_target.local.access
    seen: list[Decision] = []
    check = access.check

    def record(user: User, attrs: Attributes) -> str | None:
        denial = check(user, attrs)
        seen.append((user.name, attrs, denial))
        return denial

    monkeypatch.setattr(access, "check", record)
    return seen


@pytest.fixture
def as_client(local_target: Target) -> Iterator[ArgoCluster]:
    """``ArgoCluster`` with the ``qosflow`` ServiceAccount's token, on both APIs."""
    local = local_target.local
    apply_shipped_rbac(local)
    cluster = ArgoCluster(
        local.argo_url,
        token=client_token(local),
        namespace=local.namespace,
        kube_url=local.kube_url,
        clock=local_target.clock.now,
        sleep=local_target.clock.advance,
        rng=random.Random(5),
        session=checked_session(local.argo_url, local_target.exchanges),
    )
    try:
        yield cluster
    finally:
        cluster.close()


def test_the_shipped_rbac_is_created_through_the_kubernetes_api(local_target: Target) -> None:
    made = apply_shipped_rbac(local_target.local)
    assert made == [
        f"{o['kind']}/{o['metadata']['name']}" for o in rbac(local_target.local.namespace)
    ]
    local = local_target.local
    for obj in rbac(local.namespace):  # read back as stored: what was shipped, nothing lost
        kind, name = obj["kind"], obj["metadata"]["name"]
        group = "api/v1" if kind == "ServiceAccount" else "apis/rbac.authorization.k8s.io/v1"
        scope = "" if kind.startswith("Cluster") else f"/namespaces/{local.namespace}"
        plural = kind.lower() + "s"
        stored = requests.get(
            f"{local.kube_url}/{group}{scope}/{plural}/{name}",
            headers={"Authorization": f"Bearer {local.token}"},
            timeout=10,
        ).json()
        for key in ("rules", "roleRef", "subjects"):
            assert stored.get(key) == obj.get(key), (kind, name, key)


def test_the_client_account_may_make_every_request_of_a_job(
    local_target: Target, as_client: ArgoCluster, decisions: list[Decision]
) -> None:
    cluster, target = as_client, local_target
    installed = cluster.ensure_installed(checkpoint_claim=CLAIM)  # reads only
    assert set(installed.values()) - {"unchanged"} == {"exists (Bound, 10Gi, ReadWriteOnce)"}
    assert cluster.capacity("cpu").total == 2
    assert cluster.supports_in_place_resize("cpu")
    req = target.request("rbac", total_steps=10_000)
    assert cluster.submit(req).name == req.name
    running = target.wait(
        cluster, req.name, lambda s: s.phase is Phase.RUNNING and bool(s.pod_name)
    )
    assert [s.name for s in cluster.list_jobs(req.job)] == [req.name]
    assert cluster.usage(running.pod_name or "") == []  # scripted pods log no usage
    assert cluster.resize(req.name, 2).state in (ResizeState.DONE, ResizeState.IN_PROGRESS)
    assert target.wait(cluster, req.name, lambda s: s.units == 2).resize is ResizeState.DONE
    assert cluster.set_priority(req.name, priority=7, priority_class="qosflow-high").priority == 7
    assert cluster.stop(req.name).phase is Phase.STOPPED
    denied = [(attrs, why) for user, attrs, why in decisions if why is not None]
    assert denied == [], "qosflow's RBAC lacks what the client needs"
    asked = {(a.verb, a.group, a.combined) for u, a, _ in decisions if u.endswith(CLIENT_ACCOUNT)}
    assert {
        ("create", "argoproj.io", "workflows"),
        ("get", "argoproj.io", "workflows"),
        ("patch", "argoproj.io", "workflows"),
        ("list", "", "pods"),
        ("list", "", "nodes"),
        ("patch", "", "pods/resize"),
        ("get", "", "pods/log"),
        ("get", "scheduling.k8s.io", "priorityclasses"),
    } <= asked


def test_access_reviews_grant_every_access_the_check_asks_about(
    local_target: Target, as_client: ArgoCluster
) -> None:
    local = local_target.local
    with _client(local, client_token(local)) as apis:
        authz = client.AuthorizationV1Api(apis)
        for access in CLIENT_ACCESS:
            attributes = {
                "verb": access.verb,
                "group": access.group,
                "resource": access.resource,
                "subresource": access.subresource or None,
                "name": access.name or None,
                "namespace": local.namespace if access.namespaced else None,
            }
            review = authz.create_self_subject_access_review(
                {
                    "spec": {
                        "resourceAttributes": {k: v for k, v in attributes.items() if v is not None}
                    }
                }
            )
            assert review.status.allowed, (str(access), review.status.reason)
            assert review.status.reason.startswith("RBAC: allowed by ")


def test_the_client_account_may_not_do_more(
    as_client: ArgoCluster, decisions: list[Decision]
) -> None:
    with pytest.raises(ClusterError) as delete:
        as_client.argo.request("DELETE", f"/api/v1/workflows/{as_client.namespace}/anything")
    assert delete.value.status == 403
    assert 'cannot delete resource "workflows"' in str(delete.value)
    klass: dict[str, Any] = {"metadata": {"name": "sneaky"}, "value": 5}
    with pytest.raises(ClusterError) as create:
        as_client.kube.create_priority_class(klass)
    assert create.value.status == 403
    assert 'cannot create resource "priorityclasses"' in str(create.value)


def test_kubernetes_1_32_makes_the_client_rescale_by_restart(tmp_path: Path) -> None:
    from qosflow.local import ScriptedRunner, VirtualClock

    clock = VirtualClock()
    with LocalCluster(
        cpus=2,
        state_dir=tmp_path / "old",
        clock=clock,
        runner=ScriptedRunner(),
        kubernetes_version="1.32",
    ) as local:
        cluster = ArgoCluster.from_local(local, clock=clock.now, sleep=clock.advance)
        with cluster:
            assert cluster.server_version() == (1, 32)
            assert not cluster.supports_in_place_resize("cpu")
