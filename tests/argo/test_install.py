"""Installing with the runtime account's rights: the RBAC of rbac.yaml, enforced by a fake API.

Kubernetes cannot restrict ``create`` by name, so the runtime account may read PriorityClasses and
update the ladder's, never create one: with the ladder installed (by an administrator) the
installer needs no create; without it, it says which classes are missing and how to install them.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from qosflow.core.errors import ClusterError, NotFoundError
from qosflow.core.priority import LADDER
from qosflow_argo import manifests
from qosflow_argo.installer import INSTALL_LADDER, Installer, LadderMissing
from qosflow_argo.rbac import rbac


def allowed(verb: str, group: str, resource: str, name: str) -> bool:
    """Whether the ``qosflow`` account's ClusterRoles allow ``verb`` on one object."""
    for doc in rbac():
        if doc["kind"] != "ClusterRole":
            continue
        for rule in doc["rules"]:
            names = rule.get("resourceNames")
            if (
                group in rule["apiGroups"]
                and resource in rule["resources"]
                and verb in rule["verbs"]
                and (names is None or name in names)
            ):
                return True
    return False


class RbacKube:
    """PriorityClasses behind the runtime account's RBAC (403 for anything it may not do)."""

    def __init__(self, classes: dict[str, dict[str, Any]]) -> None:
        self.classes = classes
        self.calls: list[tuple[str, str]] = []

    def _check(self, verb: str, name: str) -> None:
        self.calls.append((verb, name))
        if not allowed(verb, "scheduling.k8s.io", "priorityclasses", name):
            raise ClusterError(
                f"{verb} priorityclass {name}: HTTP 403: priorityclasses.scheduling.k8s.io "
                f'"{name}" is forbidden: User "system:serviceaccount:qosflow:qosflow" cannot '
                f"{verb} resource",
                status=403,
            )

    def read_priority_class(self, name: str) -> dict[str, Any]:
        self._check("get", name)
        if name not in self.classes:
            raise NotFoundError(f"priorityclass {name} not found", status=404)
        return copy.deepcopy(self.classes[name])

    def create_priority_class(self, body: dict[str, Any]) -> dict[str, Any]:
        self._check("create", body["metadata"]["name"])
        raise AssertionError("unreachable: the runtime account may not create")

    def replace_priority_class(self, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        self._check("update", name)
        self.classes[name] = copy.deepcopy(body)
        return body


class Templates:
    """The Argo Server side: the WorkflowTemplate is installed and current."""

    def __init__(self) -> None:
        self.template = manifests.workflow_template()
        self.template["metadata"]["resourceVersion"] = "1"

    def get_template(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.template)


def installed() -> dict[str, dict[str, Any]]:
    out = {}
    for klass in manifests.priority_classes():
        klass = copy.deepcopy(klass)
        klass["metadata"]["resourceVersion"] = "7"
        out[klass["metadata"]["name"]] = klass
    return out


def test_an_installed_ladder_needs_no_create() -> None:
    kube = RbacKube(installed())
    result = Installer(Templates(), kube).ensure("qosflow", "qosflow-train")  # type: ignore[arg-type]
    assert set(result.values()) == {"unchanged"}
    assert {verb for verb, _ in kube.calls} == {"get"}


def test_a_drifted_ladder_class_is_updated_by_name() -> None:
    classes = installed()
    classes["qosflow-high"]["description"] = "edited by hand"
    kube = RbacKube(classes)
    result = Installer(Templates(), kube).ensure("qosflow", "qosflow-train")  # type: ignore[arg-type]
    assert result["PriorityClass/qosflow-high"] == "updated"
    assert ("update", "qosflow-high") in kube.calls
    assert not allowed("update", "scheduling.k8s.io", "priorityclasses", "someone-elses")


def test_a_missing_ladder_fails_naming_every_missing_class_and_the_install_step() -> None:
    classes = installed()
    del classes["qosflow-urgent"], classes["qosflow-late"]
    kube = RbacKube(classes)
    with pytest.raises(LadderMissing) as err:
        Installer(Templates(), kube).ensure("qosflow", "qosflow-train")  # type: ignore[arg-type]
    assert err.value.missing == ["qosflow-urgent", "qosflow-late"]
    assert err.value.status == 403 and not err.value.retryable
    text = str(err.value)
    assert "qosflow-urgent, qosflow-late missing" in text and INSTALL_LADDER in text
    assert "forbidden" in text  # the API server's own refusal
    # the classes that exist were still checked
    assert {name for verb, name in kube.calls if verb == "get"} == {k.name for k in LADDER}


def test_an_update_the_account_may_not_make_says_so() -> None:
    classes = installed()
    classes["qosflow-high"]["description"] = "edited by hand"
    kube = RbacKube(classes)

    def refuse(body: dict[str, Any]) -> dict[str, Any]:
        raise ClusterError("PUT priorityclass qosflow-high: HTTP 403: forbidden", status=403)

    kube.replace_priority_class = refuse  # type: ignore[method-assign]
    with pytest.raises(ClusterError, match=r"may not update it.*rbac\.yaml") as err:
        Installer(Templates(), kube).ensure("qosflow", "qosflow-train")  # type: ignore[arg-type]
    assert err.value.status == 403
