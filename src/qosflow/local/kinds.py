"""The plain object kinds of the emulated Kubernetes API and their validation and defaults.

Each :class:`Kind` names its REST resource and carries a ``prepare(doc, old)`` hook run on every
create (``old`` is ``None``) and update, after the generic metadata handling of
:mod:`qosflow.local.objects`: it checks the object as the API server's validation does (422 with
``details.causes``; a 400 where Go's decoder already fails) and fills the server's defaults.

* ``ConfigMap``: keys are config keys, ``data`` and ``binaryData`` do not share one, at most 1 MiB,
  ``immutable`` freezes the data.
* ``Secret``: ``data`` values are base64 (else the decoder's 400), ``stringData`` is merged into
  ``data`` base64-encoded and never stored, ``type`` defaults to ``Opaque`` and is immutable, the
  well-known types require their keys.
* ``PersistentVolumeClaim``: ``spec.accessModes`` and ``spec.resources.requests.storage`` are
  required, ``storageClassName`` defaults to the cluster's default class; :mod:`qosflow.local.storage`
  binds it. The spec is immutable but for the storage request, which the class does not let grow.
* ``ServiceAccount``. RBAC kinds are in :mod:`qosflow.local.rbac_kinds`.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qosflow.local import quantity
from qosflow.local.object_meta import (
    Cause,
    bad,
    decode_error,
    forbidden,
    invalid_error,
    required,
    subdomain_problem,
    unsupported,
)
from qosflow.local.shapes import META, Desc
from qosflow.local.store import Obj

Prepare = Callable[[Obj, Obj | None], None]
OBJECT_META: Desc = {
    **META,
    "finalizers": ("list", "string"),
    "ownerReferences": (
        "list",
        {
            "apiVersion": "string",
            "kind": "string",
            "name": "string",
            "uid": "string",
            "controller": "bool",
            "blockOwnerDeletion": "bool",
        },
    ),
}
"""``ObjectMeta`` as the decoder checks it for these kinds."""
DEFAULT_STORAGE_CLASS = "local-folder"
MAX_DATA_BYTES = 1024 * 1024
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_KEY_MESSAGE = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)
_STRINGS = ("map", "string")
ACCESS_MODES = ["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]
QUANTITY_MESSAGE = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)
SECRET_KEYS = {
    "kubernetes.io/tls": ["tls.crt", "tls.key"],
    "kubernetes.io/dockerconfigjson": [".dockerconfigjson"],
    "kubernetes.io/dockercfg": [".dockercfg"],
    "kubernetes.io/ssh-auth": ["ssh-privatekey"],
}


def _noop(doc: Obj, old: Obj | None) -> None:
    """Kinds without rules beyond the metadata."""


@dataclass(frozen=True, slots=True)
class Kind:
    """One REST resource of plain objects.

    Attributes:
        kind: ``ConfigMap``.
        plural: ``configmaps`` (the URL segment and the RBAC resource).
        group: API group (``""`` for the core group).
        namespaced: Whether objects live in a namespace.
        shape: What Go's decoder checks (:mod:`qosflow.local.shapes`).
        prepare: Validation and defaults on create and update.
        name_problem: The rule for object names.
        create_on_update: Whether a ``PUT`` of a missing object creates it.
        fields: Field-selector paths the list accepts.
        has_status: Whether ``status`` is kept by the server (a subresource).
        deletable: Whether ``DELETE`` is served.
    """

    kind: str
    plural: str
    group: str = ""
    namespaced: bool = True
    shape: Desc = field(default_factory=lambda: {"metadata": OBJECT_META})
    prepare: Prepare = _noop
    name_problem: Callable[[str], str | None] = subdomain_problem
    create_on_update: bool = False
    fields: frozenset[str] = frozenset({"metadata.name", "metadata.namespace"})
    has_status: bool = False
    deletable: bool = True

    @property
    def api_version(self) -> str:
        """``v1`` or ``<group>/v1``."""
        return f"{self.group}/v1" if self.group else "v1"

    @property
    def resource(self) -> str:
        """``plural[.group]`` as error messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def base(self) -> str:
        """The URL prefix of the resource's group version."""
        return f"/apis/{self.group}/v1" if self.group else "/api/v1"


def _key_causes(where: str, keys: list[str]) -> list[Cause]:
    causes: list[Cause] = []
    for key in keys:
        if len(key) > 253:
            causes.append(bad(f"{where}[{key}]", key, "must be no more than 253 characters"))
        elif not _CONFIG_KEY.match(key):
            causes.append(bad(f"{where}[{key}]", key, _KEY_MESSAGE))
        elif key in (".", ".."):
            causes.append(bad(f"{where}[{key}]", key, f"must not be '{key}'"))
        elif key.startswith(".."):
            causes.append(bad(f"{where}[{key}]", key, "must not start with '..'"))
    return causes


