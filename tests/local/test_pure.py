"""Pure helpers of the local cluster: selectors, fields, patches, names, retries, clocks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qosflow.local.clock import VirtualClock, parse_rfc3339, rfc3339
from qosflow.local.patch import apply_patch, json_patch, merge_patch, strategic_merge
from qosflow.local.pods import format_cpu, millicores, qos_class
from qosflow.local.query import apply_fields, field_selector, label_selector
from qosflow.local.retry import backoff_s, duration_s, may_retry
from qosflow.local.runner import PodLaunch, pod_environment
from qosflow.local.status import ApiError
from qosflow.local.workflow import fnv32a, node_id, pod_name


def _obj(**labels: str) -> dict[str, object]:
    return {"metadata": {"labels": labels}, "status": {"phase": "Running"}}


def test_label_selector_forms() -> None:
    obj = _obj(app="a", tier="web")
    assert label_selector("app=a")(obj) and label_selector("app==a,tier=web")(obj)
    assert not label_selector("app!=a")(obj)
    assert label_selector("tier in (web, db)")(obj) and not label_selector("tier notin (web)")(obj)
    assert (
        label_selector("app")(obj)
        and label_selector("!missing")(obj)
        and not label_selector("!app")(obj)
    )
    assert label_selector("")(obj) and label_selector(None)(obj)
    with pytest.raises(ApiError):
        label_selector("a b c")


def test_field_selector_rejects_unsupported_fields() -> None:
    match = field_selector(
        "status.phase=Running,metadata.name!=x", frozenset({"status.phase", "metadata.name"})
    )
    assert match({"metadata": {"name": "y"}, "status": {"phase": "Running"}})
    with pytest.raises(ApiError) as err:
        field_selector("spec.x=1", frozenset({"status.phase"}))
    assert err.value.http == 400


def test_fields_keep_and_drop() -> None:
    doc = {"metadata": {"name": "n", "uid": "u"}, "status": {"phase": "P", "nodes": {"a": 1}}}
    assert apply_fields(dict(doc), "metadata.name,status.phase") == {
        "metadata": {"name": "n"},
        "status": {"phase": "P"},
    }
    listed = {"items": [doc, doc]}
    assert apply_fields(listed, "items.metadata.name") == {
        "items": [{"metadata": {"name": "n"}}] * 2
    }
    dropped = apply_fields(
        {"metadata": {"name": "n", "uid": "u"}, "status": {"nodes": {}}},
        "-metadata.uid,status.nodes",
    )
    assert dropped == {"metadata": {"name": "n"}, "status": {}}


def test_patches() -> None:
    pod = {
        "spec": {
            "containers": [
                {"name": "main", "image": "i", "resources": {"requests": {"cpu": "1"}}},
                {"name": "side", "image": "s"},
            ]
        }
    }
    smp = strategic_merge(
        pod, {"spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "2"}}}]}}
    )
    assert smp["spec"]["containers"][0] == {
        "name": "main",
        "image": "i",
        "resources": {"requests": {"cpu": "2"}},
    }
    assert smp["spec"]["containers"][1] == {"name": "side", "image": "s"}
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {
        "a": {"c": 2, "d": 3}
    }
    ops = [
        {"op": "replace", "path": "/spec/priority", "value": 3},
        {"op": "add", "path": "/spec/x", "value": [1]},
        {"op": "test", "path": "/spec/priority", "value": 3},
        {"op": "remove", "path": "/spec/gone"},
    ]
    assert json_patch({"spec": {"priority": 1, "gone": 0}}, ops) == {
        "spec": {"priority": 3, "x": [1]}
    }
    with pytest.raises(ApiError) as failed:
        json_patch({"spec": {}}, [{"op": "remove", "path": "/spec/nothing"}])
    assert failed.value.http == 422
    with pytest.raises(ApiError) as media:
        apply_patch({}, {}, "application/strategic-merge-patch+json", strategic_ok=False)
    assert media.value.http == 415


def test_fnv32a_and_argo_names() -> None:
    assert fnv32a("") == 0x811C9DC5 and fnv32a("a") == 0xE40C292C and fnv32a("foobar") == 0xBF9CF968
    assert node_id("wf", "wf") == "wf" and node_id("wf", "wf(0)") == f"wf-{fnv32a('wf(0)')}"
    assert pod_name("wf", "wf", "main") == "wf"
    assert pod_name("wf", "wf[0].train", "train") == f"wf-train-{fnv32a('wf[0].train')}"


def test_quantities_and_qos() -> None:
    assert millicores("1500m") == 1500 and millicores(2) == 2000 and millicores("0.1") == 100
    assert format_cpu(2000) == "2" and format_cpu(1500) == "1500m"
    guaranteed = [
        {
            "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            }
        }
    ]
    assert qos_class(guaranteed) == "Guaranteed"
    assert (
        qos_class([{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]) == "Guaranteed"
    )  # requests default to limits
    assert qos_class([{"resources": {"requests": {"cpu": "1"}}}]) == "Burstable"
    assert qos_class([{}]) == "BestEffort"


def test_retry_rules() -> None:
    strategy = {
        "limit": 2,
        "retryPolicy": "OnFailure",
        "backoff": {"duration": "10s", "factor": 2, "maxDuration": "1m"},
    }
    assert may_retry(strategy, "Failed", 1, 0) and may_retry(strategy, "Failed", 2, 0)
    assert not may_retry(strategy, "Failed", 3, 0)  # limit 2 = at most 3 attempts
    assert not may_retry(strategy, "Error", 1, 0)  # OnFailure does not retry errors
    assert not may_retry(strategy, "Failed", 1, 61)  # past maxDuration
    assert backoff_s(strategy, 0) == 10 and backoff_s(strategy, 2) == 40
    assert duration_s("1m30s") == 90 and duration_s(5) == 5 and duration_s("250ms") == 0.25
    with pytest.raises(ValueError):
        duration_s("soon")


@given(st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False))
def test_rfc3339_round_trips_whole_seconds(epoch: float) -> None:
    assert parse_rfc3339(rfc3339(epoch)) == int(epoch)


def test_virtual_clock_runs_listeners_and_never_goes_back() -> None:
    clock, seen = VirtualClock(100.0), []
    clock.subscribe(seen.append)
    assert clock.advance(2.5) == 102.5 and seen == [102.5]
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_pod_environment_is_only_what_the_pod_declares(tmp_path: Path) -> None:
    launch = PodLaunch(
        pod="wf-main-1",
        namespace="qosflow",
        workflow="wf",
        node_id="wf-1",
        argv=("python", "-c", "pass"),
        env={"QOSFLOW_TOTAL_STEPS": "10", "PATH": "/opt/tool/bin"},
        cores=(0,),
        cpus=1.0,
        workdir=tmp_path,
        progress_file=tmp_path / "progress",
    )
    server = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/me",
        "LANG": "en_US.UTF-8",
        "TMPDIR": "/tmp/me",
        "QOSFLOW_LOCAL_TOKEN": "s3cret",
        "AIRFLOW_CONN_QOSFLOW_DEFAULT": '{"password": "hunter2"}',
        "VIRTUAL_ENV": "/venv",
    }
    env = pod_environment(launch, server)
    bindir = str(Path(sys.executable).parent)
    assert env.pop("PATH") == f"{bindir}:/opt/tool/bin"  # the container's PATH, venv first
    assert env == {
        "HOME": "/home/me",
        "LANG": "en_US.UTF-8",
        "TMPDIR": "/tmp/me",
        "HOSTNAME": "wf-main-1",
        "QOSFLOW_TOTAL_STEPS": "10",
    }
    bare = pod_environment(launch, {})
    assert bare["LANG"] == "C.UTF-8" and "HOME" not in bare and "TMPDIR" not in bare
