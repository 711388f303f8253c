"""``QosflowArgoHook``: an Airflow connection of type ``qosflow_argo`` turned into an ``ArgoCluster``.

Connection fields:

* ``host`` — Argo Server URL (``https://argo-server.argo:2746``; the local cluster's ``argo_url``);
* ``password`` — bearer token for the Argo Server and the Kubernetes API;
* extras ``namespace`` (default ``qosflow``), ``kube_url`` (Kubernetes API URL) or ``kubeconfig``
  (path), ``verify_ssl`` (default true), ``ca_cert`` (CA bundle path), ``history_url`` (SQLAlchemy
  URL of the history store, default ``sqlite:///.qosflow/history.db``);
* cluster-wide defaults for what a job spec leaves unset (:class:`qosflow.core.pod.PodDefaults`):
  ``image`` (the training image), ``image_pull_secrets`` (a list of Secret names),
  ``checkpoint_claim`` (a PersistentVolumeClaim every job without ``checkpoint:`` keeps its
  checkpoints on) and ``checkpoint_path`` (where it is mounted, default
  ``/var/lib/qosflow/checkpoints``), ``tolerations`` (a list of Kubernetes tolerations),
  ``node_selector`` (a mapping); and ``gpu_resource`` (the extended resource a GPU is, default
  ``nvidia.com/gpu``);
* ``report_url`` — where the finish step stores its reports and the api-server's qosflow view
  reads them: a folder (relative: under ``AIRFLOW_HOME``) or an object-storage URL
  (:mod:`qosflow_airflow.report_store`); default ``$AIRFLOW_HOME/qosflow/reports``.

Nothing is contacted until :meth:`QosflowArgoHook.get_cluster` is called.

Secrets (the token, a password in ``history_url``) stay in the connection: a
:class:`ClusterConfig`'s repr shows neither (:func:`masked_url`), the steps put neither in XCom,
and reading a connection registers the history password with Airflow's log masker, like Airflow
does for the connection's own password.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from qosflow.core.errors import SpecError
from qosflow.core.pod import DEFAULT_CHECKPOINT_PATH, PodDefaults

if TYPE_CHECKING:
    from qosflow.store.history import HistoryStore
    from qosflow_argo import ArgoCluster

DEFAULT_CONN_ID = "qosflow_default"
DEFAULT_NAMESPACE = "qosflow"
DEFAULT_HISTORY_URL = "sqlite:///.qosflow/history.db"
LOCAL_CHECKPOINT_CLAIM = "qosflow-checkpoints"
"""The claim ``qosflow local up`` (and the demo) create for the local cluster's checkpoints."""
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Everything a ``qosflow_argo`` connection says.

    Attributes:
        argo_url: Argo Server base URL.
        namespace: Namespace of the workflows.
        token: Bearer token, ``None`` when the API needs none.
        kube_url: Kubernetes API URL, ``None`` when ``kubeconfig`` is used.
        kubeconfig: Path of a kubeconfig file, ``None`` when ``kube_url`` is used.
        verify_ssl: Whether TLS certificates are verified.
        ca_cert: CA bundle path, ``None`` for the system store.
        history_url: SQLAlchemy URL of the history store.
        defaults: The cluster's defaults for what a job spec leaves unset.
        gpu_resource: The extended resource a GPU is on this cluster.
        report_url: Where reports are stored (``None``: ``$AIRFLOW_HOME/qosflow/reports``).
    """

    argo_url: str
    namespace: str
    token: str | None
    kube_url: str | None
    kubeconfig: str | None
    verify_ssl: bool
    ca_cert: str | None
    history_url: str
    defaults: PodDefaults = field(default_factory=PodDefaults)
    gpu_resource: str = "nvidia.com/gpu"
    report_url: str | None = None

    def __repr__(self) -> str:
        """Every field but the secrets: no token, the history URL with its password masked."""
        return (
            f"ClusterConfig(argo_url={self.argo_url!r}, namespace={self.namespace!r}, "
            f"token={'***' if self.token else None}, kube_url={self.kube_url!r}, "
            f"kubeconfig={self.kubeconfig!r}, verify_ssl={self.verify_ssl!r}, "
            f"ca_cert={self.ca_cert!r}, history_url={masked_url(self.history_url)!r}, "
            f"defaults={self.defaults!r}, gpu_resource={self.gpu_resource!r}, "
            f"report_url={self.report_url!r})"
        )


def url_passwords(url: str) -> list[str]:
    """The password of a SQLAlchemy URL as written and decoded; ``[]`` when it has none."""
    from urllib.parse import quote_plus

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        password = make_url(url).password
    except (ArgumentError, ValueError):
        return []
    if not password:
        return []
    return sorted({str(password), quote_plus(str(password))})


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (what logs and the UI may show)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return str(make_url(url).render_as_string(hide_password=True))
    except (ArgumentError, ValueError):
        return "<not a SQLAlchemy URL>"


def mask_in_logs(config: ClusterConfig) -> None:
    """Register the config's secrets with Airflow's log masker (a no-op outside Airflow)."""
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - the provider always runs inside Airflow
        return
    for secret in (config.token, *url_passwords(config.history_url)):
        if secret:
            mask_secret(secret)


def _flag(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SpecError(field, f"must be true or false (got {value!r})")


def _text(extras: Mapping[str, Any], key: str) -> str | None:
    value = extras.get(key)
    return None if value in (None, "") else str(value)


def _json_field(extras: Mapping[str, Any], key: str, kind: type) -> Any:
    """An extra that holds a JSON list or object (given as JSON text or already parsed)."""
    value = extras.get(key)
    if value in (None, ""):
        return kind()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpecError(f"extra.{key}", f"must be JSON ({exc.msg})") from None
    if not isinstance(value, kind):
        raise SpecError(f"extra.{key}", f"must be a JSON {kind.__name__} (got {value!r})")
    return value


def pod_defaults(extras: Mapping[str, Any]) -> PodDefaults:
    """The cluster-wide job defaults a connection's extras set.

    Raises:
        SpecError: Naming ``extra.<key>`` when a value has the wrong shape.
    """
    secrets = extras.get("image_pull_secrets") or []
    if isinstance(secrets, str):
        secrets = [s.strip() for s in secrets.split(",") if s.strip()]
    tolerations = _json_field(extras, "tolerations", list)
    if not all(isinstance(t, dict) for t in tolerations):
        raise SpecError("extra.tolerations", "must be a list of Kubernetes tolerations")
    selector = _json_field(extras, "node_selector", dict)
    return PodDefaults(
        image=_text(extras, "image"),
        image_pull_secrets=tuple(str(s) for s in secrets),
        checkpoint_claim=_text(extras, "checkpoint_claim"),
        checkpoint_path=_text(extras, "checkpoint_path") or DEFAULT_CHECKPOINT_PATH,
        tolerations=tuple(tolerations),
        node_selector={str(k): str(v) for k, v in selector.items()},
    )


def config_from_connection(
    *, host: str | None, password: str | None, extra: str | Mapping[str, Any] | None
) -> ClusterConfig:
    """Validate a connection's fields into a :class:`ClusterConfig`.

    Raises:
        SpecError: Naming the field (``host``, ``extra.verify_ssl``...) when it is unusable.
    """
    if not host:
        raise SpecError("host", "the Argo Server URL is required (e.g. https://argo-server:2746)")
    url = host if "://" in host else f"https://{host}"
    if isinstance(extra, str):
        try:
            extras: Mapping[str, Any] = json.loads(extra) if extra.strip() else {}
        except json.JSONDecodeError as exc:
            raise SpecError("extra", f"must be a JSON object ({exc.msg})") from None
    else:
        extras = extra or {}
    if not isinstance(extras, Mapping):
        raise SpecError("extra", "must be a JSON object")
    return ClusterConfig(
        argo_url=url.rstrip("/"),
        namespace=_text(extras, "namespace") or DEFAULT_NAMESPACE,
        token=password or None,
        kube_url=_text(extras, "kube_url"),
        kubeconfig=_text(extras, "kubeconfig"),
        verify_ssl=_flag(extras.get("verify_ssl", True), "extra.verify_ssl"),
        ca_cert=_text(extras, "ca_cert"),
        history_url=_text(extras, "history_url") or DEFAULT_HISTORY_URL,
        defaults=pod_defaults(extras),
        gpu_resource=_text(extras, "gpu_resource") or "nvidia.com/gpu",
        report_url=_text(extras, "report_url"),
    )


def local_connection(local: Any, *, history_url: str) -> dict[str, Any]:
    """The ``qosflow_argo`` connection (as ``AIRFLOW_CONN_*`` JSON) to a running local cluster.

    ``local``: a started :class:`qosflow.local.cluster.LocalCluster` (its URLs, token and
    namespace). Jobs keep their checkpoints on the claim :data:`LOCAL_CHECKPOINT_CLAIM`, which
    ``qosflow local up`` creates (:func:`qosflow_argo.installer.Installer.ensure` with a
    checkpoint claim); the image is the reference trainer's (the local cluster runs the command
    with this machine's Python and ignores images).
    """
    from qosflow_argo.manifests import REFERENCE_IMAGE

    return {
        "conn_type": "qosflow_argo",
        "host": local.argo_url,
        "password": local.token,
        "extra": {
            "namespace": local.namespace,
            "kube_url": local.kube_url,
            "history_url": history_url,
            "image": REFERENCE_IMAGE,
            "checkpoint_claim": LOCAL_CHECKPOINT_CLAIM,
        },
    }


def cluster_from_config(config: ClusterConfig) -> ArgoCluster:
    """Build the ``ArgoCluster`` client a config describes (imports hera/kubernetes lazily)."""
    from qosflow_argo import ArgoCluster

    return ArgoCluster(
        argo_url=config.argo_url,
        namespace=config.namespace,
        token=config.token,
        kube_url=config.kube_url,
        kubeconfig=config.kubeconfig,
        verify=config.verify_ssl,
        ca_cert=config.ca_cert,
        gpu_resource=config.gpu_resource,
    )


class QosflowArgoHook(BaseHook):
    """Talks to Argo Workflows and Kubernetes through a ``qosflow_argo`` connection.

    Args:
        qosflow_conn_id: The connection id (default ``qosflow_default``).
    """

    conn_name_attr = "qosflow_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "qosflow_argo"
    hook_name = "qosflow (Argo Workflows + Kubernetes)"

    def __init__(self, qosflow_conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.qosflow_conn_id = qosflow_conn_id

    @cached_property
    def config(self) -> ClusterConfig:
        """The validated connection."""
        conn = self.get_connection(self.qosflow_conn_id)
        config = config_from_connection(host=conn.host, password=conn.password, extra=conn.extra)
        mask_in_logs(config)
        return config

    def get_conn(self) -> ArgoCluster:
        """Airflow's generic accessor; same as :meth:`get_cluster`."""
        return self.get_cluster()

    def get_cluster(self) -> ArgoCluster:
        """A new ``ArgoCluster`` for this connection (implements ClusterView and Actuator)."""
        return cluster_from_config(self.config)

    def get_history(self) -> HistoryStore:
        """The history store named by the connection's ``history_url`` extra."""
        from qosflow.store.history import HistoryStore

        return HistoryStore(self.config.history_url)
