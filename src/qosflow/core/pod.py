"""Where and how a job's pods run: image pull, environment, volumes, placement, and the checkpoint.

A job spec's ``pod:`` section holds the Kubernetes settings a team's training needs (secrets in
the environment, a dataset volume, a GPU node pool's tolerations...), and ``checkpoint:`` names
the volume the checkpoints live on. Kubernetes objects (an ``env`` entry, a volume, a
toleration, an affinity) are written as Kubernetes writes them (camelCase); qosflow's own keys
are snake_case like the rest of the spec. The rules here are the ones the core can say without
Kubernetes' schemas (names, references between fields, what qosflow itself sets); the Argo client
checks every object against the Kubernetes and Argo schemas before anything is sent
(:mod:`qosflow_argo.manifests`).

**Why the checkpoint must be on a persistent volume.** A rescale by checkpoint-restart, a
priority bump of a running job and a retried pod all start a *new pod*. A pod's own disk (its
container filesystem, an ``emptyDir``) is discarded with it, and a ``hostPath`` stays on one node
while the next pod may start on another, so a checkpoint there is lost and the job restarts from
step 0. :func:`checkpoint_problem` refuses such a spec before anything is submitted.

Cluster-wide defaults (:class:`PodDefaults`, set on the Airflow connection) fill what a job leaves
unset: the image, the pull secrets, the checkpoint claim, tolerations and node selector.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from qosflow.core.errors import SpecError

PullPolicy = Literal["Always", "IfNotPresent", "Never"]
Json = dict[str, Any]

DEFAULT_CHECKPOINT_PATH = "/var/lib/qosflow/checkpoints"
DEFAULT_CHECKPOINT_VOLUME = "qosflow-checkpoints"
TRAINER_ENV = frozenset(
    {
        "QOSFLOW_TOTAL_STEPS",
        "QOSFLOW_RESUME",
        "QOSFLOW_CHECKPOINT_DIR",
        "QOSFLOW_CHECKPOINT_EVERY",
        "QOSFLOW_SEED",
        "QOSFLOW_JOB",
        "QOSFLOW_SEGMENT",
    }
)
"""Variables qosflow sets in every training pod (the trainer's options); a spec may not set them."""
RESERVED_LABEL_PREFIXES = ("qosflow.dev/", "workflows.argoproj.io/")
RESERVED_VOLUMES = frozenset({"var-run-argo", "tmp-dir-argo"})
"""Volume names Argo's executor uses."""
ARGO_PATHS = ("/var/run/argo", "/mainctrfs")

PERSISTENT_SOURCES = ("persistentVolumeClaim", "nfs", "cephfs", "glusterfs", "azureFile")
"""Volume sources that outlive a pod and are reachable from any node."""
NOT_PERSISTENT: dict[str, str] = {
    "emptyDir": "an emptyDir lives and dies with one pod",
    "ephemeral": "an ephemeral volume is deleted with its pod",
    "csi": "an inline CSI volume is ephemeral: it is deleted with its pod",
    "hostPath": "a hostPath stays on one node, and the next segment may start on another",
    "configMap": "a configMap volume is read-only",
    "secret": "a secret volume is read-only",
    "downwardAPI": "a downwardAPI volume is read-only",
    "projected": "a projected volume is read-only",
    "image": "an image volume is read-only",
}

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUALIFIED = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where the checkpoints live.

    Attributes:
        volume: Name of a volume of :attr:`PodSettings.volumes` (a persistent one).
        path: Absolute path the pod mounts it at; each job run keeps its own folder under it.
    """

    volume: str
    path: str = DEFAULT_CHECKPOINT_PATH

    def folder(self, job: str) -> str:
        """The checkpoint folder of one job run (what the trainer gets as its directory)."""
        return f"{self.path.rstrip('/')}/{job}"


@dataclass(frozen=True, slots=True)
class PodSettings:
    """The Kubernetes settings of a job's pods (read-only mappings and tuples).

    ``None`` means "not set": the connection's :class:`PodDefaults` may fill it.

    Attributes:
        image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never``.
        image_pull_secrets: Names of docker-registry Secrets.
        env: Kubernetes ``EnvVar`` objects (``name`` with ``value`` or ``valueFrom``).
        env_from: Kubernetes ``EnvFromSource`` objects (``secretRef``, ``configMapRef``).
        volumes: Kubernetes ``Volume`` objects.
        volume_mounts: Kubernetes ``VolumeMount`` objects of the training container.
        node_selector: Node labels the pods must run on.
        tolerations: Kubernetes ``Toleration`` objects.
        affinity: A Kubernetes ``Affinity`` object.
        service_account_name: The pods' ServiceAccount (default: qosflow's executor account).
        labels: Extra labels of the pods.
        annotations: Extra annotations of the pods.
    """

    image_pull_policy: PullPolicy | None = None
    image_pull_secrets: tuple[str, ...] | None = None
    env: tuple[Json, ...] = ()
    env_from: tuple[Json, ...] = ()
    volumes: tuple[Json, ...] = ()
    volume_mounts: tuple[Json, ...] = ()
    node_selector: Mapping[str, str] | None = None
    tolerations: tuple[Json, ...] | None = None
    affinity: Json | None = None
    service_account_name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def volume(self, name: str) -> Json | None:
        """The declared volume called ``name``, or ``None``."""
        return next((v for v in self.volumes if v.get("name") == name), None)

    def to_spec(self) -> Json:
        """The ``pod:`` mapping of a job spec that loads back into these settings."""
        out: Json = {}
        for key, value in (
            ("image_pull_policy", self.image_pull_policy),
            ("image_pull_secrets", self.image_pull_secrets),
            ("env", self.env),
            ("env_from", self.env_from),
            ("volumes", self.volumes),
            ("volume_mounts", self.volume_mounts),
            ("node_selector", self.node_selector),
            ("tolerations", self.tolerations),
            ("affinity", self.affinity),
            ("service_account_name", self.service_account_name),
            ("labels", self.labels),
            ("annotations", self.annotations),
        ):
            if value is None or (isinstance(value, tuple | dict) and not value):
                continue
            out[key] = _plain(value)
        return out


@dataclass(frozen=True, slots=True)
class PodDefaults:
    """Cluster-wide settings (the Airflow connection's) for what a job spec leaves unset.

    Attributes:
        image: Training image of jobs that name none.
        image_pull_secrets: Pull secrets of jobs that name none.
        checkpoint_claim: A PersistentVolumeClaim for the checkpoints of jobs without
            ``checkpoint:`` (mounted as volume :data:`DEFAULT_CHECKPOINT_VOLUME`).
        checkpoint_path: Where that claim is mounted.
        tolerations: Tolerations of jobs that set none (e.g. a GPU pool's taint).
        node_selector: Node selector of jobs that set none.
    """

    image: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    checkpoint_claim: str | None = None
    checkpoint_path: str = DEFAULT_CHECKPOINT_PATH
    tolerations: tuple[Json, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)


def _plain(value: Any) -> Any:
    """JSON-shaped copy (tuples become lists, mappings dicts)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def with_defaults(
    pod: PodSettings, checkpoint: Checkpoint | None, defaults: PodDefaults
) -> tuple[PodSettings, Checkpoint | None]:
    """Fill what the job left unset from the cluster's defaults (the job's own values win).

    Raises:
        SpecError: The default checkpoint volume's name is taken by a volume of the job.
    """
    changes: dict[str, Any] = {}
    if pod.image_pull_secrets is None and defaults.image_pull_secrets:
        changes["image_pull_secrets"] = defaults.image_pull_secrets
    if pod.tolerations is None and defaults.tolerations:
        changes["tolerations"] = defaults.tolerations
    if pod.node_selector is None and defaults.node_selector:
        changes["node_selector"] = dict(defaults.node_selector)
    if checkpoint is None and defaults.checkpoint_claim:
        if pod.volume(DEFAULT_CHECKPOINT_VOLUME) is not None:
            raise SpecError(
                "pod.volumes",
                f"{DEFAULT_CHECKPOINT_VOLUME!r} is the name of the connection's checkpoint volume: "
                "rename this volume, or name it in checkpoint.volume",
            )
        claim = {"claimName": defaults.checkpoint_claim}
        volume = {"name": DEFAULT_CHECKPOINT_VOLUME, "persistentVolumeClaim": claim}
        changes["volumes"] = (*pod.volumes, volume)
        checkpoint = Checkpoint(DEFAULT_CHECKPOINT_VOLUME, defaults.checkpoint_path)
    return replace(pod, **changes), checkpoint


def checkpoint_problem(pod: PodSettings, checkpoint: Checkpoint | None) -> SpecError | None:
    """Why these settings would lose the job's checkpoints, or ``None`` when they keep them."""
    if checkpoint is None:
        return SpecError(
            "checkpoint",
            "is required: without a checkpoint volume the trainer writes its checkpoints to the "
            "pod's own disk, which Kubernetes discards with the pod, so a rescale by "
            "checkpoint-restart, a priority bump or a retried pod would start again from step 0. "
            "Declare a PersistentVolumeClaim in pod.volumes and name it in checkpoint.volume, or "
            "set checkpoint_claim on the connection",
        )
    volume = pod.volume(checkpoint.volume)
    if volume is None:
        declared = ", ".join(str(v.get("name")) for v in pod.volumes) or "none"
        return SpecError(
            "checkpoint.volume",
            f"{checkpoint.volume!r} is not a volume of pod.volumes (declared: {declared})",
        )
    kind = next((k for k in volume if k != "name"), "")
    if kind in NOT_PERSISTENT:
        return SpecError(
            "checkpoint.volume",
            f"{checkpoint.volume!r} cannot hold checkpoints: {NOT_PERSISTENT[kind]}, so the next "
            "segment of the job (after a checkpoint-restart or a retry) would not find them. Use "
            "a PersistentVolumeClaim (ReadWriteMany, or ReadWriteOnce for one pod at a time)",
        )
    if kind not in PERSISTENT_SOURCES:
        return SpecError(
            "checkpoint.volume",
            f"{checkpoint.volume!r} is a {kind or 'volume without a source'}; qosflow keeps "
            f"checkpoints only on {', '.join(PERSISTENT_SOURCES)} volumes (a PersistentVolumeClaim "
            "works with every storage backend)",
        )
    if (volume.get(kind) or {}).get("readOnly"):
        return SpecError(
            "checkpoint.volume", f"{checkpoint.volume!r} is read-only; checkpoints are written"
        )
    return None


# --------------------------------------------------------------------------- field rules


def _name_rule(value: str, pattern: re.Pattern[str], what: str, limit: int) -> str | None:
    if len(value) > limit:
        return f"must be at most {limit} characters (got {len(value)})"
    if not pattern.match(value):
        return f"must be {what} (got {value!r})"
    return None


def label_name_problem(value: str) -> str | None:
    """Why ``value`` is not an RFC 1123 label (volume names), or ``None``."""
    return _name_rule(value, _LABEL, "an RFC 1123 label: lower-case letters, digits and '-'", 63)


def subdomain_problem(value: str) -> str | None:
    """Why ``value`` is not an RFC 1123 subdomain (Secret, ConfigMap, account names), or ``None``."""
    return _name_rule(value, _SUBDOMAIN, "an RFC 1123 subdomain", 253)


def check_env(entries: Sequence[Json], where: str = "pod.env") -> None:
    """Names are Kubernetes variable names, each set once, none that qosflow or Argo sets."""
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        name = str(entry.get("name", ""))
        at = f"{where}[{index}].name"
        if not _ENV_NAME.match(name):
            raise SpecError(
                at,
                "must be a variable name of letters, digits, '_', '-' or '.', not starting "
                f"with a digit (got {name!r})",
            )
        if name in TRAINER_ENV:
            raise SpecError(
                at,
                f"{name} is set by qosflow (the trainer's steps, resume and checkpoint options "
                "come from the job spec: total_steps, checkpoint.path, checkpoint_every_steps)",
            )
        if name.startswith("ARGO_"):
            raise SpecError(at, f"{name}: ARGO_* variables are set by Argo's executor")
        if name in seen:
            raise SpecError(at, f"{name} is set twice")
        seen.add(name)
        if ("value" in entry) == ("valueFrom" in entry):
            raise SpecError(f"{where}[{index}]", "needs exactly one of value and valueFrom")
        if "value" in entry and not isinstance(entry["value"], str):
            raise SpecError(
                f"{where}[{index}].value",
                f'must be a string (quote it in YAML, e.g. "1"; got {entry["value"]!r})',
            )


def check_volumes(volumes: Sequence[Json], mounts: Sequence[Json]) -> None:
    """Volume names are unique labels with one source; every mount names a declared volume."""
    _check_mounts(mounts, _volume_names(volumes))


def _volume_names(volumes: Sequence[Json]) -> set[str]:
    names: set[str] = set()
    for index, volume in enumerate(volumes):
        name = str(volume.get("name", ""))
        problem = label_name_problem(name)
        if problem is not None:
            raise SpecError(f"pod.volumes[{index}].name", problem)
        if name in RESERVED_VOLUMES:
            raise SpecError(f"pod.volumes[{index}].name", f"{name} is used by Argo's executor")
        if name in names:
            raise SpecError(f"pod.volumes[{index}].name", f"{name} is declared twice")
        names.add(name)
        sources = [k for k in volume if k != "name"]
        if len(sources) != 1:
            raise SpecError(
                f"pod.volumes[{index}]",
                f"needs exactly one volume source such as persistentVolumeClaim (got {sources})",
            )
    return names


def _check_mounts(mounts: Sequence[Json], names: set[str]) -> None:
    paths: set[str] = set()
    for index, mount in enumerate(mounts):
        at = f"pod.volume_mounts[{index}]"
        if mount.get("name") not in names:
            raise SpecError(f"{at}.name", f"{mount.get('name')!r} is not a volume of pod.volumes")
        path = str(mount.get("mountPath", ""))
        if not path.startswith("/"):
            raise SpecError(f"{at}.mountPath", f"must be an absolute path (got {path!r})")
        if any(path == p or path.startswith(p + "/") for p in ARGO_PATHS):
            raise SpecError(f"{at}.mountPath", f"{path} is used by Argo's executor")
        if path.rstrip("/") in paths:
            raise SpecError(f"{at}.mountPath", f"{path} is mounted twice")
        paths.add(path.rstrip("/"))
        sub = str(mount.get("subPath", ""))
        if sub.startswith("/") or ".." in sub.split("/"):
            raise SpecError(f"{at}.subPath", f"must be a relative path without '..' (got {sub!r})")


def check_metadata(values: Mapping[str, str], where: str, *, labels: bool) -> None:
    """Label or annotation keys are qualified names outside qosflow's and Argo's prefixes."""
    for key, value in values.items():
        prefix, _, name = key.rpartition("/")
        at = f"{where}.{key}"
        if any(key.startswith(p) for p in RESERVED_LABEL_PREFIXES):
            raise SpecError(at, f"the prefix {prefix}/ is set by qosflow and Argo")
        if (prefix and subdomain_problem(prefix)) or not _QUALIFIED.match(name) or len(name) > 63:
            raise SpecError(
                at, "must be a qualified name like team or example.com/team (at most 63 chars)"
            )
        if not isinstance(value, str):
            raise SpecError(at, f"must be a string (got {value!r})")
        if labels and (len(value) > 63 or not _LABEL_VALUE.match(value)):
            raise SpecError(
                at,
                "a label value is at most 63 letters, digits, '-', '_' or '.', starting and "
                f"ending with a letter or digit (got {value!r})",
            )


def check_checkpoint_path(checkpoint: Checkpoint, mounts: Sequence[Json]) -> None:
    """The checkpoint path is absolute and not a path another mount already uses."""
    path = checkpoint.path.rstrip("/") or "/"
    if not checkpoint.path.startswith("/") or path == "/":
        raise SpecError(
            "checkpoint.path", f"must be an absolute path below / (got {checkpoint.path!r})"
        )
    if any(path == p or path.startswith(p + "/") for p in ARGO_PATHS):
        raise SpecError("checkpoint.path", f"{path} is used by Argo's executor")
    for index, mount in enumerate(mounts):
        if str(mount.get("mountPath", "")).rstrip("/") == path:
            raise SpecError(
                f"pod.volume_mounts[{index}].mountPath",
                f"{path} is checkpoint.path, where qosflow mounts the checkpoint volume itself",
            )