def _immutable_causes(doc: Obj, old: Obj | None, keys: tuple[str, ...]) -> list[Cause]:
    """``immutable: true`` freezes the data and itself."""
    if old is None or not old.get("immutable"):
        return []
    text = "field is immutable when `immutable` is set"
    causes = [forbidden(k, text) for k in keys if (doc.get(k) or {}) != (old.get(k) or {})]
    if not doc.get("immutable"):
        causes.append(forbidden("immutable", text))
    return causes


def base64_problem(text: str) -> str | None:
    """Why Go's ``base64.StdEncoding`` refuses ``text`` (``illegal base64 data at input byte N``).

    Like Go: line breaks are skipped, an illegal character or a misplaced ``=`` is reported at
    its index, a short last quantum at its start, characters after the padding where they begin.
    """
    chars = [(i, c) for i, c in enumerate(text) if c not in "\r\n"]
    for start in range(0, len(chars), 4):
        quantum = chars[start : start + 4]
        for j, (index, char) in enumerate(quantum):
            if char == "=":
                if j < 2 or (j == 2 and (len(quantum) < 4 or quantum[3][1] != "=")):
                    at = len(text) if j == 2 and len(quantum) < 4 else index
                    return f"illegal base64 data at input byte {at}"
                rest = chars[start + 4 :]
                return f"illegal base64 data at input byte {rest[0][0]}" if rest else None
            if not (char.isascii() and (char.isalnum() or char in "+/")):
                return f"illegal base64 data at input byte {index}"
        if len(quantum) < 4:
            return f"illegal base64 data at input byte {quantum[0][0]}"
    return None


def _decoded(kind: str, where: str, data: dict[str, Any]) -> int:
    """Check every value is base64 (the decoder's 400); returns the decoded size."""
    size = 0
    for value in data.values():
        problem = base64_problem(str(value))
        if problem is None:
            try:
                size += len(base64.b64decode(str(value).replace("\r", "").replace("\n", "")))
            except (binascii.Error, ValueError):
                problem = "illegal base64 data at input byte 0"
        if problem is not None:
            raise decode_error(kind, "v1", problem)
    return size


def prepare_config_map(doc: Obj, old: Obj | None) -> None:
    """ConfigMap rules."""
    data, binary = doc.get("data") or {}, doc.get("binaryData") or {}
    size = _decoded("ConfigMap", "binaryData", binary) + sum(
        len(str(k)) + len(str(v).encode()) for k, v in data.items()
    )
    causes = _key_causes("data", list(data)) + _key_causes("binaryData", list(binary))
    causes += [
        bad(f"binaryData[{k}]", k, "duplicate of key present in data") for k in binary if k in data
    ]
    if size > MAX_DATA_BYTES:
        causes.append(("", f"Too long: may not be more than {MAX_DATA_BYTES} bytes"))
    causes += _immutable_causes(doc, old, ("data", "binaryData"))
    if causes:
        raise invalid_error("ConfigMap", doc["metadata"]["name"], causes)


def prepare_secret(doc: Obj, old: Obj | None) -> None:
    """Secret rules: ``stringData`` into ``data`` (base64), ``type`` defaulted and immutable."""
    data: dict[str, Any] = dict(doc.get("data") or {})
    size = _decoded("Secret", "data", data)
    for key, value in (doc.pop("stringData", None) or {}).items():
        encoded = str(value).encode()
        data[key] = base64.b64encode(encoded).decode()
        size += len(encoded)
    if data or "data" in doc:
        doc["data"] = data
    doc["type"] = doc.get("type") or "Opaque"
    causes = _key_causes("data", list(data))
    if size > MAX_DATA_BYTES:
        causes.append(("data", f"Too long: may not be more than {MAX_DATA_BYTES} bytes"))
    causes += [required(f"data[{k}]") for k in SECRET_KEYS.get(doc["type"], []) if k not in data]
    annotation = "kubernetes.io/service-account.name"
    if doc["type"] == "kubernetes.io/service-account-token" and not (
        doc["metadata"].get("annotations") or {}
    ).get(annotation):
        causes.append(required(f"metadata.annotations[{annotation}]"))
    if doc["type"] == "kubernetes.io/basic-auth" and not {"username", "password"} & set(data):
        causes.append(required("data[username]"))
    if old is not None and doc["type"] != old.get("type", "Opaque"):
        causes.append(bad("type", doc["type"], "field is immutable"))
    causes += _immutable_causes(doc, old, ("data",))
    if causes:
        raise invalid_error("Secret", doc["metadata"]["name"], causes)


