"""Job and cluster specs: valid input freezes, every malformed input names the field and the rule."""

from __future__ import annotations

import copy
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qosflow.core.cluster_spec import load_cluster
from qosflow.core.deadline import parse_iso_duration
from qosflow.core.errors import SpecError
from qosflow.core.spec import load_job, parse_quantity

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
    (with_("dedline", "PT4H"), "dedline", "not a known field; did you mean deadline?"),
    (with_("deadline", "06:00 Mars/Olympus"), "deadline", "not an IANA zone name"),
    (with_("deadline", "2026-11-30"), "deadline", "time of day"),
    (with_("deadline", 360), "deadline", 'quote it: "06:00"'),
    (with_("deadline", "25:00"), "deadline", "clock time HH:MM"),
    (with_("deadline", "P99999999D"), "deadline", "after the year 9999"),
    (with_("deadline", "9999-12-31T23:00:00-05:00"), "deadline", "after the year 9999"),
    (with_("deadline", "2026-11-30T06:00+02:00[Europe/Amsterdam]"), "deadline", "+0100"),
    (with_("timezone", "CET+1"), "timezone", "not an IANA zone name"),
    (with_("timezone", 1), "timezone", "must be a string"),
    (with_("checkpoint_every_steps", 20001), "checkpoint_every_steps", "<= total_steps (20000)"),
    (with_("margin_seconds", 8 * 3600), "margin_seconds", "shorter than the 8 h"),
    (with_("total_steps", 10**13), "total_steps", "<= 1000000000000"),
    (with_("total_steps", float("inf")), "total_steps", "finite"),
    (with_("total_steps", 1e300), "total_steps", "too large"),
    (with_("name", "x" * 10_000), "name", "at most 63 characters (got 10000)"),
    (with_("resources.per_nodes", 8), "resources.per_nodes", "did you mean per_node?"),
    (with_("pod", {"envv": {}}), "pod.envv", "did you mean env?"),
    (with_("checkpoint", {"volum": "ckpt"}), "checkpoint.volum", "did you mean volume?"),
    ({**GOOD, 7: "x"}, "7", "is not a known field: field names are text"),
]
MALFORMED += [
    (
        with_("step_seconds_estimate_at", 8),
        "step_seconds_estimate_at",
        "needs step_seconds_estimate",
    ),
    (
        {**GOOD, "step_seconds_estimate": 2.0, "step_seconds_estimate_at": 3},
        "step_seconds_estimate_at",
        "must be one of the job's sizes [1, 2, 4, 8, 16] (got 3)",
    ),
    (with_("step_seconds_estimate_at", 0), "step_seconds_estimate_at", ">= 1"),
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


def test_a_misspelt_field_is_named_as_unknown_not_as_the_missing_real_one() -> None:
    spec = with_("total_steps", _DELETE)
    spec["total_step"] = 20000
    with pytest.raises(SpecError) as err:
        load_job(spec, now=NOW)
    assert str(err.value) == "total_step: is not a known field; did you mean total_steps?"


def test_an_unknown_field_like_none_lists_the_fields_there() -> None:
    with pytest.raises(SpecError, match=r"^resources\.zzz: .*the fields here are levels, max"):
        load_job(with_("resources.zzz", 1), now=NOW)


@pytest.mark.parametrize(
    ("deadline", "timezone", "due"),
    [
        ("06:00", None, datetime(2026, 11, 30, 6, tzinfo=UTC)),  # the next 06:00 UTC
        ("23:30", None, datetime(2026, 11, 29, 23, 30, tzinfo=UTC)),  # later today
        ("22:00", None, datetime(2026, 11, 30, 22, tzinfo=UTC)),  # now: the next one, tomorrow
        ("06:00:30", None, datetime(2026, 11, 30, 6, 0, 30, tzinfo=UTC)),
        ("06:00", "Europe/Amsterdam", datetime(2026, 11, 30, 5, tzinfo=UTC)),  # CET, +01:00
        ("06:00 Europe/Amsterdam", None, datetime(2026, 11, 30, 5, tzinfo=UTC)),
        ("2026-11-30T06:00", "Europe/Amsterdam", datetime(2026, 11, 30, 5, tzinfo=UTC)),
        ("2026-11-30T06:00 Europe/Amsterdam", None, datetime(2026, 11, 30, 5, tzinfo=UTC)),
        ("2026-11-30T06:00[America/New_York]", None, datetime(2026, 11, 30, 11, tzinfo=UTC)),
        ("2026-11-30T06:00+01:00[Europe/Amsterdam]", None, datetime(2026, 11, 30, 5, tzinfo=UTC)),
        ("2026-11-30T06:00:00+00:00", "Asia/Tokyo", datetime(2026, 11, 30, 6, tzinfo=UTC)),
        (datetime(2026, 11, 30, 6), "Europe/Amsterdam", datetime(2026, 11, 30, 5, tzinfo=UTC)),
    ],
)
def test_clock_times_and_zone_names(deadline: Any, timezone: str | None, due: datetime) -> None:
    spec = with_("deadline", deadline)
    if timezone is not None:
        spec["timezone"] = timezone
    assert load_job(spec, now=NOW).deadline == due.timestamp()


def test_a_local_time_without_a_zone_says_how_to_give_one() -> None:
    with pytest.raises(SpecError, match=r"timezone-aware.*timezone: Europe/Amsterdam"):
        load_job(with_("deadline", "2026-11-30T06:00"), now=NOW)


def test_the_default_checkpoint_interval_never_passes_the_end_and_an_explicit_one_may_equal_it() -> (
    None
):
    short = with_("checkpoint_every_steps", _DELETE)
    short["total_steps"] = 100
    assert load_job(short, now=NOW).checkpoint_every_steps == 100
    assert load_job(with_("checkpoint_every_steps", 20000), now=NOW).checkpoint_every_steps == 20000


def test_the_default_margin_longer_than_the_window_is_named_as_the_default() -> None:
    with pytest.raises(
        SpecError, match=r"^margin_seconds: .* the 20 s .*\(got 30 s, the default\)"
    ):
        load_job(with_("deadline", "PT20S"), now=NOW)
    assert math.isinf(
        load_job({**with_("deadline", "PT20S"), "best_effort": True}, now=NOW).deadline
    )


@pytest.mark.parametrize(
    ("cluster", "field", "rule"),
    [
        ({"nodes": 4, "units_per_node": 8, "unit": "gpu"}, "resources.unit", "has gpu units"),
        ({"nodes": 8, "units_per_node": 4}, "resources.per_node", "must be <= 4"),
        ({"nodes": 1, "units_per_node": 8}, "resources.max", "must be <= 8, all the units"),
    ],
)
def test_a_job_that_does_not_fit_the_cluster_is_refused(
    cluster: dict[str, Any], field: str, rule: str
) -> None:
    refusal = load_cluster(cluster).refusal(load_job(GOOD, now=NOW))
    assert refusal is not None and refusal.field == field and rule in refusal.rule
    assert load_cluster("4x8").refusal(load_job(GOOD, now=NOW)) is None


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
    with pytest.raises(
        SpecError, match=r"bad\.yaml:2:1: not valid YAML: expected .* flow sequence at 1:7"
    ):
        read_spec(tmp_path / "bad.yaml")
    with pytest.raises(SpecError, match="cannot read job spec file"):
        read_spec(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="must be a mapping"):
        load_job(read_spec(tmp_path / "list.yaml"), now=NOW)
    (tmp_path / "dup.yaml").write_text("name: a\nname: b\n")
    with pytest.raises(SpecError, match=r"dup\.yaml:2:1: not valid YAML: name is given twice"):
        read_spec(tmp_path / "dup.yaml")
    (tmp_path / "bad.json").write_text('{"name": "a",\n "total_steps": }')
    with pytest.raises(SpecError, match=r"bad\.json:2:17: not valid JSON: Expecting value"):
        read_spec(tmp_path / "bad.json")
    (tmp_path / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(SpecError, match=r"binary\.yaml: is not a text file"):
        read_spec(tmp_path / "binary.yaml")
    with pytest.raises(SpecError, match="Is a directory"):
        read_spec(tmp_path)
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(SpecError, match="the job spec is empty"):
        load_job(read_spec(tmp_path / "empty.yaml"), now=NOW)


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


_ODD_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(["06:00", "PT4H", "P", "2026-11-30T06:00", "Mars/Base", "", "2Gi", "worker"]),
    st.datetimes(),
    st.dates(),
    st.binary(max_size=4),
)
_ODD = st.recursive(
    _ODD_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), inner, max_size=3),
    ),
    max_leaves=6,
)
_FIELDS = [
    *GOOD,
    "timezone",
    "key",
    "command",
    "pod",
    "checkpoint",
    "margin_seconds",
    "step_seconds_estimate",
    "step_seconds_estimate_at",
    *(f"resources.{k}" for k in (*GOOD["resources"], "per_worker")),
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_FIELDS), _ODD), min_size=1, max_size=3))
def test_any_value_in_any_field_is_a_spec_error_never_another_exception(
    edits: list[tuple[str, Any]],
) -> None:
    spec = copy.deepcopy(GOOD)
    for path, value in edits:
        *parents, leaf = path.split(".")
        node = spec
        for part in parents:
            node = node[part] if isinstance(node.get(part), dict) else {}
        node[leaf] = value
    try:
        load_job(spec, now=NOW)
    except SpecError as err:
        assert str(err).strip() and "\n" not in err.rule
