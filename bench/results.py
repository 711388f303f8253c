"""Write ``bench/RESULTS.md`` from the output of ``make bench`` (every ``key: value`` line).

Usage: ``python bench/results.py .qosflow/bench.log > bench/RESULTS.md`` (``make bench`` does it).
README and docs link to the file instead of copying numbers, so a figure has one home.

``python bench/results.py LOG --update bench/RESULTS.md`` replaces only the sections ``LOG``
holds (``make bench BENCHES=bench/baselines_bench.py`` does it) and keeps the others; each section
re-run this way says when and on which machine, since it no longer shares the header's run.

``python bench/results.py LOG --merge bench/RESULTS.md`` goes one step further for a bench run
in part (``bench/baselines_bench.py --sections ...``): in each section ``LOG`` holds, only the
keys it prints are replaced (in place; new keys go at the section's end) and the others keep
their values; the section's note says which keys were re-run, when and where, above the note
the rest still carry. A log of a bench run by hand starts with its ``== bench/<name>.py`` line,
as ``make bench`` writes it.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

LINE = re.compile(r"^(?P<key>[A-Za-z0-9_.\-<>/]+): (?P<value>.+)$")
TABLE = ["| key | value |", "| --- | --- |"]


def machine() -> str:
    """CPU count, model and memory of this machine, in one line."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = os.getloadavg()[0]
    kernel = os.environ.get("OPENBLAS_CORETYPE") or "chosen by CPU"
    return (
        f"{os.cpu_count()} CPUs ({model or platform.processor()}), {memory:.0f} GiB, "
        f"Python {platform.python_version()}, OpenBLAS kernel {kernel}, load {load:.1f} at the end"
    )


def tables(log: list[str], note: str = "") -> dict[str, list[str]]:
    """Each section of a bench log (``== bench/x.py`` lines) as its Markdown lines, in order."""
    out: dict[str, list[str]] = {}
    section = None
    for line in log:
        if line.startswith("== "):
            section = line[3:].strip()
            out[section] = ["", f"## `{section}`", "", *([note, ""] if note else [])]
            out[section] += TABLE
            continue
        match = LINE.match(line.strip())
        if match and section is not None:
            value = match["value"].replace("|", "\\|")
            out[section].append(f"| `{match['key']}` | {value} |")
    return out


def parse(results: str) -> tuple[list[str], dict[str, list[str]]]:
    """An existing RESULTS.md: its header lines and each section's lines (heading included)."""
    header: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] = header
    for line in results.splitlines():
        if line.startswith("## `") and line.endswith("`"):
            if current and not current[-1]:  # the blank line before a heading is the section's
                current.pop()
            current = sections.setdefault(line[4:-1], [""])
        current.append(line)
    return header, sections


ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| (?P<value>.*) \|$")


def merge(old: list[str], new: list[str], note: str) -> list[str]:
    """A section's lines with ``new``'s rows put over ``old``'s, key by key.

    ``old``'s rows keep their order (a re-run key takes its new value where it stood), keys new
    to the section go at its end, and ``note`` (which keys were re-run, when and where) goes
    above whatever notes the section had (they still describe the other keys).
    """
    fresh: dict[str, str] = {}
    for line in new:
        if m := ROW.match(line):
            fresh[m["key"]] = line
    rows, notes = [], []
    for line in old[3:]:
        if m := ROW.match(line):
            rows.append(fresh.pop(m["key"], line))
        elif line and line not in TABLE:
            notes.append(line)
    kept = [x for n in notes for x in (n, "")]
    return [*old[:3], note, "", *kept, *TABLE, *rows, *fresh.values()]


USAGE = "usage: python bench/results.py LOG [--update RESULTS.md | --merge RESULTS.md]"


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] not in ("--update", "--merge")):
        print(
            f"{USAGE}\n(--update names the RESULTS.md whose sections LOG replaces; --merge the "
            "one whose keys it replaces)",
            file=sys.stderr,
        )
        return 2
    log = Path(argv[1]).read_text(encoding="utf-8").splitlines()
    first = next((i for i, line in enumerate(log) if line.startswith("== ")), len(log))
    stray = next((line.strip() for line in log[:first] if LINE.match(line.strip())), None)
    if stray is not None:  # a bench run by hand: its keys would silently go nowhere
        print(
            f"error: {argv[1]}: `{stray}` comes before any `== bench/<name>.py` line; each "
            "bench's keys follow its own line, as `make bench` writes them",
            file=sys.stderr,
        )
        return 2
    now = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
    if len(argv) == 4:
        header, sections = parse(Path(argv[3]).read_text(encoding="utf-8"))
        where = machine()
        for name, lines in tables(log, f"Re-run alone on {now}. Machine: {where}.").items():
            if argv[2] == "--merge" and name in sections:
                keys = [m["key"] for line in lines if (m := ROW.match(line))]
                said = ", ".join(f"`{k}`" for k in keys)
                note = f"Keys re-run alone on {now} ({said}). Machine: {where}."
                lines = merge(sections[name], lines, note)
            sections[name] = lines
        print("\n".join(header))
        for lines in sections.values():
            print("\n".join(lines))
        return 0
    print("# Benchmark results\n")
    print(f"Written by `make bench` on {now}.  ")
    print(f"Machine: {machine()}.  ")
    print(
        "Each section is one `bench/*_bench.py`; every figure is printed by it as `key: value`.\n"
    )
    for lines in tables(log).values():
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