def _storage_causes(spec: Obj) -> list[Cause]:
    """The storage request: required, a quantity (the decoder's 400), above zero."""
    requests = (spec.get("resources") or {}).get("requests") or {}
    if "storage" not in requests:
        return [required("spec.resources[storage]")]
    try:
        size = quantity.parse(requests["storage"])
    except ValueError:
        raise decode_error("PersistentVolumeClaim", "v1", QUANTITY_MESSAGE) from None
    if size <= 0:
        value = str(requests["storage"])
        return [bad("spec.resources.requests[storage]", value, "must be greater than zero")]
    return []


def _claim_causes(spec: Obj) -> list[Cause]:
    modes = [str(m) for m in spec.get("accessModes") or []]
    causes: list[Cause] = []
    if not modes:
        causes.append(required("spec.accessModes", "at least 1 access mode is required"))
    causes += [
        unsupported("spec.accessModes", m, ACCESS_MODES) for m in modes if m not in ACCESS_MODES
    ]
    if "ReadWriteOncePod" in modes and len(modes) > 1:
        causes.append(
            forbidden("spec.accessModes", "may not use ReadWriteOncePod with other access modes")
        )
    causes += _storage_causes(spec)
    if spec.get("volumeMode") not in ("Filesystem", "Block"):
        causes.append(
            unsupported("spec.volumeMode", spec.get("volumeMode"), ["Block", "Filesystem"])
        )
    klass = spec.get("storageClassName")
    if klass and subdomain_problem(str(klass)):
        causes.append(bad("spec.storageClassName", klass, str(subdomain_problem(str(klass)))))
    return causes


def prepare_claim(doc: Obj, old: Obj | None) -> None:
    """PersistentVolumeClaim rules and defaults (the DefaultStorageClass admission plugin)."""
    spec = doc["spec"] = doc.get("spec") or {}
    name = doc["metadata"]["name"]
    if old is None:
        spec.setdefault("volumeMode", "Filesystem")
        if spec.get("storageClassName") is None:
            spec["storageClassName"] = DEFAULT_STORAGE_CLASS
        finalizers = doc["metadata"]["finalizers"] = doc["metadata"].get("finalizers") or []
        if "kubernetes.io/pvc-protection" not in finalizers:
            finalizers.append("kubernetes.io/pvc-protection")
        doc["status"] = {"phase": "Pending"}
    causes = _claim_causes(spec)
    if old is not None and not causes:
        before = {k: v for k, v in old["spec"].items() if k not in ("resources", "volumeName")}
        after = {k: v for k, v in spec.items() if k not in ("resources", "volumeName")}
        if before != after or spec.get("volumeName") != old["spec"].get("volumeName"):
            causes.append(
                forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and "
                    "volumeAttributesClassName for bound claims",
                )
            )
        elif spec.get("resources") != old["spec"].get("resources"):
            causes.append(
                forbidden(
                    "spec.resources.requests.storage",
                    "only dynamically provisioned pvc can be resized and the storageclass that "
                    "provisions the pvc must support resize",
                )
            )
    if causes:
        raise invalid_error("PersistentVolumeClaim", name, causes)


CONFIG_MAP = Kind(
    "ConfigMap",
    "configmaps",
    shape={
        "metadata": OBJECT_META,
        "data": _STRINGS,
        "binaryData": _STRINGS,
        "immutable": "bool",
    },
    prepare=prepare_config_map,
)
SECRET = Kind(
    "Secret",
    "secrets",
    shape={
        "metadata": OBJECT_META,
        "data": _STRINGS,
        "stringData": _STRINGS,
        "type": "string",
        "immutable": "bool",
    },
    prepare=prepare_secret,
    fields=frozenset({"metadata.name", "metadata.namespace", "type"}),
)
CLAIM = Kind(
    "PersistentVolumeClaim",
    "persistentvolumeclaims",
    shape={
        "metadata": OBJECT_META,
        "spec": {
            "accessModes": ("list", "string"),
            "resources": {"requests": ("map", "quantity"), "limits": ("map", "quantity")},
            "storageClassName": "string",
            "volumeMode": "string",
            "volumeName": "string",
        },
    },
    prepare=prepare_claim,
    has_status=True,
)
SERVICE_ACCOUNT = Kind(
    "ServiceAccount",
    "serviceaccounts",
    shape={
        "metadata": OBJECT_META,
        "automountServiceAccountToken": "bool",
        "secrets": ("list", {"name": "string"}),
        "imagePullSecrets": ("list", {"name": "string"}),
    },
)
STORAGE_CLASS = Kind(
    "StorageClass", "storageclasses", group="storage.k8s.io", namespaced=False, deletable=False
)
