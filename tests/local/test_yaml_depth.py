"""YAML the servers read (apply-patch bodies, ``podSpecPatch``) is refused as soon as it nests deeper
than the limit: a document within the limit always parses, and a deep one costs the server work in
proportion to the limit, not to the nesting, so it cannot stall a request thread."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml.scanner

from qosflow.local.admission import pod_spec_patch
from qosflow.local.body import MAX_DEPTH, parse_body
from qosflow.local.status import ApiError

APPLY = "application/apply-patch+yaml"


def _flow(depth: int) -> str:
    return "[" * depth + "]" * depth


def _block_mappings(depth: int) -> str:
    keys = "".join(" " * i + f"k{i}:\n" for i in range(depth - 1))
    return keys + " " * (depth - 1) + "k: v\n"


def _block_sequences(depth: int) -> str:
    return (
        "".join(" " * (2 * i) + "-\n" for i in range(depth - 1)) + " " * (2 * depth - 2) + "- x\n"
    )


def _compact_sequences(depth: int) -> str:
    return "- " * depth + "x\n"


def _mixed(depth: int) -> str:
    half = depth // 2
    return _block_mappings(half)[: -len("v\n")] + _flow(depth - half) + "\n"


SHAPES = [_flow, _block_mappings, _block_sequences, _compact_sequences, _mixed]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__.strip("_"))
def test_yaml_at_the_limit_parses_and_one_level_deeper_is_400(shape: Callable[[int], str]) -> None:
    assert parse_body(shape(MAX_DEPTH).encode(), APPLY) is not None
    with pytest.raises(ApiError, match=f"exceeded max depth: nested deeper than {MAX_DEPTH}") as e:
        parse_body(shape(MAX_DEPTH + 1).encode(), APPLY)
    assert e.value.http == 400


def test_a_deep_body_is_refused_after_scanning_about_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scanned = 0
    fetch = yaml.scanner.Scanner.fetch_more_tokens

    def counting(self: yaml.scanner.Scanner) -> None:
        nonlocal scanned
        scanned += 1
        fetch(self)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(yaml.scanner.Scanner, "fetch_more_tokens", counting)
    with pytest.raises(ApiError, match="exceeded max depth"):
        parse_body(b"metadata: " + _flow(5000).encode(), APPLY)
    assert 0 < scanned <= 2 * MAX_DEPTH  # PyYAML alone scans ~1,500 tokens, quadratically


def test_a_deep_pod_spec_patch_is_400_naming_the_field() -> None:
    assert pod_spec_patch(_block_mappings(MAX_DEPTH), "spec.podSpecPatch") is not None
    with pytest.raises(ApiError, match=r"^spec\.podSpecPatch: not valid JSON or YAML: exceeded"):
        pod_spec_patch("containers: " + _flow(5000), "spec.podSpecPatch")
