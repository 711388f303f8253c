"""Job and cluster specs: valid input freezes, every malformed input names the field and the rule."""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from qosflow.core.errors import SpecError
from qosflow.core.spec import load_cluster, load_job, parse_iso_duration, parse_quantity

NOW = datetime(2026, 11, 29, 22, 0, tzinfo=UTC)
GOOD: dict[str, Any] = {
    "name": "ctr-nightly",
    "total_steps": 20000,
    "deadline": "2026-11-30T06:00:00+00:00",
    "resources": {
        "unit": "cpu",
        "min": 1,
        "max": 16,
        "levels": [1, 2, 4, 8, 16],
        "per_node": 8,
        "memory_per_unit": "2Gi",
    },
    "checkpoint_every_steps": 500,
    "best_effort": False,
    "if_not_guaranteed": "run_best_effort",
}


def with_(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GOOD)
    *parents, leaf = path.split(".")
    node = spec
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return spec


_DELETE = object()

MALFORMED: list[tuple[dict[str, Any], str, str]] = [
    (with_("name", "Ctr"), "name", "RFC 1123"),
    (with_("name", "ctr_nightly"), "name", "RFC 1123"),
    (with_("name", "-ctr"), "name", "RFC 1123"),
    (with_("name", "ctr-"), "name", "RFC 1123"),
    (with_("name", "a" * 64), "name", "at most 63"),
    (with_("name", ""), "name", "at least 1"),
    (with_("name", _DELETE), "name", "is required"),
    (with_("total_steps", 0), "total_steps", ">= 1"),
    (with_("total_steps", -5), "total_steps", ">= 1"),
    (with_("total_steps", "many"), "total_steps", "integer"),
    (with_("total_steps", 1.5), "total_steps", "whole number"),
    (with_("total_steps", _DELETE), "total_steps", "is required"),
    (with_("total_steps", True), "total_steps", "not a boolean"),
    (with_("checkpoint_every_steps", True), "checkpoint_every_steps", "not a boolean"),
    (with_("margin_seconds", False), "margin_seconds", "not a boolean"),
    (with_("deadline", "2026-11-30T06:00:00"), "deadline", "timezone-aware"),
    (with_("deadline", "tomorrow morning"), "deadline", "ISO-8601"),
    (with_("deadline", "P"), "deadline", "ISO-8601 duration"),
    (with_("deadline", "PT"), "deadline", "ISO-8601 duration"),
    (with_("deadline", 42), "deadline", "ISO-8601"),
    (with_("deadline", "2026-11-29T21:00:00+00:00"), "deadline", "after submission"),
    (with_("deadline", _DELETE), "deadline", "is required"),
    (with_("resources.min", 0), "resources.min", "must be >= 1 (got 0)"),
    (with_("resources.max", 0), "resources.max", ">= 1"),
    (with_("resources.max", _DELETE), "resources.max", "is required"),
    (with_("resources.unit", "tpu"), "resources.unit", "one of"),
    (with_("resources.levels", [16, 8]), "resources.levels", "strictly ascending"),
    (with_("resources.levels", [1, 2, 32]), "resources.levels", "within [min, max]"),
    (with_("resources.levels", []), "resources.levels", "must not be empty"),
    (with_("resources.levels", [2, 2]), "resources.levels", "strictly ascending"),
    (with_("resources.levels", "1,2,4"), "resources.levels", "list"),
    (with_("resources.per_node", 0), "resources.per_node", ">= 1"),
    (
        with_("resources.memory_per_unit", "lots"),
        "resources.memory_per_unit",
        "Kubernetes quantity",
    ),
    (with_("resources.memory_per_unit", "0Gi"), "resources.memory_per_unit", "> 0"),
    (with_("resources.gpus", 2), "resources.gpus", "not a known field"),
    (with_("resources", "big"), "resources", "mapping"),
    (with_("resources", _DELETE), "resources", "is required"),
    (with_("checkpoint_every_steps", 0), "checkpoint_every_steps", ">= 1"),
    (with_("best_effort", "sometimes"), "best_effort", "true or false"),
    (with_("if_not_guaranteed", "panic"), "if_not_guaranteed", "one of"),
    (with_("margin_seconds", -1), "margin_seconds", ">= 0"),
    (with_("dwell_seconds", -1), "dwell_seconds", ">= 0"),
    (with_("command", []), "command", "non-empty"),
    (with_("dedline", "PT4H"), "dedline", "not a known field"),
]
MALFORMED.append(
    ({**GOOD, "resources": {**GOOD["resources"], "max": True}}, "resources.max", "not a boolean")
)
MALFORMED.append(
    (
        {**GOOD, "resources": {**GOOD["resources"], "min": 4, "max": 2, "levels": None}},
        "resources.max",
        "must be >= min (got min=4, max=2)",
    )
)


