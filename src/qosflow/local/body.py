"""Request bodies of the emulated servers: framing, size limit, read deadline, parsing.

A malformed request gets an answer, never a dropped connection or a 500:

* ``Content-Length`` that is not a number (or two that disagree): 400; a declared or chunked body
  over the limit (8 MiB by default): 413, before any of it is read; ``Transfer-Encoding`` other
  than ``chunked``: 501.
* The whole body must arrive within the read timeout (5 s by default), however slowly it trickles:
  otherwise 408, and the connection is closed.
* JSON with ``NaN``/``Infinity`` (which Go rejects), JSON or YAML nested deeper than
  :data:`MAX_DEPTH`, or YAML whose aliases expand beyond the size limit: 400. YAML (the apply-patch
  content type) must convert to JSON.
"""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass
from io import BufferedIOBase
from typing import Any

import yaml

from qosflow.local.status import ApiError

MAX_BODY_BYTES = 8 * 2**20
READ_TIMEOUT_S = 5.0
MAX_DEPTH = 100
MAX_YAML_VALUES = 2**20
DRAIN_BYTES = 256 * 2**10
"""An unread body up to this size is read and discarded after an early answer (keep-alive)."""
_LENGTH = re.compile(r"^[0-9]{1,19}$")


def too_deep(max_depth: int = MAX_DEPTH) -> str:
    """The message for a document nested deeper than ``max_depth``, as the API server words it."""
    return f"exceeded max depth: nested deeper than {max_depth}"


class TooDeep(yaml.YAMLError):
    """A YAML document nests collections deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(too_deep())


class SafeYamlLoader(yaml.SafeLoader):
    """A SafeLoader that stops scanning once collections nest deeper than :data:`MAX_DEPTH`.

    PyYAML's scanner does work quadratic in the flow-nesting level and its composer recurses,
    so without this a deep body costs seconds of server time before the composer gives up.
    The open flow levels plus the open block indents never exceed the depth of the collection
    being scanned, so no document within the limit is refused here.
    """

    def fetch_more_tokens(self) -> None:  # noqa: D102 - see the class docstring
        super().fetch_more_tokens()
        if self.flow_level + len(self.indents) > MAX_DEPTH:
            raise TooDeep


class _JsonYamlLoader(SafeYamlLoader):
    """YAML as Kubernetes converts it to JSON: timestamps stay strings."""


_JsonYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class BodyError(ApiError):
    """The body could not be read (short, slow or malformed framing): answer, then close."""


@dataclass(frozen=True, slots=True)
class Framing:
    """How the body of a request is delimited.

    Attributes:
        length: ``Content-Length``, or ``None`` for a chunked body.
    """

    length: int | None

    @property
    def empty(self) -> bool:
        """Whether the request has no body at all."""
        return self.length == 0


def too_large(limit: int) -> BodyError:
    """413, as the API server words it."""
    return BodyError(413, f"Request entity too large: limit is {limit}")


def body_framing(headers: Any, limit: int) -> Framing:
    """The framing the headers declare (400 / 413 / 501 when it cannot be accepted)."""
    encoding = headers.get("Transfer-Encoding")
    if encoding:
        if encoding.strip().lower() != "chunked":
            raise BodyError(501, f"unsupported transfer encoding: {encoding!r}")
        return Framing(None)
    values = {v.strip() for v in headers.get_all("Content-Length") or []}
    if not values:
        return Framing(0)
    text = values.pop()
    if values or not _LENGTH.match(text):
        raise BodyError(400, f"bad Content-Length: {text!r} is not a byte count")
    if int(text) > limit:
        raise too_large(limit)
    return Framing(int(text))


class _Reader:
    """Reads from a request's buffered socket file against one deadline."""

    def __init__(self, rfile: BufferedIOBase, sock: socket.socket, timeout_s: float) -> None:
        self.rfile, self.sock, self.timeout_s = rfile, sock, timeout_s
        self.deadline = time.monotonic() + timeout_s

    def some(self, most: int) -> bytes:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        self.sock.settimeout(remaining)
        data = self.rfile.read1(most)
        if not data:
            raise BodyError(400, "unexpected EOF: the body is shorter than declared")
        return bytes(data)

    def exact(self, size: int) -> bytes:
        parts, got = [], 0
        while got < size:
            part = self.some(min(size - got, 2**16))
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def line(self) -> bytes:
        data = b""
        while not data.endswith(b"\n"):
            if len(data) > 4096:
                raise BodyError(400, "malformed chunked encoding: line too long")
            data += self.some(1)
        return data.rstrip(b"\r\n")


