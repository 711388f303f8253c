"""Contract evidence without a cluster: ArgoCluster through every endpoint it uses, recorded.

The session plugin (``tests/contract_recorder``) records every exchange qosflow's client makes and
checks it against ``swagger.json``, the Argo ``schema.json`` and the Kubernetes OpenAPI schemas.
The first test drives ArgoCluster through each of its operations on the local cluster and asserts,
from the recorder, that every endpoint was seen and nothing was invalid, so the evidence exists
even when this module runs alone. The others check the checker: a typo, an unmapped path, a wrong
patch type and an undeclared read are caught; tracked responses behave like dicts.
"""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest

from contract_recorder.endpoints import MERGE_PATCH, STRATEGIC_PATCH, Spec
from contract_recorder.ledger import Checked, Ledger, read_problems, resolve
from contract_recorder.plugin import session_recorder
from contract_recorder.recorder import Exchange, Recorder
from contract_recorder.schemas import K8S_RESPONSE
from contract_recorder.streams import messages
from contract_recorder.tracking import TrackedDict, wrap
from contract_recorder.validate import check, read_schemas
from qosflow.core.errors import NotFoundError
from qosflow.local import FaultRule
from qosflow.local.names import pod_dir
from qosflow_argo import workflow_status

from .conftest import Target

WF = "/api/v1/workflows/{namespace}"
TPL = "/api/v1/workflow-templates/{namespace}"
PODS = "/api/v1/namespaces/{namespace}/pods"
PCS = "/apis/scheduling.k8s.io/v1/priorityclasses"
EXPECTED = {
    f"POST {WF}",
    f"GET {WF}",
    f"GET {WF}/{{name}}",
    f"PUT {WF}/{{name}}/stop",
    f"GET {TPL}/{{name}}",
    f"POST {TPL}",
    f"PUT {TPL}/{{name}}",
    "GET /version",
    "GET /api/v1/nodes",
    "GET /api/v1/pods",
    f"GET {PODS}",
    f"GET {PODS}/{{name}}",
    f"GET {PODS}/{{name}}/log",
    f"PATCH {PODS}/{{name}}/resize",
    "PATCH /apis/argoproj.io/v1alpha1/namespaces/{namespace}/workflows/{name}",
    f"GET {PCS}/{{name}}",
    f"POST {PCS}",
    f"PUT {PCS}/{{name}}",
}


def recorded(nodeid: str) -> list[Checked]:
    """The checked exchanges of one test so far (fixture set-up included)."""
    found = session_recorder()
    if found is None:
        pytest.skip("contract recording is off (QOSFLOW_CONTRACT=off or --no-contract)")
    _, ledger = found
    ledger.check_pending()
    return [c for c in ledger.checked if c.exchange.test == nodeid]


def drive(t: Target) -> None:
    """Every operation of ArgoCluster once, on the local cluster (installed by the fixture)."""
    cluster = t.cluster
    template = cluster.argo.get_template(cluster.template)
    template["metadata"].setdefault("labels", {})["qosflow.dev/drift"] = "yes"
    cluster.argo.update_template(cluster.template, template)
    klass = cluster.kube.read_priority_class("qosflow-normal")
    klass["description"] = "drifted"
    cluster.kube.replace_priority_class(klass)
    dry = cluster.ensure_installed(dry_run=True)
    assert "would be updated" in dry.values()
    with t.make(template="qosflow-absent") as other:
        absent = other.ensure_installed(dry_run=True)
    assert absent["WorkflowTemplate/qosflow-absent"] == "would be created"
    assert "updated" in cluster.ensure_installed().values()
    req = t.request("rec", total_steps=10_000)
    cluster.submit(req)
    assert cluster.submit(req).name == req.name  # 409, then the existing one adopted
    running = t.wait(cluster, req.name, lambda s: (s.steps_done or 0) > 0 and bool(s.pod_name))
    assert cluster.capacity("cpu").total >= 1
    assert [s.name for s in cluster.list_jobs(req.job)] == [req.name]
    pod = str(running.pod_name)
    assert cluster.usage(pod) == []  # a scripted pod writes no log: 400, waiting to start
    log = pod_dir(t.local.state_dir, cluster.namespace, pod) / "main.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(json.dumps({"event": "usage", "t": 1.0}) + "\n", encoding="utf-8")
    cluster.usage(pod)  # now the log as text
    t.local.faults.add(FaultRule("status", "GET", f"/workflows/.*/{req.name}$", "argo", 503))
    assert cluster.resize(req.name, 2).units >= 1
    cluster.set_priority(req.name, priority=77, priority_class="qosflow-high")
    assert cluster.stop(req.name).phase.finished
    with pytest.raises(NotFoundError):
        cluster.status(f"{req.name}-missing")


