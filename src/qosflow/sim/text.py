"""The text of the simulator's data files: the encodings spreadsheet programs save, read or refused.

Traces, throughput tables and cluster specs (:mod:`qosflow.sim.trace`) are CSV files people edit
by hand; this module turns a file's bytes into text, or into a
:class:`~qosflow.core.errors.TraceError` naming the file, line and column of the first bad byte.
"""

from __future__ import annotations

import codecs
import csv
from importlib.resources.abc import Traversable
from pathlib import Path

from qosflow.core.errors import TraceError


def read_text(path: Path | Traversable) -> str:
    """The text of a trace, table or cluster-spec file (see :func:`decode_text`).

    Raises:
        TraceError: Naming the file when it cannot be read or decoded.
    """
    try:
        with path.open("rb") as raw:
            data = raw.read()
    except OSError as exc:
        raise TraceError(str(path), 0, "", f"cannot read file ({exc.strerror or exc})") from None
    return decode_text(str(path), data)


def decode_text(name: str, data: bytes) -> str:
    """Decode a file's bytes: UTF-8 (with or without a byte-order mark) or UTF-16 with one.

    Spreadsheet programs save CSV as UTF-8 with a BOM or as UTF-16 with a BOM; both are read.
    Anything else is refused with the encoding rule and the line (and column) of the first
    offending byte, rather than read as garbage column names.

    Args:
        name: The file's name, for messages.
        data: Its bytes.

    Raises:
        TraceError: For UTF-32, NUL bytes (UTF-16 without a BOM, or a binary file) and bytes
            that are not valid in the encoding.
    """
    if data.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        raise TraceError(name, 1, "", "the file is UTF-32 text; save it as UTF-8")
    encoding = "utf-16" if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else "utf-8"
    if encoding == "utf-8" and b"\0" in data:
        line, column = _position(data, data.index(b"\0"), encoding)
        raise TraceError(
            name,
            line,
            column,
            "contains NUL bytes (UTF-16 without a byte-order mark, or not a text file); "
            "save it as UTF-8",
        )
    try:
        return data.decode("utf-8-sig" if encoding == "utf-8" else encoding)
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start, encoding)
        what = "UTF-8" if encoding == "utf-8" else "UTF-16, though it starts with a UTF-16 BOM"
        bad = " ".join(f"0x{byte:02x}" for byte in data[exc.start : exc.end])
        raise TraceError(
            name, line, column, f"not valid {what} (byte {bad}); save the file as UTF-8"
        ) from None


def _position(data: bytes, offset: int, encoding: str) -> tuple[int, str]:
    """(line, CSV column name or ``""``) of the byte at ``offset``; commas in quotes miscount."""
    text = data.decode(encoding, errors="replace").removeprefix("\ufeff")
    before = data[:offset].decode(encoding, errors="replace").removeprefix("\ufeff")
    lines = before.split("\n")
    if len(lines) < 2:
        return 1, ""
    header = next(csv.reader([text.split("\n", 1)[0]]), [])
    index = lines[-1].count(",")
    return len(lines), header[index].strip() if index < len(header) else ""