def _chunked(reader: _Reader, limit: int) -> bytes:
    """Decode a chunked body (its extensions and trailers are ignored)."""
    parts: list[bytes] = []
    total = 0
    while True:
        size_text = reader.line().split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BodyError(400, f"malformed chunked encoding: size {size_text!r}") from None
        if size == 0:
            while reader.line():
                pass
            return b"".join(parts)
        total += size
        if total > limit:
            raise too_large(limit)
        parts.append(reader.exact(size))
        if reader.exact(2) != b"\r\n":
            raise BodyError(400, "malformed chunked encoding: missing CRLF after a chunk")


def read_body(
    rfile: BufferedIOBase, sock: socket.socket, framing: Framing, limit: int, timeout_s: float
) -> bytes:
    """The whole body, within ``timeout_s`` (408 when it does not arrive in time)."""
    if framing.empty:
        return b""
    reader = _Reader(rfile, sock, timeout_s)
    try:
        if framing.length is None:
            return _chunked(reader, limit)
        return reader.exact(framing.length)
    except TimeoutError:
        raise BodyError(408, f"the request body did not arrive within {timeout_s:g} s") from None
    except OSError as exc:
        raise BodyError(400, f"the request body could not be read: {exc}") from None
    finally:
        sock.settimeout(None)


def _json_error(exc: Exception, text: str) -> str:
    """A Go-like message for a body that is not JSON."""
    if not text.strip():
        return "unexpected EOF"
    pos = getattr(exc, "pos", 0) or 0
    char = text[pos] if pos < len(text) else ""
    return (
        f"invalid character '{char}' looking for beginning of value" if char else "unexpected EOF"
    )


def _no_constant(name: str) -> Any:
    """Go's decoder refuses ``NaN``, ``Infinity`` and ``-Infinity``."""
    raise ApiError(400, f"invalid character '{name[0]}' looking for beginning of value")


def check_depth(doc: Any, max_depth: int, max_values: int) -> None:
    """400 when ``doc`` nests deeper than ``max_depth`` or holds more than ``max_values`` values.

    Iterative (and counting aliased YAML nodes each time they are reached), so neither a deep
    document nor an alias bomb can exhaust the stack or the memory.
    """
    stack: list[tuple[Any, int]] = [(doc, 1)]
    seen = 0
    while stack:
        value, depth = stack.pop()
        seen += 1
        if seen > max_values:
            raise ApiError(400, f"the body holds more than {max_values} values")
        if isinstance(value, dict):
            children: Any = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > max_depth:
            raise ApiError(400, too_deep(max_depth))
        stack.extend((child, depth + 1) for child in children)


def parse_body(raw: bytes, content_type: str, limit: int = MAX_BODY_BYTES) -> Any:
    """The JSON (or apply-patch YAML) body; ``None`` when empty (400 when it is not one)."""
    if not raw:
        return None
    text = raw.decode("utf-8", errors="replace")
    try:
        if "yaml" in content_type:
            doc = yaml.load(text, Loader=_JsonYamlLoader)  # a SafeLoader without timestamps
            check_depth(doc, MAX_DEPTH, min(limit, MAX_YAML_VALUES))
            return json.loads(json.dumps(doc, allow_nan=False))
        doc = json.loads(text, parse_constant=_no_constant)
    except (RecursionError, TooDeep):
        raise ApiError(400, too_deep()) from None
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ApiError(400, _json_error(exc, text)) from exc
    except (TypeError, ValueError, OverflowError) as exc:
        raise ApiError(400, f"error converting YAML to JSON: {exc}") from None
    check_depth(doc, MAX_DEPTH, limit)
    return doc
