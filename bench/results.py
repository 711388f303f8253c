"""Write ``bench/RESULTS.md`` from the output of ``make bench`` (every ``key: value`` line).

Usage: ``python bench/results.py .qosflow/bench.log > bench/RESULTS.md`` (``make bench`` does it).
README and docs link to the file instead of copying numbers, so a figure has one home.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

LINE = re.compile(r"^(?P<key>[A-Za-z0-9_.\-<>/]+): (?P<value>.+)$")


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


def main(argv: list[str]) -> int:
    log = Path(argv[1]).read_text(encoding="utf-8").splitlines()
    print("# Benchmark results\n")
    print(f"Written by `make bench` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.  ")
    print(f"Machine: {machine()}.  ")
    print(
        "Each section is one `bench/*_bench.py`; every figure is printed by it as `key: value`.\n"
    )
    section = None
    for line in log:
        if line.startswith("== "):
            section = line[3:].strip()
            print(f"\n## `{section}`\n\n| key | value |\n| --- | --- |")
            continue
        match = LINE.match(line.strip())
        if match and section is not None:
            value = match["value"].replace("|", "\\|")
            print(f"| `{match['key']}` | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
