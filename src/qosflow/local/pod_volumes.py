"""Pod volumes as host folders: what the kubelet mounts where, under the state directory.

The local cluster has one node and no storage drivers, so every volume is a folder of the host:

* ``persistentVolumeClaim`` -> ``<state>/volumes/<namespace>/pvc/<claimName>/``: the claim must
  exist (a stored ``PersistentVolumeClaim`` of the pod's namespace, bound; the scheduler keeps a
  pod whose claim is missing or unbound Pending, :func:`claim_problem`); it outlives pods;
* ``nfs`` -> ``<state>/volumes/nfs/<server>/<path>/`` (shared by every pod naming that export);
* ``hostPath`` -> ``<state>/volumes/hostpath/<path>`` (created; the host's real ``<path>`` is
  never used, so a pod cannot reach the host through it);
* ``emptyDir`` -> ``<pod>/volumes/<name>/``, removed when the pod ends;
* ``configMap`` / ``secret`` -> files written from the stored object (``data``, secrets
  base64-decoded; ``items`` pick keys and paths; ``optional``), mounted read-only;
* Argo's ``var-run-argo`` emptyDir -> the pod's ``argo/`` folder (the node reads the progress file
  there, also after the pod ended).

A missing ConfigMap or Secret keeps the container from starting (:class:`MountPending`, with the
kubelet's ``MountVolume.SetUp failed`` message); a kind of volume the local cluster cannot provide
fails the pod (:class:`UnsupportedVolume`).
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from pathlib import Path

from qosflow.local.sandbox import Mount, argo_dir, volumes_dir
from qosflow.local.store import Obj, Store

ARGO_VOLUME = "var-run-argo"
"""The emptyDir Argo mounts at ``/var/run/argo`` in every pod."""
SOURCES = ("persistentVolumeClaim", "nfs", "hostPath", "emptyDir", "configMap", "secret")
_SERVER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-:\[\]]*$")
_HOST_PATH_FILES = ("File", "FileOrCreate")


class MountPending(Exception):
    """A volume cannot be set up yet (a missing ConfigMap or Secret): the container waits.

    Attributes:
        message: The kubelet's message (``MountVolume.SetUp failed for volume ...``).
    """

    def __init__(self, volume: str, problem: str) -> None:
        self.message = f'MountVolume.SetUp failed for volume "{volume}" : {problem}'
        super().__init__(self.message)


class UnsupportedVolume(Exception):
    """A volume the local cluster cannot provide: the pod fails with this message."""


def volume_root(state_dir: Path) -> Path:
    """``<state>/volumes``: every volume that outlives a pod lives under it."""
    return state_dir.resolve() / "volumes"


def claim_dir(state_dir: Path, namespace: str, claim: str) -> Path:
    """The host folder of a PersistentVolumeClaim."""
    return volume_root(state_dir) / namespace / "pvc" / claim


def _relative(path: str) -> str:
    """A container-chosen path made relative and free of ``..`` (it cannot climb out)."""
    return posixpath.normpath("/" + path).lstrip("/")


def source_kind(volume: Obj) -> str:
    """The volume source of a volume (``emptyDir``...), or ``""`` when it names none."""
    kinds = [k for k in volume if k != "name" and volume.get(k) is not None]
    return kinds[0] if len(kinds) == 1 else ""


def claim_problem(store: Store, pod: Obj, nodes: int = 1) -> str | None:
    """The scheduler's message when a PersistentVolumeClaim of the pod is missing or unbound.

    A claim without a status (put into the store directly) counts as bound.
    """
    namespace = pod["metadata"]["namespace"]
    for volume in pod["spec"].get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim is None:
            continue
        stored = store.get("PersistentVolumeClaim", namespace, str(claim))
        if stored is None:
            return f'0/{nodes} nodes are available: persistentvolumeclaim "{claim}" not found.'
        if (stored.get("status") or {}).get("phase") == "Pending":
            return (
                f"0/{nodes} nodes are available: pod has unbound immediate PersistentVolumeClaims."
            )
    return None


def _inside(path: Path, root: Path) -> Path:
    """``path`` resolved, refused unless it stays under ``root`` (a symlink a pod planted)."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise UnsupportedVolume(f"the volume path {path} leads outside {root}")
    return resolved


def _own(workdir: Path, name: str) -> Path:
    """The folder of one of the pod's own volumes (a name cannot lead out of the pod's folder)."""
    return _inside(volumes_dir(workdir) / _relative(name), volumes_dir(workdir))


