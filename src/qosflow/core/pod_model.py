"""The ``pod:`` and ``checkpoint:`` sections of a job spec at the boundary (pydantic).

Shapes are checked here (a mapping where a mapping belongs, strings where Kubernetes wants
strings), and then the rules of :mod:`qosflow.core.pod` (names, references, reserved variables
and paths). Every failure is a :class:`~qosflow.core.errors.SpecError` naming the field path
(``pod.env[1].name``). The inside of Kubernetes objects (a volume source, a toleration, an
affinity) is checked against the Kubernetes schema by the Argo client before anything is sent.

``env`` takes Kubernetes' list of ``EnvVar`` objects, or a mapping of names to string values as a
shorthand; ``image_pull_secrets`` takes secret names or ``{name: ...}`` objects.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from qosflow.core.field_errors import StrictModel
from qosflow.core.pod import (
    DEFAULT_CHECKPOINT_PATH,
    Checkpoint,
    PodSettings,
    PullPolicy,
    check_checkpoint_path,
    check_env,
    check_metadata,
    check_volumes,
    label_name_problem,
    subdomain_problem,
)

Json = dict[str, Any]


def _objects(value: Any, what: str) -> list[Json]:
    if not isinstance(value, list):
        raise ValueError(f"must be a list of {what} (got {type(value).__name__})")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise ValueError(f"item {index} must be a mapping (got {item!r})")
    return [dict(item) for item in value]


class PodModel(StrictModel):
    """Boundary model of ``pod:``."""

    image_pull_policy: PullPolicy | None = None
    image_pull_secrets: list[str | dict[str, str]] | None = None
    env: list[Json] = Field(default_factory=list)
    env_from: list[Json] = Field(default_factory=list)
    volumes: list[Json] = Field(default_factory=list)
    volume_mounts: list[Json] = Field(default_factory=list)
    node_selector: dict[str, str] | None = None
    tolerations: list[Json] | None = None
    affinity: Json | None = None
    service_account_name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> list[Json]:
        if isinstance(value, dict):
            return [{"name": str(k), "value": v} for k, v in value.items()]
        return _objects(value, "EnvVar objects like {name: X, value: '1'}")

    @field_validator("env_from", mode="before")
    @classmethod
    def _env_from(cls, value: Any) -> list[Json]:
        return _objects(value, "EnvFromSource objects like {secretRef: {name: s3}}")

    @field_validator("volumes", mode="before")
    @classmethod
    def _volumes(cls, value: Any) -> list[Json]:
        return _objects(value, "Volume objects like {name: ckpt, persistentVolumeClaim: {...}}")

    @field_validator("volume_mounts", mode="before")
    @classmethod
    def _mounts(cls, value: Any) -> list[Json]:
        return _objects(value, "VolumeMount objects like {name: data, mountPath: /data}")

    @field_validator("tolerations", mode="before")
    @classmethod
    def _tolerations(cls, value: Any) -> list[Json] | None:
        return None if value is None else _objects(value, "Toleration objects")

    @field_validator("image_pull_secrets")
    @classmethod
    def _secrets(cls, value: list[str | dict[str, str]] | None) -> list[str] | None:
        if value is None:
            return None
        names = [v if isinstance(v, str) else str(v.get("name", "")) for v in value]
        for name in names:
            problem = subdomain_problem(name)
            if problem is not None:
                raise ValueError(f"a secret name {problem}")
        return names

    @field_validator("service_account_name")
    @classmethod
    def _account(cls, value: str | None) -> str | None:
        problem = None if value is None else subdomain_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    def to_settings(self) -> PodSettings:
        """Check the rules between fields and freeze.

        Raises:
            SpecError: Naming the field (``pod.env[1].name``) and the rule.
        """
        check_env(self.env)
        check_volumes(self.volumes, self.volume_mounts)
        check_metadata(self.labels, "pod.labels", labels=True)
        check_metadata(self.annotations, "pod.annotations", labels=False)
        check_metadata(self.node_selector or {}, "pod.node_selector", labels=True)
        secrets = self.image_pull_secrets
        return PodSettings(
            image_pull_policy=self.image_pull_policy,
            image_pull_secrets=None if secrets is None else tuple(str(s) for s in secrets),
            env=tuple(self.env),
            env_from=tuple(self.env_from),
            volumes=tuple(self.volumes),
            volume_mounts=tuple(self.volume_mounts),
            node_selector=None if self.node_selector is None else dict(self.node_selector),
            tolerations=None if self.tolerations is None else tuple(self.tolerations),
            affinity=None if self.affinity is None else dict(self.affinity),
            service_account_name=self.service_account_name,
            labels=dict(self.labels),
            annotations=dict(self.annotations),
        )


class CheckpointModel(StrictModel):
    """Boundary model of ``checkpoint:``."""

    volume: str
    path: str = DEFAULT_CHECKPOINT_PATH

    @field_validator("volume")
    @classmethod
    def _volume(cls, value: str) -> str:
        problem = label_name_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    def to_checkpoint(self, pod: PodSettings) -> Checkpoint:
        """Freeze (the path is checked against the pod's mounts)."""
        checkpoint = Checkpoint(self.volume, self.path)
        check_checkpoint_path(checkpoint, pod.volume_mounts)
        return checkpoint
