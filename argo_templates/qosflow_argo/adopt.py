"""When ``ArgoCluster.submit`` may adopt a workflow that already has the segment's name.

A segment's workflow name is deterministic (``<job>-s<segment>``), so a create can answer 409
AlreadyExists. The existing workflow is adopted, never duplicated, when it is the same submit:

* **the same run**: both plan annotations (``qosflow.dev/plan``) carry a ``run`` identity (the
  Airflow provider writes ``{"dag_id", "run_id", "map_index"}``) and they are equal. A re-planned
  run (its plan and submit steps cleared and run again) may have sized the job differently or,
  with a plan-time deadline anchor, computed another deadline; it is still the same job and
  re-attaches to the workflow that runs it;
* without run identities (a direct client, or a workflow made before they existed): a retry of
  the very same submit, with the same deadline annotation, units and total steps.

Anything else is refused (409, not retryable): another run's identity, or without identities a
new deadline (yesterday's workflow under tonight's job name) or other arguments.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from qosflow.core.cluster import (
    ANNOTATION_DEADLINE,
    ANNOTATION_PLAN,
    LABEL_JOB,
    LABEL_SEGMENT,
    SubmitRequest,
)
from qosflow.core.errors import ClusterError
from qosflow_argo.workflow_status import arguments

log = logging.getLogger(__name__)
RUN_KEY = "run"
"""Key of the plan annotation's run identity (any JSON value; equal values: the same run)."""
SAME_SUBMIT = ("units", "steps")


def run_of(doc: dict[str, Any]) -> Any:
    """The run identity in a workflow's plan annotation, ``None`` when it has none."""
    text = ((doc.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLAN)
    try:
        plan = json.loads(text) if text else None
    except ValueError:
        return None
    return plan.get(RUN_KEY) if isinstance(plan, dict) else None


def _refuse(message: str) -> ClusterError:
    return ClusterError(message, status=409)


def check_same_submit(
    existing: dict[str, Any], manifest: dict[str, Any], request: SubmitRequest
) -> None:
    """Raise unless ``existing`` is the workflow ``manifest`` would create (see the module).

    Raises:
        ClusterError: Status 409, not retryable, naming the workflow and what differs.
    """
    labels = (existing.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_JOB) != request.job or labels.get(LABEL_SEGMENT) != str(request.segment):
        raise _refuse(
            f"workflow {request.name} exists but is not segment {request.segment} "
            f"of job {request.job}"
        )
    have_run, want_run = run_of(existing), run_of(manifest)
    if have_run is not None and want_run is not None:
        if have_run != want_run:
            raise _refuse(
                f"workflow {request.name} already exists for another run of job {request.job} "
                f"(run {json.dumps(have_run)}, this submit's {json.dumps(want_run)}): "
                "use a new job name per run (or delete the old workflow)"
            )
        log.info("submit %s: the same run re-planned, re-attaching", request.name)
        return
    _check_same_arguments(existing, manifest, request)


def _check_same_arguments(
    existing: dict[str, Any], manifest: dict[str, Any], request: SubmitRequest
) -> None:
    """Without run identities: adopt only a retry of this very submit."""
    have = ((existing.get("metadata") or {}).get("annotations") or {}).get(
        ANNOTATION_DEADLINE, "<missing>"
    )
    want = manifest["metadata"]["annotations"][ANNOTATION_DEADLINE]
    if have != want:
        raise _refuse(
            f"workflow {request.name} already exists for another run of job {request.job}: "
            f"its deadline is {have}, this submit's is {want}; use a new job name per run "
            "(or delete the old workflow)"
        )
    have_args, want_args = arguments(existing), arguments(manifest)
    differ = [k for k in SAME_SUBMIT if have_args.get(k) != want_args.get(k)]
    if differ:
        shown = ", ".join(f"{k} {have_args.get(k)} != {want_args.get(k)}" for k in differ)
        raise _refuse(
            f"workflow {request.name} already exists with other arguments ({shown}; deadline "
            f"{have}): it is not a retry of this submit"
        )
