"""Cluster specifications: what ``qosflow plan --cluster`` plans a job against.

``load_cluster`` turns a mapping (or ``"NODESxUNITS"``) into the frozen :class:`ClusterSpec`;
:meth:`ClusterSpec.refusal` names the job's field a cluster cannot give. Errors are
:class:`~qosflow.core.errors.SpecError`, naming the field and the rule, as for job specs
(:mod:`qosflow.core.spec`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import Field, ValidationError

from qosflow.core.errors import SpecError
from qosflow.core.field_errors import StrictModel, as_mapping, spec_error
from qosflow.core.spec import DEFAULT_PER_NODE, Count, JobSpec, Unit


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A homogeneous cluster: ``nodes`` × ``units_per_node`` units of one kind."""

    nodes: int
    units_per_node: int
    unit: Unit

    @property
    def total_units(self) -> int:
        """All units of the cluster."""
        return self.nodes * self.units_per_node

    def refusal(self, job: JobSpec) -> SpecError | None:
        """Why ``job``'s resources cannot be what it gets here, naming the job's field, or None.

        A job is planned against a cluster (``qosflow plan --cluster``): units of a kind the
        cluster lacks, nodes larger than its nodes or more units than it has would give a plan
        for a cluster that does not exist.
        """
        res, have = job.resources, f"the cluster's {self.nodes}x{self.units_per_node} {self.unit}"
        if res.unit != self.unit:
            return SpecError(
                "resources.unit", f"the cluster has {self.unit} units, the job asks for {res.unit}"
            )
        if res.per_node > self.units_per_node:
            default = (
                f"; {DEFAULT_PER_NODE} is the default" if res.per_node == DEFAULT_PER_NODE else ""
            )
            return SpecError(
                "resources.per_node",
                f"must be <= {self.units_per_node}, the units per node of {have} "
                f"(got {res.per_node}{default})",
            )
        if res.max > self.total_units:
            return SpecError(
                "resources.max",
                f"must be <= {self.total_units}, all the units of {have} (got {res.max})",
            )
        return None


class ClusterModel(StrictModel):
    """Boundary model of a cluster spec."""

    nodes: Count = Field(ge=1, le=100_000)
    units_per_node: Count = Field(ge=1, le=4096)
    unit: Unit = "cpu"

    def to_spec(self) -> ClusterSpec:
        """Freeze."""
        return ClusterSpec(self.nodes, self.units_per_node, self.unit)


def load_cluster(data: Any) -> ClusterSpec:
    """Validate a cluster spec: a mapping, or ``"NODESxUNITS"`` like ``"16x8"``.

    Raises:
        SpecError: Naming the field path and the rule.
    """
    if isinstance(data, str) and re.fullmatch(r"\d+x\d+", data):
        nodes, per = data.split("x")
        data = {"nodes": int(nodes), "units_per_node": int(per)}
    mapping = as_mapping(data, "cluster spec")
    try:
        return ClusterModel.model_validate(mapping).to_spec()
    except ValidationError as exc:
        raise spec_error(exc, ClusterModel) from None