def test_every_client_endpoint_is_recorded_and_valid(
    local_target: Target, request: pytest.FixtureRequest
) -> None:
    drive(local_target)
    checked = recorded(request.node.nodeid)
    seen = {c.verdict.endpoint for c in checked}
    assert seen >= EXPECTED, f"never seen: {sorted(EXPECTED - seen)}"
    problems = [
        f"{c.exchange.label} [{where}] {message}"
        for c in checked
        for where, message in c.verdict.problems
    ]
    problems += [
        f"{c.exchange.label} [read] {problem}"
        for c in checked
        for _, problem in read_problems(c)
        if problem
    ]
    assert problems == []
    assert all(c.verdict.request_checked for c in checked)
    answered = [c for c in checked if c.exchange.status is not None and not c.exchange.injected]
    assert answered and all(c.verdict.response_checked for c in answered)
    assert any(c.exchange.injected for c in checked)  # the 503 made up by the fault plan
    logs = {c.exchange.status for c in checked if c.verdict.endpoint == f"GET {PODS}/{{name}}/log"}
    assert logs == {200, 400}
    reads = {path for c in checked for path, _ in read_problems(c)}
    assert {"status.phase", "status.nodes.*.progress", "items[].status.phase"} <= reads


def test_responses_are_checked_against_the_version_the_local_cluster_reports(
    local_target: Target,
) -> None:
    major, minor = local_target.cluster.kube.server_version()
    assert K8S_RESPONSE.startswith(f"{major}.{minor}.")


# ---------------------------------------------------------------------------------- the checker
def exchange(method: str, path: str, body: Any = None, **over: Any) -> Exchange:
    kube = not path.startswith(("/api/v1/workflow", "/api/v1/version"))
    made = Exchange(
        transport="kube" if kube else "argo",
        method=method,
        path=path,
        query=over.pop("query", {}),
        content_type=over.pop("content_type", "application/json"),
        request=json.dumps(body).encode() if body is not None else b"",
        test="synthetic",
    )
    response = over.pop("response", None)
    made.status = over.pop("status", 200 if response is not None else None)
    made.response_type = "application/json"
    made.body = bytearray(json.dumps(response).encode() if response is not None else b"")
    return made


def problems_of(ex: Exchange) -> list[str]:
    return [f"{where}: {message}" for where, message in check(ex).problems]


RESIZE = "/api/v1/namespaces/ml/pods/p/resize"


def test_a_typo_in_a_patch_body_is_caught_and_the_good_one_passes() -> None:
    good = {"spec": {"containers": [{"name": "main", "resources": {"limits": {"cpu": "2"}}}]}}
    assert problems_of(exchange("PATCH", RESIZE, good, content_type=STRATEGIC_PATCH)) == []
    typo = {"spec": {"containers": [{"name": "main", "resources": {"limit": {"cpu": "2"}}}]}}
    (problem,) = problems_of(exchange("PATCH", RESIZE, typo, content_type=STRATEGIC_PATCH))
    assert problem.startswith("request: spec/containers/0/resources") and "'limit'" in problem


def test_unmapped_paths_wrong_patch_types_and_unknown_queries_are_errors() -> None:
    assert problems_of(exchange("GET", "/api/v1/namespaces/ml/events"))[0].startswith("unmapped")
    wf = "/apis/argoproj.io/v1alpha1/namespaces/ml/workflows/w"
    patch = {"spec": {"priority": 3}}
    assert problems_of(exchange("PATCH", wf, patch, content_type=MERGE_PATCH)) == []
    (wrong,) = problems_of(exchange("PATCH", wf, patch, content_type=STRATEGIC_PATCH))
    assert "415" in wrong
    (query,) = problems_of(exchange("GET", "/api/v1/nodes", query={"labelselector": ["a=b"]}))
    assert query == "query: unknown query parameter(s) ['labelselector']"


