"""Object names as the API server checks them, and the pod directories they map to.

Namespaces are RFC 1123 labels, object names RFC 1123 subdomains, with the API server's messages.
Names reach the file system (``<state-dir>/pods/<namespace>/<pod>/``), so the local cluster checks
them at every door: create, the stored state at start-up, and :func:`pod_dir`, which also resolves
the path and refuses anything outside the pods folder.
"""

from __future__ import annotations

import re
from pathlib import Path

from qosflow.local.errors import LocalClusterError

LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_FIELD_NAME = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]*$")
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character"
)
FIELD_NAME_MESSAGE = (
    "name must consist of alpha-numeric characters or '-', and must start with an alpha-numeric "
    "character (e.g. My-name1-2, 123-NAME)"
)


def namespace_problem(namespace: object) -> str | None:
    """Why ``namespace`` is not a valid namespace (an RFC 1123 label), or ``None``."""
    text = namespace if isinstance(namespace, str) else ""
    if len(text) > 63:
        return f'Invalid value: "{text}": must be no more than 63 characters'
    if not LABEL_RE.match(text):
        return f'Invalid value: "{text}": {LABEL_MESSAGE}'
    return None


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid object name (an RFC 1123 subdomain), or ``None``."""
    text = name if isinstance(name, str) else ""
    if len(text) > 253:
        return f'Invalid value: "{text}": must be no more than 253 characters'
    if not SUBDOMAIN_RE.match(text):
        return f'Invalid value: "{text}": {SUBDOMAIN_MESSAGE}'
    return None


def field_name_problem(name: str) -> str | None:
    """Argo's rule for template, step and task names (``isValidWorkflowFieldName``)."""
    if len(name) > 128:
        return "must be no more than 128 characters"
    if not _FIELD_NAME.match(name):
        return FIELD_NAME_MESSAGE
    return None


def pod_dir(state_dir: Path, namespace: str, name: str) -> Path:
    """``<state-dir>/pods/<namespace>/<name>``, refused unless it is safely inside ``pods/``.

    Raises:
        LocalClusterError: For an invalid namespace or name, or a path outside the pods folder.
    """
    problem = namespace_problem(namespace) or name_problem(name)
    if problem is not None:
        raise LocalClusterError(f"pod {namespace}/{name}: {problem}")
    root = (state_dir / "pods").resolve()
    path = (root / namespace / name).resolve()
    if path.parent.parent != root:
        raise LocalClusterError(f"pod {namespace}/{name}: its directory {path} is outside {root}")
    return path
