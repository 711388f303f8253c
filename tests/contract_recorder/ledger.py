"""The session's evidence: exchanges checked as tests end, reads resolved at the end, the report.

Exchanges are checked at the end of the test that made them (their bodies are dropped then, so a
long session stays small); the fields the client read are resolved against the response schemas
at the end of the session, because a client may read a response after the test that fetched it
(a fixture shared by several tests). :meth:`Ledger.report` gives the summary line and the JSON
written to ``.qosflow/contract-report.json``.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contract_recorder.recorder import Exchange, Recorder
from contract_recorder.tracking import Path_

if TYPE_CHECKING:  # the schema side (jsonschema, the schemas) loads on the first check
    from contract_recorder.validate import ReadSchema, Verdict


@dataclass
class Checked:
    """An exchange after its check (bodies dropped; reads still arriving)."""

    exchange: Exchange
    verdict: Verdict


@dataclass
class EndpointStats:
    """Counts of one endpoint."""

    side: str
    requests: int = 0
    responses: int = 0
    injected: int = 0
    no_answer: int = 0
    statuses: collections.Counter[str] = field(default_factory=collections.Counter)
    reads: set[str] = field(default_factory=set)
    error_reads: set[str] = field(default_factory=set)


_RESOLVED: dict[tuple[tuple[int, ...], Path_], tuple[str, str | None]] = {}


def resolve(path: Path_, schemas: list[ReadSchema]) -> tuple[str, str | None]:
    """A read path as declared by the first schema that declares it, else the first problem."""
    if not schemas:
        return "/".join(path), "a field read from a response that has no JSON schema"
    from contract_recorder.schemas import declared

    key = (tuple(id(schema) for _, schema in schemas), path)  # schemas live in caches
    if key not in _RESOLVED:
        results = [declared(root, schema, path) for root, schema in schemas]
        _RESOLVED[key] = next((r for r in results if r[1] is None), results[0])
    return _RESOLVED[key]


def read_problems(item: Checked) -> list[tuple[str, str | None]]:
    """Every read of one exchange: ``(normalised path, problem or None)``.

    Nothing for an unmapped exchange: its response has no schema, and it is an error already.
    """
    if item.verdict.endpoint == "unmapped":
        return []
    return [resolve(path, item.verdict.read_schemas) for path in sorted(item.exchange.reads)]


class Ledger:
    """Checks the recorder's exchanges and keeps what the report needs."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.checked: list[Checked] = []
        self._next = 0
        self._waiting: list[Exchange] = []

    def check_pending(self, *, final: bool = False) -> None:
        """Check every exchange recorded since the last call and drop its bodies.

        An exchange still waiting for its answer (another thread's) waits for the next call,
        unless ``final``.
        """
        from contract_recorder.validate import check

        fresh = self.recorder.exchanges[self._next :]
        self._next += len(fresh)
        pending, self._waiting = [*self._waiting, *fresh], []
        for exchange in pending:
            if not final and exchange.status is None and not exchange.error:
                self._waiting.append(exchange)
                continue
            self.checked.append(Checked(exchange, check(exchange)))
            exchange.request, exchange.body = b"", bytearray()

    def tally(self) -> tuple[dict[str, EndpointStats], list[dict[str, Any]]]:
        """Per-endpoint counts and every invalid case (grouped by endpoint, place and error)."""
        stats: dict[str, EndpointStats] = {}
        invalid: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        for item in self.checked:
            exchange, verdict = item.exchange, item.verdict
            name = verdict.endpoint if verdict.endpoint != "unmapped" else exchange.label
            entry = stats.setdefault(name, EndpointStats(verdict.side))
            _count(entry, exchange, verdict)
            problems = list(verdict.problems)
            for path, problem in read_problems(item):
                ok_reads = entry.error_reads if (exchange.status or 0) >= 400 else entry.reads
                ok_reads.add(path)
                if problem:
                    problems.append(("read", problem))
            for where, message in problems:
                group = (name, where, message, exchange.exempt)
                case = invalid.setdefault(
                    group,
                    {"endpoint": name, "where": where, "error": message, "count": 0, "tests": []},
                )
                if exchange.exempt:
                    case["exempt"] = exchange.exempt
                case["count"] += 1
                case.setdefault("exchange", exchange.label)
                if exchange.test not in case["tests"]:
                    case["tests"].append(exchange.test)
        return stats, list(invalid.values())

    def report(self) -> dict[str, Any]:
        """The summary line and the JSON report."""
        from contract_recorder.endpoints import endpoint_names
        from contract_recorder.schemas import K8S_REQUEST, K8S_RESPONSE

        stats, cases = self.tally()
        invalid = [case for case in cases if "exempt" not in case]
        exempt = [case for case in cases if "exempt" in case]
        requests = {
            side: sum(s.requests for s in stats.values() if s.side == side)
            for side in ("argo", "kubernetes")
        }
        responses = sum(s.responses for s in stats.values())
        fields = sum(len(s.reads) + len(s.error_reads) for s in stats.values())
        read_on = sum(1 for s in stats.values() if s.reads or s.error_reads)
        errors = sum(case["count"] for case in invalid)
        summary = (
            f"contract: {sum(requests.values())} requests (argo {requests['argo']}, kubernetes "
            f"{requests['kubernetes']}), {responses} responses, {fields} fields read on "
            f"{read_on} endpoints: {errors} invalid"
        )
        injected = sum(s.injected for s in stats.values())
        no_answer = sum(s.no_answer for s in stats.values())
        return {
            "summary": summary,
            "not_validated": (
                f"contract: {injected} answers made up by injected faults and {no_answer} requests "
                "without an answer (dropped, timed out): requests checked, responses not"
            ),
            "invalid_count": errors,
            "schemas": {
                "kubernetes_requests": f"{K8S_REQUEST} strict (patches: nothing required)",
                "kubernetes_responses": f"{K8S_RESPONSE} strict; reads checked against {K8S_REQUEST}",
                "argo_server": "swagger.json v4.1.2 via SwaggerContract, and strict (closed objects)",
                "argo_custom_resources": "schema.json v4.1.2 via argo_validator (strict)",
            },
            "endpoints": {name: _endpoint_json(s) for name, s in sorted(stats.items())},
            "requests_by_test_file": dict(
                sorted(
                    collections.Counter(
                        c.exchange.test.split("::")[0] for c in self.checked
                    ).items()
                )
            ),
            "kubernetes_table": endpoint_names(),
            "invalid": invalid,
            "exempt": exempt,
        }


def _count(entry: EndpointStats, exchange: Exchange, verdict: Verdict) -> None:
    entry.requests += 1
    if exchange.status is None:
        entry.no_answer += 1
    elif exchange.injected:
        entry.injected += 1
    if verdict.response_checked:
        entry.responses += 1
    entry.statuses[str(exchange.status if exchange.status is not None else exchange.error)] += 1


def _endpoint_json(stats: EndpointStats) -> dict[str, Any]:
    return {
        "side": stats.side,
        "requests": stats.requests,
        "responses_checked": stats.responses,
        "injected": stats.injected,
        "no_answer": stats.no_answer,
        "statuses": dict(sorted(stats.statuses.items())),
        "reads": sorted(stats.reads),
        "error_reads": sorted(stats.error_reads),
    }