def _data_of(obj: Obj, secret: bool) -> dict[str, bytes]:
    """The keys of a ConfigMap (``data`` and ``binaryData``) or a Secret (``data`` decoded)."""
    values: dict[str, bytes] = {}
    encoded = "data" if secret else "binaryData"
    for key, value in (obj.get(encoded) or {}).items():
        try:
            values[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            values[str(key)] = str(value).encode()
    plain = "stringData" if secret else "data"
    for key, value in (obj.get(plain) or {}).items():
        values[str(key)] = str(value).encode()
    return values


def _write_files(
    volume: str, folder: Path, source: Obj, values: dict[str, bytes], kind: str
) -> None:
    """Write a ConfigMap's or Secret's keys (or its ``items``) as files into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    mode = int(source.get("defaultMode", 0o644)) & 0o777
    items = source.get("items")
    chosen = [(str(i.get("key", "")), str(i.get("path", "")), i.get("mode")) for i in items or []]
    if items is None:
        chosen = [(key, key, None) for key in values]
    for key, path, item_mode in chosen:
        if key not in values:
            if source.get("optional"):
                continue
            noun = "config" if kind == "configMap" else "secret"
            what = "configmap" if kind == "configMap" else "secret"
            problem = f"{what} references non-existent {noun} key: {key}"
            raise MountPending(volume, problem)
        target = _inside(folder / _relative(path), folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(values[key])
        target.chmod(int(item_mode if item_mode is not None else mode) & 0o777)


def _object_volume(store: Store, namespace: str, volume: Obj, workdir: Path) -> Path:
    """A configMap or secret volume written into the pod's folder."""
    kind = "configMap" if volume.get("configMap") is not None else "secret"
    source = volume[kind]
    name = str(source.get("name" if kind == "configMap" else "secretName") or "")
    stored = store.get("ConfigMap" if kind == "configMap" else "Secret", namespace, name)
    folder = _own(workdir, str(volume["name"]))
    if stored is None:
        if not source.get("optional"):
            raise MountPending(str(volume["name"]), f'{kind.lower()} "{name}" not found')
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    _write_files(str(volume["name"]), folder, source, _data_of(stored, kind == "secret"), kind)
    return folder


def _host_path(state_dir: Path, source: Obj) -> Path:
    """A hostPath volume's folder (or file, for the ``File`` types) under the state directory."""
    root = volume_root(state_dir) / "hostpath"
    kind = str(source.get("type") or "")
    root.mkdir(parents=True, exist_ok=True)
    path = _inside(root / _relative(str(source.get("path") or "")), root)  # before creating it
    if kind in _HOST_PATH_FILES:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(exist_ok=True)
    elif kind in ("", "Directory", "DirectoryOrCreate"):
        path.mkdir(parents=True, exist_ok=True)
    else:
        raise UnsupportedVolume(
            f"hostPath type {kind}: the local cluster provides directories and files only"
        )
    return path


def _nfs(state_dir: Path, source: Obj) -> Path:
    """An NFS export, emulated as a folder shared by every pod that mounts it."""
    server = str(source.get("server") or "")
    if not _SERVER.match(server) or server in (".", ".."):
        raise UnsupportedVolume(f"nfs server {server!r} is not a host name or an address")
    root = volume_root(state_dir) / "nfs"
    root.mkdir(parents=True, exist_ok=True)
    path = _inside(root / server / _relative(str(source.get("path") or "/")), root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def host_folder(store: Store, pod: Obj, volume: Obj, workdir: Path) -> tuple[Path, bool]:
    """The host folder of one pod volume, set up, and whether the source is read-only.

    Raises:
        MountPending: A ConfigMap or Secret (or one of its keys) is missing.
        UnsupportedVolume: A kind of volume the local cluster cannot provide.
    """
    state_dir, namespace = store.state_dir, pod["metadata"]["namespace"]
    name, kind = str(volume.get("name")), source_kind(volume)
    source = volume.get(kind) or {}
    if kind == "emptyDir":
        folder = argo_dir(workdir) if name == ARGO_VOLUME else _own(workdir, name)
        folder.mkdir(parents=True, exist_ok=True)
        return folder, False
    if kind == "persistentVolumeClaim":
        claim = str(source.get("claimName") or "")
        if store.get("PersistentVolumeClaim", namespace, claim) is None:
            raise MountPending(name, f'persistentvolumeclaim "{claim}" not found')
        folder = _inside(claim_dir(state_dir, namespace, claim), volume_root(state_dir))
        folder.mkdir(parents=True, exist_ok=True)
        return folder, bool(source.get("readOnly"))
    if kind == "nfs":
        return _nfs(state_dir, source), bool(source.get("readOnly"))
    if kind == "hostPath":
        return _host_path(state_dir, source), False
    if kind in ("configMap", "secret"):
        return _object_volume(store, namespace, volume, workdir), True
    raise UnsupportedVolume(
        f'volume "{name}" is of kind {kind or "(none)"}: the local cluster cannot provide it '
        f"(it provides {', '.join(SOURCES)})"
    )


def pod_mounts(store: Store, pod: Obj, container: Obj, workdir: Path) -> tuple[Mount, ...]:
    """The container's mounts, each volume's host folder set up (see :func:`host_folder`)."""
    volumes = {str(v.get("name")): v for v in pod["spec"].get("volumes") or []}
    folders: dict[str, tuple[Path, bool]] = {}
    mounts: list[Mount] = []
    for entry in container.get("volumeMounts") or []:
        name = str(entry.get("name"))
        if name not in volumes:  # the API server refused such a pod; an old state file
            raise UnsupportedVolume(f'volumeMounts: volume "{name}" is not declared by the pod')
        if name not in folders:
            folders[name] = host_folder(store, pod, volumes[name], workdir)
        folder, read_only = folders[name]
        host = folder
        if entry.get("subPath"):
            host = _inside(folder / _relative(str(entry["subPath"])), folder)
            if not host.exists():
                host.mkdir(parents=True, exist_ok=True)
        mounts.append(
            Mount(host, str(entry.get("mountPath")), read_only or bool(entry.get("readOnly")))
        )
    return tuple(mounts)
