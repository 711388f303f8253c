"""Node selection: ``nodeSelector`` and required node affinity against one node's labels.

As the scheduler's ``NodeAffinity`` filter does it: every ``nodeSelector`` label must be on the
node with that value, and when ``affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``
is set, one of its ``nodeSelectorTerms`` must match (terms are ORed, the expressions of a term
ANDed; a term with no expression matches nothing). Preferred affinity only ranks nodes (the local
cluster ignores it), and the nodes have no taints, so tolerations never keep a pod away.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qosflow.local.store import Obj

AFFINITY_REASON = "node(s) didn't match Pod's node affinity/selector"
"""The ``NodeAffinity`` filter's reason for one node (counted in the scheduler's message)."""


def _integer(text: Any) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


def expression_matches(expression: Obj, labels: Mapping[str, str]) -> bool:
    """One ``matchExpressions`` item (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt``)."""
    key, operator = str(expression.get("key") or ""), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        have, bound = _integer(labels[key]), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def term_matches(term: Obj, labels: Mapping[str, str], node_name: str) -> bool:
    """One ``nodeSelectorTerm``: its ``matchExpressions`` over labels, ``matchFields`` over the name."""
    expressions = list(term.get("matchExpressions") or [])
    fields = list(term.get("matchFields") or [])
    if not expressions and not fields:
        return False
    by_name = {"metadata.name": node_name}
    return all(expression_matches(e, labels) for e in expressions) and all(
        str(f.get("key")) == "metadata.name" and expression_matches(f, by_name) for f in fields
    )


def fits_node(pod_spec: Obj, labels: Mapping[str, str], node_name: str) -> bool:
    """Whether a pod may be scheduled on a node with ``labels`` named ``node_name``."""
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(str(k)) != str(v) for k, v in selector.items()):
        return False
    node_affinity = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    terms = required.get("nodeSelectorTerms") or []
    return any(term_matches(t, labels, node_name) for t in terms)
