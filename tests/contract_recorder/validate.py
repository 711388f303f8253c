"""Checking one recorded exchange: its side, its endpoint, its query, request and response bodies.

The side comes from the path (Argo Server paths under ``/api/v1/{workflows,workflow-templates,
workflow-events,...,version,info,userinfo}``, Kubernetes paths under ``/api``, ``/apis`` and
``/version``); the transport that sent it must agree. An ambiguous path (Kubernetes' own
``/api/v1/events`` against Argo's ``/api/v1/events/...``) goes by the transport.

A :class:`Verdict` carries the problems found and the schemas the response's reads are checked
against later (reads keep coming after the test that made the exchange may have ended).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from contract_recorder.endpoints import (
    APPLY_PATCH,
    JSON_PATCH,
    STATUS,
    Endpoint,
    Spec,
    kube_endpoint,
)
from contract_recorder.recorder import Exchange
from contract_recorder.schemas import (
    K8S_REQUEST,
    K8S_RESPONSE,
    crd_validator,
    first_error,
    k8s_root,
    k8s_validator,
    swagger,
    swagger_contract,
    swagger_strict_error,
)
from contract_recorder.streams import messages

ARGO_PATH = re.compile(
    r"^/api/v1/(workflows|workflow-templates|workflow-events|cluster-workflow-templates|"
    r"cron-workflows|archived-workflows|workflow-event-bindings|events|stream|info|version|"
    r"userinfo|tracking|sensors|event-sources)(/|$)"
)
KUBE_PATH = re.compile(r"^/(api|apis)(/|$)|^/version$")
SIDE = {"argo": "argo", "kube": "kubernetes"}
JSON_PATCH_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["op", "path"],
        "properties": {
            "op": {"enum": ["add", "remove", "replace", "move", "copy", "test"]},
            "path": {"type": "string"},
            "from": {"type": "string"},
            "value": {},
        },
        "additionalProperties": False,
    },
}
ReadSchema = tuple[dict[str, Any], Any]


@dataclass
class Verdict:
    """What checking one exchange found."""

    side: str
    endpoint: str
    request_checked: bool = False
    response_checked: bool = False
    problems: list[tuple[str, str]] = field(default_factory=list)
    read_schemas: list[ReadSchema] = field(default_factory=list)

    def problem(self, where: str, message: str | None) -> None:
        if message:
            self.problems.append((where, message))


def parse(data: bytes) -> tuple[Any, str | None]:
    """JSON of a body (``None`` for an empty one) and the parse error, if any."""
    if not data:
        return None, None
    try:
        return json.loads(data), None
    except ValueError as exc:
        return None, f"not JSON ({exc})"


_SEEN: dict[bytes, Verdict] = {}


def check(exchange: Exchange) -> Verdict:
    """Check one exchange (see the module docstring); a repeat (a poll) reuses the verdict."""
    key = hashlib.blake2b(digest_size=20)
    for part in (
        exchange.transport,
        exchange.method,
        exchange.path,
        json.dumps(exchange.query, sort_keys=True),
        exchange.content_type,
        str(exchange.status),
        exchange.response_type,
        exchange.injected,
        exchange.error,
    ):
        key.update(part.encode() + b"\0")
    key.update(exchange.request + b"\0" + bytes(exchange.body))
    digest = key.digest()
    if digest not in _SEEN:
        _SEEN[digest] = _check(exchange)
    return _SEEN[digest]


def _check(exchange: Exchange) -> Verdict:
    side = SIDE[exchange.transport]
    if ARGO_PATH.match(exchange.path) and exchange.transport == "argo":
        return check_argo(exchange)
    if KUBE_PATH.match(exchange.path) and exchange.transport == "kube":
        return check_kube(exchange)
    if ARGO_PATH.match(exchange.path) or KUBE_PATH.match(exchange.path):
        verdict = Verdict(side, "unmapped")
        verdict.problem("unmapped", f"{exchange.path} sent through the {side} client")
        return verdict
    return check_argo(exchange) if side == "argo" else check_kube(exchange)


# ---------------------------------------------------------------------------------- Argo Server
_OPS: dict[str, list[tuple[re.Pattern[str], str, dict[str, Any]]]] = {}


def argo_operation(method: str, path: str) -> tuple[str, dict[str, Any]] | None:
    """The swagger path template and operation of ``method path``."""
    if not _OPS:
        for template, operations in swagger()["paths"].items():
            regex = re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")
            for verb, op in operations.items():
                _OPS.setdefault(verb.upper(), []).append((regex, template, op))
        for routes in _OPS.values():  # literal segments first, as SwaggerContract does
            routes.sort(key=lambda r: r[0].pattern.count("[^/]+"))
    for regex, template, op in _OPS.get(method, []):
        if regex.match(path):
            return template, op
    return None


def check_argo(exchange: Exchange) -> Verdict:
    """An Argo Server exchange against ``swagger.json``: SwaggerContract, then closed objects."""
    found = argo_operation(exchange.method, exchange.path)
    if found is None:
        verdict = Verdict("argo", "unmapped")
        verdict.problem("unmapped", f"{exchange.method} {exchange.path} is in no swagger path")
        return verdict
    template, op = found
    verdict = Verdict("argo", f"{exchange.method} {template}", request_checked=True)
    params = op.get("parameters", [])
    allowed = {p["name"] for p in params if p.get("in") == "query"}
    unknown = sorted(set(exchange.query) - allowed)
    verdict.problem("query", f"unknown query parameter(s) {unknown}" if unknown else None)
    body, error = parse(exchange.request)
    verdict.problem("request", error)
    if exchange.request and not exchange.content_type.startswith("application/json"):
        verdict.problem("request", f"Content-Type {exchange.content_type!r}, not JSON")
    try:
        swagger_contract().check_request(exchange.method, exchange.path, body)
    except AssertionError as exc:
        verdict.problem("request", str(exc))
    else:  # then closed objects: a field the server would silently drop
        schema = next((p["schema"] for p in params if p.get("in") == "body"), None)
        if schema is not None and body is not None:
            verdict.problem("request", swagger_strict_error(schema, body))
    _argo_response(exchange, op, verdict)
    return verdict


def _argo_response(exchange: Exchange, op: dict[str, Any], verdict: Verdict) -> None:
    if exchange.status is None:
        return
    responses = op.get("responses", {})
    spec = responses.get(str(exchange.status)) if exchange.status < 400 else None
    spec = spec or responses.get("default") or {}
    if "schema" in spec:  # reads of an injected answer are checked too: the client reads it
        verdict.read_schemas.append((swagger(), spec["schema"]))
    if exchange.injected:
        return
    verdict.response_checked = True
    stream = str(spec.get("schema", {}).get("title", "")).startswith("Stream result of")
    if exchange.status < 400 and stream:
        bodies, error = messages(bytes(exchange.body), exchange.response_type)
        verdict.problem("response", error)
    else:
        body, error = parse(bytes(exchange.body))
        verdict.problem("response", error)
        bodies = [] if error else [body if body is not None else {}]
    for body in bodies:
        try:
            swagger_contract().check_response(exchange.method, exchange.path, exchange.status, body)
        except AssertionError as exc:
            verdict.problem("response", str(exc))
        else:  # then closed objects: a field the emulation invents
            verdict.problem("response", swagger_strict_error(spec.get("schema") or {}, body))


# ---------------------------------------------------------------------------------- Kubernetes
def spec_error(spec: Spec, body: Any, *, response: bool) -> str | None:
    """The first error of ``body`` against a table body spec."""
    if spec.family == "crd":
        validator = crd_validator(spec.name, response=response, partial=spec.partial)
    else:
        version = K8S_RESPONSE if response else K8S_REQUEST
        validator = k8s_validator(spec.name, version, partial=spec.partial)
    error = first_error(validator, body)
    if error and spec.either_status and isinstance(body, dict) and body.get("kind") == "Status":
        return first_error(k8s_validator(STATUS, K8S_RESPONSE), body)
    return error


@functools.cache
def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def read_schemas(spec: Spec) -> list[ReadSchema]:
    """Where a response of ``spec`` declares its fields (checked against the request version)."""
    out: list[ReadSchema] = []
    if spec.family == "crd":
        root = crd_validator(spec.name, response=True).schema
        out.append((root, root))
    elif spec.family == "k8s":
        out.append((k8s_root(K8S_REQUEST), _ref(spec.name)))
    if spec.either_status:
        out.append((k8s_root(K8S_REQUEST), _ref(STATUS)))
    return out


def strip_nulls(value: Any) -> Any:
    """A merge patch without its ``null`` values (they delete a field)."""
    if isinstance(value, dict):
        return {k: strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_nulls(v) for v in value]
    return value


def check_kube(exchange: Exchange) -> Verdict:
    """A Kubernetes exchange against the endpoint table and the Kubernetes/Argo schemas."""
    endpoint = kube_endpoint(exchange.method, exchange.path)
    if endpoint is None:
        verdict = Verdict("kubernetes", "unmapped")
        verdict.problem("unmapped", f"{exchange.method} {exchange.path} is in no table entry")
        return verdict
    verdict = Verdict("kubernetes", endpoint.name, request_checked=True)
    unknown = sorted(set(exchange.query) - endpoint.query)
    verdict.problem("query", f"unknown query parameter(s) {unknown}" if unknown else None)
    verdict.problem("request", _kube_request_error(exchange, endpoint))
    _kube_response(exchange, endpoint, verdict)
    return verdict


def _kube_request_error(exchange: Exchange, endpoint: Endpoint) -> str | None:
    if endpoint.request is None:
        return f"takes no body (got {len(exchange.request)} bytes)" if exchange.request else None
    if not exchange.request:
        return None if endpoint.optional_body else "a body is required"
    ctype = exchange.content_type.split(";")[0].strip().lower()
    if exchange.method == "PATCH" and ctype not in endpoint.patch_types:
        return f"Content-Type {ctype!r} is not a patch type of this endpoint (415)"
    if exchange.method != "PATCH" and ctype not in ("application/json", ""):
        # no Content-Type (kubernetes client 37 sends none on create): the API server decodes
        # the body with its first serializer, JSON
        return f"Content-Type {ctype!r}, not application/json"
    body, error = parse(exchange.request)
    if error:
        return f"{error}" + (" (a YAML apply patch is not checked)" if ctype == APPLY_PATCH else "")
    if ctype == JSON_PATCH:
        from jsonschema import Draft202012Validator

        return first_error(Draft202012Validator(JSON_PATCH_SCHEMA), body)
    if exchange.method == "PATCH":
        body = strip_nulls(body)
    return spec_error(endpoint.request, body, response=False)


def _kube_response(exchange: Exchange, endpoint: Endpoint, verdict: Verdict) -> None:
    if exchange.status is None:
        return
    error_answer = exchange.status >= 400
    verdict.read_schemas = read_schemas(Spec("k8s", STATUS) if error_answer else endpoint.response)
    if exchange.injected:
        return
    verdict.response_checked = True
    if error_answer:
        body, error = parse(bytes(exchange.body))
        verdict.problem("response", error or first_error(k8s_validator(STATUS, K8S_RESPONSE), body))
        return
    if endpoint.response.family == "text":
        ctype = exchange.response_type
        verdict.problem("response", None if ctype.startswith("text/plain") else f"{ctype!r}")
        return
    if endpoint.watch_item is not None and exchange.query.get("watch", [""])[0] in ("1", "true"):
        _watch(exchange, endpoint.watch_item, verdict)
        return
    body, error = parse(bytes(exchange.body))
    verdict.problem("response", error or spec_error(endpoint.response, body, response=True))


def _watch(exchange: Exchange, item: Spec, verdict: Verdict) -> None:
    events, error = messages(bytes(exchange.body), "application/json")
    verdict.problem("response", error)
    event_validator = k8s_validator("io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent", K8S_RESPONSE)
    for event in events:
        verdict.problem("response", first_error(event_validator, event))
        obj = event.get("object") if isinstance(event, dict) else None
        if isinstance(event, dict) and event.get("type") == "ERROR":
            verdict.problem("response", first_error(k8s_validator(STATUS, K8S_RESPONSE), obj))
        else:
            verdict.problem("response", spec_error(item, obj, response=True))
