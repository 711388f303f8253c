"""Generate ``ctr-nightly-progress.csv``: a seeded synthetic progress log for ``qosflow replay``.

The "true" job takes tau(n) = 0.1 + 3.2 / n seconds per step on n CPUs (5 % lognormal noise). It
starts on 2 CPUs — too few for a 06:00 deadline — and is moved to 4 CPUs after an hour, so the log
shows the decisions before and after a scale-up. Run: ``python examples/make_progress.py``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def main() -> None:
    """Write the CSV beside this file."""
    rng = np.random.default_rng(7)
    rows, t, steps = [], 0.0, 0
    while steps < 20000 and t < 8 * 3600:
        units = 2 if t < 3600 else 4
        tau = 0.1 + 3.2 / units
        batch = 25
        t += float(np.sum(tau * rng.lognormal(0.0, 0.05, size=batch)))
        steps += batch
        if len(rows) == 0 or t - rows[-1][0] >= 120:
            rows.append((round(t, 1), steps, units))
    out = Path(__file__).with_name("ctr-nightly-progress.csv")
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["time", "steps", "units"])
        writer.writerows(rows[:60])
    print(f"wrote {out} ({min(len(rows), 60)} rows)")


if __name__ == "__main__":
    main()
