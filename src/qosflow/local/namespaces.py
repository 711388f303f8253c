"""Namespaces: the ones every cluster has, the configured one, and any an object lives in.

The local cluster is lenient where a real one answers 404 (``namespaces "x" not found``): writing
an object into a namespace creates that Namespace object (:func:`ensure_namespace`), so every
namespace in use can be listed and read, with a stable uid and ``status.phase: Active``. At start
``default``, ``kube-system``, ``kube-public``, ``kube-node-lease``, the configured namespace and
the namespace of every stored object exist. ``POST /api/v1/namespaces`` creates one (409 when it
exists); a namespace cannot be deleted here (405), since its contents would not go with it.
"""

from __future__ import annotations

from qosflow.local.clock import rfc3339
from qosflow.local.kinds import OBJECT_META, Kind
from qosflow.local.object_meta import label_problem
from qosflow.local.store import Obj, Store

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
NAME_LABEL = "kubernetes.io/metadata.name"


def prepare_namespace(doc: Obj, old: Obj | None) -> None:
    """The server's defaults: the name label, the ``kubernetes`` finalizer, ``Active``."""
    meta = doc["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), NAME_LABEL: meta["name"]}
    spec = doc["spec"] = doc.get("spec") or {}
    spec["finalizers"] = spec.get("finalizers") or ["kubernetes"]
    if old is None:
        doc["status"] = {"phase": "Active"}


NAMESPACE = Kind(
    "Namespace",
    "namespaces",
    namespaced=False,
    shape={"metadata": OBJECT_META, "spec": {"finalizers": ("list", "string")}},
    prepare=prepare_namespace,
    name_problem=label_problem,
    fields=frozenset({"metadata.name", "status.phase"}),
    has_status=True,
    deletable=False,
)


def ensure_namespace(store: Store, now: float, name: str) -> None:
    """Create the Namespace ``name`` when it is missing (callers hold the store lock)."""
    if not name or store.get("Namespace", "", name) is not None:
        return
    doc: Obj = {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": name, "creationTimestamp": rfc3339(now)},
    }
    prepare_namespace(doc, None)
    store.put(doc)


def seed_namespaces(store: Store, now: float, configured: str) -> None:
    """The system namespaces, the configured one and those of the stored objects."""
    for name in (*SYSTEM_NAMESPACES, configured, *sorted(store.namespaces())):
        if label_problem(name) is None:
            ensure_namespace(store, now, name)