def test_argo_requests_are_strict_and_responses_follow_the_swagger() -> None:
    workflow = {"metadata": {"name": "w"}, "spec": {"entrypont": "main"}}
    (typo,) = problems_of(exchange("POST", "/api/v1/workflows/ml", {"workflow": workflow}))
    assert "entrypont" in typo and typo.startswith("request:")
    answer = {"metadata": {"name": "w"}, "spec": {}, "status": {"phse": "Running"}}
    (extra,) = problems_of(exchange("GET", "/api/v1/workflows/ml/w", response=answer))
    assert extra.startswith("response: status:") and "phse" in extra
    bad = exchange("GET", "/api/v1/workflows/ml/w", response={"code": 5}, status=404)
    assert problems_of(bad) == [
        "response: response 404 GET /api/v1/workflows/ml/w: error without a message"
    ]


def test_kubernetes_responses_are_strict_and_errors_are_a_status() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "staus": {}}
    (extra,) = problems_of(exchange("GET", "/api/v1/namespaces/ml/pods/p", response=pod))
    assert "staus" in extra and extra.startswith("response:")
    status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
    assert problems_of(exchange("GET", "/api/v1/nodes/n", response=status, status=404)) == []


def test_reads_of_undeclared_fields_are_errors_and_maps_and_items_normalise() -> None:
    pod = read_schemas(Spec("k8s", "io.k8s.api.core.v1.PodList"))
    path = ("items", "[]", "status", "containerStatuses", "[]", "allocatedResources", "cpu")
    assert resolve(path, pod) == ("items[].status.containerStatuses[].allocatedResources.*", None)
    _, problem = resolve(("items", "[]", "status", "containerStatus"), pod)
    assert problem == "items[].status.containerStatus is not declared in the response schema"


def test_tracked_responses_behave_like_dicts_and_record_only_client_reads() -> None:
    wf = {
        "metadata": {"name": "w", "labels": {"qosflow.dev/job": "j"}},
        "spec": {"arguments": {"parameters": [{"name": "steps", "value": "9"}]}},
        "status": {"phase": "Running", "nodes": {"n1": {"type": "Pod", "progress": "3/9"}}},
    }
    sink: set[tuple[str, ...]] = set()
    tracked = wrap(copy.deepcopy(wf), sink)
    assert isinstance(tracked, dict) and isinstance(tracked, TrackedDict) and tracked == wf
    assert json.loads(json.dumps(tracked)) == wf and pickle.loads(pickle.dumps(tracked)) == wf
    assert copy.deepcopy(tracked) == wf and type(copy.copy(tracked)) is TrackedDict
    assert tracked["status"]["phase"] == "Running" and sink == set()  # a test's read: not counted
    if session_recorder() is not None:
        session_recorder()[0].instrumenter.refresh()  # type: ignore[index]
    status = workflow_status.job_status(tracked)
    assert (status.steps_done, status.total_steps) == (3, 9)
    assert {("status", "phase"), ("status", "nodes", "n1", "type")} <= sink
    if session_recorder() is not None:  # the node is copied (dict(n)), then read: still seen
        assert ("status", "nodes", "n1", "progress") in sink


def test_streams_are_split_into_messages() -> None:
    sse = b': keep-alive\n\ndata: {"result": {"type": "ADDED"}} \n\n:\n'
    assert messages(sse, "text/event-stream") == ([{"result": {"type": "ADDED"}}], None)
    assert messages(b'{"a": 1}\n{"b": 2}\n{"c"', "application/json") == ([{"a": 1}, {"b": 2}], None)
    assert messages(b'{"a": 1}\nnope\n', "application/json")[1] == (
        "stream message 2 is not JSON (Expecting value: line 1 column 1 (char 0))"
    )


def test_the_session_fails_on_a_finding_unless_the_test_is_exempt() -> None:
    recorder = Recorder()
    recorder.exchanges.append(exchange("GET", "/api/v1/namespaces/ml/events", status=200))
    ledger = Ledger(recorder)
    ledger.check_pending(final=True)
    report = ledger.report()
    assert report["invalid_count"] == 1 and report["summary"].endswith(": 1 invalid")
    assert report["summary"].startswith("contract: 1 requests (argo 0, kubernetes 1), 0 responses")
    (case,) = report["invalid"]
    assert case["where"] == "unmapped" and case["tests"] == ["synthetic"]
    recorder.exchanges[0].exempt = "on purpose"
    ledger = Ledger(recorder)
    ledger.check_pending(final=True)
    report = ledger.report()
    assert report["invalid_count"] == 0 and report["exempt"][0]["exempt"] == "on purpose"
