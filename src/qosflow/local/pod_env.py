"""A container's environment as the kubelet builds it, and Kubernetes' ``$(VAR)`` expansion.

:func:`container_environment` follows the kubelet (``makeEnvironmentVariables``):

1. ``envFrom``, in order: every key of the ConfigMap or Secret (with ``prefix``; keys that are
   not valid variable names are skipped); a later source overwrites an earlier one;
2. ``env``, in order: ``value`` with ``$(VAR)`` references to the variables defined so far
   expanded, or ``valueFrom`` (``configMapKeyRef``, ``secretKeyRef``, ``fieldRef``,
   ``resourceFieldRef``); ``env`` overwrites ``envFrom``;
3. the ``ARGO_*`` variables Argo's controller appends to the ``main`` container.

A missing ConfigMap or Secret (or key) that is not ``optional`` stops the container from being
created: :class:`ContainerConfigError` carries the kubelet's message (``secret "x" not found``,
``couldn't find key k in Secret ns/x``) for ``CreateContainerConfigError``. An optional one that
is missing leaves the variable unset.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal

from qosflow.local.quantity import parse as parse_quantity
from qosflow.local.sandbox import PROGRESS_PATH
from qosflow.local.store import Obj, Store

FIELD_PATHS = (
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
"""The ``fieldRef`` paths an environment variable may use (besides labels and annotations)."""
RESOURCE_FIELDS = (
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
)
_KEYED_FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.*)'\]$")
_HOST_IP = "127.0.0.1"


class ContainerConfigError(Exception):
    """The container cannot be created from its configuration (``CreateContainerConfigError``).

    Attributes:
        message: The kubelet's message.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``third_party/forked/golang/expansion``).

    ``$(VAR)`` becomes the value of ``VAR`` when ``lookup`` knows it and stays as written
    otherwise; ``$$`` is an escaped ``$`` (so ``$$(VAR)`` is the text ``$(VAR)``); a ``$`` that
    starts neither is kept.
    """
    out: list[str] = []
    checkpoint = cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            nxt = text[cursor + 1]
            advance = 1
            if nxt == "$":
                out.append("$")
            elif nxt == "(":
                close = text.find(")", cursor + 2)
                if close < 0:
                    out.append("$(")
                else:
                    name = text[cursor + 2 : close]
                    value = lookup(name)
                    out.append(value if value is not None else f"$({name})")
                    advance = close - cursor
            else:
                out.append("$" + nxt)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


def argo_environment(pod: Obj) -> dict[str, str]:
    """The ``ARGO_*`` variables of the ``main`` container of an Argo pod."""
    meta = pod["metadata"]
    return {
        "ARGO_PROGRESS_FILE": PROGRESS_PATH,
        "ARGO_POD_NAME": str(meta["name"]),
        "ARGO_CONTAINER_NAME": "main",
        "ARGO_NODE_ID": str(
            (meta.get("annotations") or {}).get("workflows.argoproj.io/node-id", "")
        ),
        "ARGO_WORKFLOW_NAME": str(
            (meta.get("labels") or {}).get("workflows.argoproj.io/workflow", "")
        ),
    }


def field_value(pod: Obj, path: str) -> str:
    """The value of a ``fieldRef`` (the downward API) for ``pod``."""
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    keyed = _KEYED_FIELD.match(path)
    if keyed is not None:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP") or _HOST_IP,
        "status.hostIPs": status.get("hostIP") or _HOST_IP,
        "status.podIP": status.get("podIP") or _HOST_IP,
        "status.podIPs": status.get("podIP") or _HOST_IP,
    }
    if path not in values:
        raise ContainerConfigError(f"unsupported fieldPath: {path}")
    return str(values[path] or "")


def resource_value(container: Obj, ref: Obj, allocatable: Mapping[str, Decimal]) -> str:
    """The value of a ``resourceFieldRef``: rounded up to whole ``divisor`` units, as upstream.

    An unset limit is the node's allocatable amount (``defaultPodLimitsForDownwardAPI``); an
    unset request is its limit when that is set (the API server's default), else 0.
    """
    field = str(ref.get("resource") or "")
    if field not in RESOURCE_FIELDS:
        raise ContainerConfigError(f"unsupported container resource : {field}")
    kind, resource = field.split(".", 1)
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    value = (
        limits.get(resource)
        if kind == "limits"
        else (resources.get("requests") or {}).get(resource, limits.get(resource))
    )
    amount = parse_quantity(value) if value is not None else Decimal(0)
    if value is None and kind == "limits":
        amount = allocatable.get(resource, Decimal(0))
    divisor = (
        parse_quantity(ref["divisor"])
        if ref.get("divisor") not in (None, "", 0, "0")
        else Decimal(1)
    )
    if resource == "cpu":  # MilliValue() of both, rounded up
        value_units, divisor_units = math.ceil(amount * 1000), math.ceil(divisor * 1000)
    else:  # Value() of both, rounded up
        value_units, divisor_units = math.ceil(amount), math.ceil(divisor)
    return str(-(-value_units // max(1, divisor_units)))


def _decoded(secret: Obj) -> dict[str, str]:
    """A Secret's ``data`` (base64) as text; ``stringData`` too if a writer left it."""
    values: dict[str, str] = {}
    for key, raw in (secret.get("data") or {}).items():
        try:
            values[str(key)] = base64.b64decode(str(raw), validate=True).decode(
                "utf-8", "surrogateescape"
            )
        except (binascii.Error, ValueError):
            values[str(key)] = str(raw)
    values.update({str(k): str(v) for k, v in (secret.get("stringData") or {}).items()})
    return values


class _Sources:
    """ConfigMaps and Secrets of one namespace, read once per container start."""

    def __init__(self, store: Store, namespace: str) -> None:
        self.store, self.namespace = store, namespace
        self.cache: dict[tuple[str, str], dict[str, str] | None] = {}

    def data(self, kind: str, name: str) -> dict[str, str] | None:
        """The keys of a ConfigMap or Secret, or ``None`` when it does not exist."""
        if (kind, name) not in self.cache:
            obj = self.store.get(kind, self.namespace, name)
            if obj is None:
                self.cache[kind, name] = None
            elif kind == "Secret":
                self.cache[kind, name] = _decoded(obj)
            else:
                self.cache[kind, name] = {
                    str(k): str(v) for k, v in (obj.get("data") or {}).items()
                }
        return self.cache[kind, name]

    def key(self, kind: str, ref: Obj) -> str | None:
        """The value of a ``configMapKeyRef`` / ``secretKeyRef`` (``None``: optional, missing)."""
        name, key, optional = (
            str(ref.get("name") or ""),
            str(ref.get("key") or ""),
            bool(ref.get("optional")),
        )
        data = self.data(kind, name)
        if data is None:
            if optional:
                return None
            raise ContainerConfigError(f'{kind.lower()} "{name}" not found')
        if key not in data:
            if optional:
                return None
            raise ContainerConfigError(f"couldn't find key {key} in {kind} {self.namespace}/{name}")
        return data[key]


def _valid_name(name: str) -> bool:
    """A variable name the kubelet accepts from ``envFrom`` (printable, no ``=``)."""
    return bool(name) and "=" not in name and name.isprintable() and name.isascii()


def _from_sources(sources: _Sources, container: Obj) -> dict[str, str]:
    """Step 1: the variables of ``envFrom``, in order."""
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        kind = "ConfigMap" if source.get("configMapRef") is not None else "Secret"
        ref = source.get("configMapRef") if kind == "ConfigMap" else source.get("secretRef")
        if ref is None:
            continue
        name = str(ref.get("name") or "")
        data = sources.data(kind, name)
        if data is None:
            if ref.get("optional"):
                continue
            raise ContainerConfigError(f'{kind.lower()} "{name}" not found')
        prefix = str(source.get("prefix") or "")
        env.update({prefix + k: v for k, v in data.items() if _valid_name(prefix + k)})
    return env


def _value_from(
    sources: _Sources, pod: Obj, container: Obj, source: Obj, allocatable: Mapping[str, Decimal]
) -> str | None:
    """The value of one ``valueFrom`` (``None``: an optional reference that is missing)."""
    if source.get("fieldRef") is not None:
        return field_value(pod, str(source["fieldRef"].get("fieldPath") or ""))
    if source.get("resourceFieldRef") is not None:
        return resource_value(container, source["resourceFieldRef"], allocatable)
    if source.get("configMapKeyRef") is not None:
        return sources.key("ConfigMap", source["configMapKeyRef"])
    if source.get("secretKeyRef") is not None:
        return sources.key("Secret", source["secretKeyRef"])
    return ""


def container_environment(
    store: Store, pod: Obj, container: Obj, allocatable: Mapping[str, Decimal]
) -> dict[str, str]:
    """The environment of ``container`` of ``pod`` (see the module docstring).

    Args:
        store: Where the ConfigMaps and Secrets are.
        pod: The pod (bound: ``nodeName``, ``status.podIP`` are read by ``fieldRef``).
        container: One of its containers.
        allocatable: The node's allocatable ``cpu`` (cores), ``memory`` and
            ``ephemeral-storage`` (bytes), the defaults of unset limits.

    Raises:
        ContainerConfigError: A ConfigMap, Secret or key that is not optional is missing, or a
            value contains a NUL byte (no process environment can hold it).
    """
    sources = _Sources(store, str(pod["metadata"]["namespace"]))
    env = _from_sources(sources, container)
    for var in container.get("env") or []:
        name = str(var.get("name") or "")
        value: str | None = str(var.get("value") or "")
        if value:
            value = expand(value, env.get)
        elif var.get("valueFrom") is not None:
            value = _value_from(sources, pod, container, var["valueFrom"], allocatable)
        if value is not None:
            env[name] = value
    env.update(argo_environment(pod))
    for name, value in env.items():
        if "\x00" in value or "\x00" in name:
            raise ContainerConfigError(f"environment variable {name}: a value may not contain NUL")
    return env


def container_argv(container: Obj, env: Mapping[str, str]) -> tuple[str, ...]:
    """``command + args`` with ``$(VAR)`` references to the container's variables expanded."""
    words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
    return tuple(expand(word, env.get) for word in words)