def test_the_issue_example_loads_into_a_frozen_spec() -> None:
    job = load_job(GOOD, now=NOW)
    assert job.name == job.key == "ctr-nightly"
    assert job.resources.levels == (1, 2, 4, 8, 16)
    assert job.deadline == datetime(2026, 11, 30, 6, tzinfo=UTC).timestamp()
    assert job.submitted_at == NOW.timestamp()
    with pytest.raises(AttributeError):
        job.total_steps = 1  # type: ignore[misc]


def test_relative_deadline_counts_from_submission_and_levels_default_to_every_integer() -> None:
    spec = with_("deadline", "PT4H30M")
    spec["resources"] = {"min": 2, "max": 5}
    job = load_job(spec, now=NOW)
    assert job.deadline - job.submitted_at == 4.5 * 3600
    assert job.resources.levels == (2, 3, 4, 5)


def test_best_effort_job_has_no_deadline() -> None:
    job = load_job(with_("best_effort", True), now=NOW)
    assert math.isinf(job.deadline)


@pytest.mark.parametrize(
    ("spec", "field", "rule"), MALFORMED, ids=[f"{i}-{m[1]}" for i, m in enumerate(MALFORMED)]
)
def test_malformed_spec_is_rejected_naming_field_and_rule(
    spec: dict[str, Any], field: str, rule: str
) -> None:
    with pytest.raises(SpecError) as err:
        load_job(spec, now=NOW)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")
    assert rule in str(err.value)


def test_there_are_at_least_thirty_malformed_cases() -> None:
    assert len(MALFORMED) >= 30


def test_yaml_and_json_files_load_and_broken_files_are_named(tmp_path: Path) -> None:
    import json

    import yaml

    from qosflow.cli.files import read_spec

    (tmp_path / "job.yaml").write_text(yaml.safe_dump(GOOD))
    (tmp_path / "job.json").write_text(json.dumps(GOOD))
    assert load_job(read_spec(tmp_path / "job.yaml"), now=NOW) == load_job(
        read_spec(str(tmp_path / "job.json")), now=NOW
    )
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad\.yaml: not valid YAML"):
        read_spec(tmp_path / "bad.yaml")
    with pytest.raises(SpecError, match="cannot read job spec file"):
        read_spec(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_job(read_spec(tmp_path / "list.yaml"), now=NOW)


def test_cluster_spec_from_mapping_and_shorthand() -> None:
    assert load_cluster({"nodes": 4, "units_per_node": 8, "unit": "cpu"}).total_units == 32
    assert load_cluster("16x8").total_units == 128
    with pytest.raises(SpecError, match=r"^nodes: must be >= 1 \(got 0\)"):
        load_cluster({"nodes": 0, "units_per_node": 8})
    with pytest.raises(SpecError, match=r"^unit: must be one of"):
        load_cluster({"nodes": 1, "units_per_node": 8, "unit": "fpga"})


@pytest.mark.parametrize(
    ("text", "seconds"), [("PT4H", 14400), ("P1DT30M", 88200), ("PT90S", 90), ("PT1.5H", 5400)]
)
def test_iso_durations(text: str, seconds: float) -> None:
    assert parse_iso_duration(text).total_seconds() == seconds


@pytest.mark.parametrize(
    ("text", "value"), [("2Gi", 2 * 2**30), ("500m", 0.5), ("1.5G", 1.5e9), ("1000", 1000)]
)
def test_kubernetes_quantities(text: str, value: float) -> None:
    assert float(parse_quantity(text)) == value
