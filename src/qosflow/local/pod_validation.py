"""The API server's validation of a pod's volumes, mounts and environment sources.

Part of the pod-creation check (:func:`qosflow.local.admission.check_pod`): a pod the controller
creates that breaks one of these rules is refused with 422 ``Invalid`` and the causes below, in the
API server's words, and its Argo node goes Error.
"""

from __future__ import annotations

from typing import Any

from qosflow.local.names import namespace_problem
from qosflow.local.pod_env import FIELD_PATHS, RESOURCE_FIELDS
from qosflow.local.store import Obj

Cause = tuple[str, str]
_KEYED = ("metadata.labels['", "metadata.annotations['")
_ENV_SOURCES = ("configMapKeyRef", "secretKeyRef", "fieldRef", "resourceFieldRef")


def _supported(values: tuple[str, ...]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def volume_causes(spec: Obj) -> list[Cause]:
    """Volumes: unique RFC 1123 label names, exactly one volume source each."""
    causes: list[Cause] = []
    seen: set[str] = set()
    for index, volume in enumerate(spec.get("volumes") or []):
        path = f"spec.volumes[{index}]"
        if not isinstance(volume, dict) or not volume.get("name"):
            causes.append((f"{path}.name", "Required value"))
            continue
        name = str(volume["name"])
        problem = namespace_problem(name)  # volume names are RFC 1123 labels, as namespaces
        if problem is not None:
            causes.append((f"{path}.name", problem))
        if name in seen:
            causes.append((f"{path}.name", f'Duplicate value: "{name}"'))
        seen.add(name)
        kinds = [k for k in volume if k != "name" and volume[k] is not None]
        if not kinds:
            causes.append((path, "Required value: must specify a volume type"))
        elif len(kinds) > 1:
            causes.append(
                (f"{path}.{kinds[1]}", "Forbidden: may not specify more than 1 volume type")
            )
    return causes


def _sub_path_cause(path: str, sub_path: str) -> Cause | None:
    if sub_path.startswith("/"):
        return (path, f'Invalid value: "{sub_path}": must be a relative path')
    if ".." in sub_path.split("/"):
        return (path, f"Invalid value: \"{sub_path}\": must not contain '..'")
    return None


def mount_causes(index: int, container: Obj, volumes: set[str]) -> list[Cause]:
    """A container's volumeMounts: a declared volume, a unique mount path, a safe subPath."""
    causes: list[Cause] = []
    paths: set[str] = set()
    for i, mount in enumerate(container.get("volumeMounts") or []):
        path = f"spec.containers[{index}].volumeMounts[{i}]"
        if not isinstance(mount, dict):
            causes.append((path, "Required value"))
            continue
        name, mount_path = str(mount.get("name") or ""), str(mount.get("mountPath") or "")
        if name not in volumes:
            causes.append((f"{path}.name", f'Not found: "{name}"'))
        if not mount_path:
            causes.append((f"{path}.mountPath", "Required value"))
        elif mount_path in paths:
            causes.append((f"{path}.mountPath", f'Invalid value: "{mount_path}": must be unique'))
        paths.add(mount_path)
        sub = _sub_path_cause(f"{path}.subPath", str(mount.get("subPath") or ""))
        causes.extend([sub] if sub else [])
    return causes


def _source_causes(path: str, source: Obj) -> list[Cause]:
    """One ``valueFrom``: exactly one source, a supported field or resource."""
    present = [k for k in _ENV_SOURCES if source.get(k) is not None]
    if len(present) > 1:
        return [(path, 'Invalid value: "": may not have more than one field specified at a time')]
    field = (source.get("fieldRef") or {}).get("fieldPath")
    if field is not None and field not in FIELD_PATHS and not str(field).startswith(_KEYED):
        return [
            (
                f"{path}.fieldRef.fieldPath",
                f'Unsupported value: "{field}": supported values: {_supported(FIELD_PATHS)}',
            )
        ]
    resource = (source.get("resourceFieldRef") or {}).get("resource")
    if resource is not None and resource not in RESOURCE_FIELDS:
        return [
            (
                f"{path}.resourceFieldRef.resource",
                f'Unsupported value: "{resource}": supported values: {_supported(RESOURCE_FIELDS)}',
            )
        ]
    return []


def env_causes(index: int, container: Obj) -> list[Cause]:
    """A container's ``env[].valueFrom`` and ``envFrom`` rules."""
    causes: list[Cause] = []
    for i, var in enumerate(container.get("env") or []):
        source: Any = var.get("valueFrom") if isinstance(var, dict) else None
        if not isinstance(source, dict):
            continue
        path = f"spec.containers[{index}].env[{i}].valueFrom"
        if var.get("value"):
            causes.append(
                (path, 'Invalid value: "": may not be specified when `value` is not empty')
            )
        causes.extend(_source_causes(path, source))
    for i, source in enumerate(container.get("envFrom") or []):
        refs = [k for k in ("configMapRef", "secretRef") if (source or {}).get(k) is not None]
        if len(refs) != 1:
            causes.append(
                (
                    f"spec.containers[{index}].envFrom[{i}]",
                    'Invalid value: "": may not have more than one field specified at a time',
                )
            )
    return causes


def pod_causes(spec: Obj) -> list[Cause]:
    """Every rule of this module over a pod spec."""
    causes = volume_causes(spec)
    volumes = {str(v.get("name")) for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for index, container in enumerate(spec.get("containers") or []):
        if isinstance(container, dict):
            causes.extend(mount_causes(index, container, volumes))
            causes.extend(env_causes(index, container))
    return causes
