"""The default StorageClass and the binding of PersistentVolumeClaims, like a dynamic provisioner.

The cluster has one StorageClass, ``local-folder`` (the default class; provisioner
``qosflow.dev/local-folder``, binding ``Immediate``). A claim of that class is bound as soon as it
is stored, as a fast provisioner would: ``spec.volumeName: pvc-<uid>``, the bind annotations,
``status.phase: Bound`` with the claim's access modes and its requested storage as capacity. The
create answer is the claim as created (``Pending``); the next read shows it bound. A claim of any
other class (or of ``""``) stays ``Pending``: no provisioner serves it. The volumes themselves are
folders the pod side provides (:mod:`qosflow.local.pod_volumes`); PersistentVolume objects are not
served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qosflow.local.clock import Clock, rfc3339
from qosflow.local.kinds import DEFAULT_STORAGE_CLASS, STORAGE_CLASS
from qosflow.local.objects import gone
from qosflow.local.query import label_selector
from qosflow.local.store import Obj, Store, snapshot

PROVISIONER = "qosflow.dev/local-folder"
Handler = Callable[..., tuple[int, Any]]


def seed_storage_class(store: Store, clock: Clock) -> None:
    """Store the default class when it is missing."""
    if store.get("StorageClass", "", DEFAULT_STORAGE_CLASS) is not None:
        return
    store.put(
        {
            "kind": "StorageClass",
            "apiVersion": STORAGE_CLASS.api_version,
            "metadata": {
                "name": DEFAULT_STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                "creationTimestamp": rfc3339(clock.now()),
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": False,
        }
    )


def bind_claim(store: Store, claim: Obj) -> None:
    """Bind a stored claim of the default class (a no-op for bound claims and other classes)."""
    spec = claim["spec"]
    if spec.get("storageClassName") != DEFAULT_STORAGE_CLASS or spec.get("volumeName"):
        return
    meta = claim["metadata"]
    spec["volumeName"] = f"pvc-{meta['uid']}"
    meta.setdefault("annotations", {}).update(
        {
            "pv.kubernetes.io/bind-completed": "yes",
            "pv.kubernetes.io/bound-by-controller": "yes",
            "volume.beta.kubernetes.io/storage-provisioner": PROVISIONER,
            "volume.kubernetes.io/storage-provisioner": PROVISIONER,
        }
    )
    claim["status"] = {
        "phase": "Bound",
        "accessModes": list(spec.get("accessModes") or []),
        "capacity": {"storage": spec["resources"]["requests"]["storage"]},
    }
    store.touch(claim)


class StorageClassApi:
    """``GET /apis/storage.k8s.io/v1/storageclasses[/{name}]``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def routes(self) -> list[tuple[str, str, Handler]]:
        """``(method, path regex, handler)``."""
        base = f"{STORAGE_CLASS.base}/{STORAGE_CLASS.plural}"
        return [("GET", base, self.list), ("GET", f"{base}/(?P<name>[^/]+)", self.get)]

    def list(self, query: dict[str, list[str]], **_: Any) -> tuple[int, Any]:
        """The classes (one)."""
        match = label_selector((query.get("labelSelector") or [""])[0])
        return 200, {
            "kind": "StorageClassList",
            "apiVersion": STORAGE_CLASS.api_version,
            "metadata": {"resourceVersion": self.store.resource_version},
            "items": [snapshot(c) for c in self.store.items("StorageClass") if match(c)],
        }

    def get(self, name: str, **_: Any) -> tuple[int, Any]:
        """One class."""
        klass = self.store.get("StorageClass", "", name)
        if klass is None:
            raise gone(STORAGE_CLASS, name)
        return 200, snapshot(klass)
