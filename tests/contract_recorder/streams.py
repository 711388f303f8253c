"""Splitting a recorded stream into its JSON messages.

* ``text/event-stream`` (what the Argo Server sends to ``Accept: text/event-stream``): every
  ``data: {...}`` line is one message; ``:`` keep-alive lines and blank lines are skipped;
* anything else (the Argo Server without that header, a Kubernetes watch): newline-delimited JSON.

The client may stop reading mid-message (it closed the watch): an unterminated last line that
does not parse is dropped, not reported.
"""

from __future__ import annotations

import json
from typing import Any


def messages(data: bytes, content_type: str) -> tuple[list[Any], str | None]:
    """The messages of a stream body and the first framing error, if any."""
    sse = content_type.split(";")[0].strip().lower() == "text/event-stream"
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    out: list[Any] = []
    for index, raw in enumerate(lines):
        line = raw.strip()
        if sse:
            if not line.startswith(b"data:"):
                continue
            line = line[len(b"data:") :].strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            if index == len(lines) - 1 and not complete:
                break
            return out, f"stream message {len(out) + 1} is not JSON ({exc})"
    return out, None
