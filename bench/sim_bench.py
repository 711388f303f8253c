"""Issue 5 acceptance in one run: every figure as a ``key: value`` line.

Sections (each measured side by side in this run, nothing copied from a previous run except the
reference numbers of ElasticFlow's own simulator, read from ``REFERENCE.md``'s CSV):

1. fidelity — delegated to ``bench/sim_fidelity.py`` (the simulator helper's script), relayed; it
   also times our ``elasticflow`` on cluster01 against the artifact (the >= 10x speed figure);
2. qosflow (oracle) vs ElasticFlow's reference ratio on every REFERENCE.md setting;
3. the upper bound on 195job / 128 A100 and qosflow's fraction of it;
4. learned speeds (noise sigma 5 %) vs oracle on 195job, seed 1, guarantee violations in both
   modes (seeds 1-10 on three traces: ``bench/baselines_bench.py``);
5. (the seed paper's CPU setting moved to ``bench/baselines_bench.py``: every baseline, five
   arrival rates);
6. cluster04 (15,802 jobs, 1,024 GPUs) with qosflow: wall time and peak memory (own process),
   after the interpreter's speed on this machine (``cluster04.python_loop_s``: 20 M additions
   in a Python loop), so that wall times from two machines can be compared.

``--quick`` skips the two large traces (cluster01, cluster04).
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from qosflow.cli.simulate import Workload, bound_jobs, load_workload
from qosflow.sim.bound import upper_bound
from qosflow.sim.trace import elasticflow_dir

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from baselines_bench import metrics_of  # noqa: E402  (a sibling script)

MS = "microsoft-elasticflow-traces/data/elasticflow-traces"
# (key, trace path, cluster, gpu type, slot) — the settings of REFERENCE.md
SETTINGS = (
    ("195job", f"{MS}/195job.csv", "16x8", "A100", 240),
    ("cluster10", f"{MS}/cluster10.csv", "32x8", "A100", 60),
    (
        "elasticVpollux_e",
        "pkusys-ElasticFlow/ElasticFlow/traces_for_ElasticFlow/elasticVpollux_e.csv",
        "16x4",
        "T4",
        60,
    ),
    ("100jobs", "generated/100jobs_1500lam.csv", "16x8", "A100", 240),
    ("cluster01", f"{MS}/cluster01.csv", "n64g8", "A100", 60),
)
LARGE = {"cluster01"}


def say(key: str, value: object) -> None:
    """Print one ``key: value`` line, flushed (the bench's only output format)."""
    print(f"{key}: {value}", flush=True)


def reference() -> dict[str, tuple[int, int, float, float]]:
    """ElasticFlow's own simulator (REFERENCE.md): trace -> (accepted, total, ratio, wall s)."""
    path = elasticflow_dir() / "reference_results" / "artifact_ddl_ratio.csv"
    out = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["policy_flag"] == "ef-accessctrl":
                total = int(row["accepted"]) + int(row["declined"])
                out[row["trace"]] = (
                    int(row["accepted"]),
                    total,
                    float(row["ddl_satis_ratio"]),
                    float(row["wall_s_2core"]),
                )
    return out


def fidelity() -> None:
    """Relay the simulator helper's fidelity script, if it is there."""
    script = HERE / "sim_fidelity.py"
    if not script.exists():
        say("fidelity", "bench/sim_fidelity.py not found")
        return
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False
    )
    for line in proc.stdout.splitlines():
        if ":" in line:
            print(line, flush=True)
    say("fidelity_exit_code", proc.returncode)


def _run(
    w: Workload, policy: str, slot: int, *, speeds: str = "oracle", sigma: float = 0.0
) -> tuple[int, int, float, int, float]:
    m = metrics_of(w, policy, slot, speeds=speeds, sigma=sigma, timing=True)
    return m.met, m.deadline_jobs, m.ratio, m.guarantee_violations, m.wall_s


def versus_reference(quick: bool) -> None:
    """Section 2: qosflow (oracle) against ElasticFlow's reference on every setting."""
    ref = reference()
    for key, trace, cluster, gpu, slot in SETTINGS:
        if quick and key in LARGE:
            continue
        w = load_workload(str(elasticflow_dir() / trace), cluster, gpu, 1)
        met, total, ratio, viol, wall = _run(w, "qosflow", slot)
        acc, _, ef_ratio, _ = ref[trace]
        say(f"{key}.qosflow_oracle_met", f"{met}/{total}")
        say(f"{key}.qosflow_oracle_ratio", f"{ratio:.3f}")
        say(f"{key}.elasticflow_reference_ratio", f"{ef_ratio:.3f}")
        say(f"{key}.qosflow_vs_elasticflow_reference", f"{met / acc:.3f}x")
        say(f"{key}.qosflow_guarantee_violations", viol)
        say(f"{key}.qosflow_wall_s", f"{wall:.1f}")


def bound_195() -> None:
    """Sections 3 and 4: the bound, fraction of it, learned vs oracle on 195job."""
    w = load_workload(str(elasticflow_dir() / f"{MS}/195job.csv"), "16x8", "A100", 1)
    start = time.perf_counter()
    ub = upper_bound(bound_jobs(w), w.shape.total, slot=1800.0, time_limit=60.0)
    say("195job.bound_s", f"{time.perf_counter() - start:.1f}")
    for b in ub.bounds:
        say(f"195job.bound_{b.method}", f"{b.value} ({b.detail})")
    say("195job.feasible_in_isolation", ub.feasible_in_isolation)
    say("195job.upper_bound", ub.value)
    oracle = _run(w, "qosflow", 240)
    say("195job.qosflow_fraction_of_bound", f"{oracle[0] / ub.value:.3f}")
    say("195job.qosflow_violations_oracle", oracle[3])
    try:
        learned = _run(w, "qosflow", 240, speeds="learned", sigma=0.05)
    except (ArithmeticError, ValueError) as exc:  # report, keep printing the other figures
        say("195job.qosflow_learned_error", f"{type(exc).__name__}: {exc}")
        return
    say("195job.qosflow_learned_ratio", f"{learned[2]:.3f}")
    say("195job.qosflow_learned_minus_oracle", f"{learned[2] - oracle[2]:+.3f}")
    say("195job.qosflow_violations_learned", learned[3])


def cluster04() -> None:
    """Section 6: cluster04 with qosflow in its own process (so peak memory is its own)."""
    code = (
        "import resource, time\n"
        "def peak_mb():\n"
        "    # VmHWM: this process's own high-water mark; ru_maxrss would also count the parent's\n"
        "    # pages the fork copied before exec (Linux keeps the larger of the two across exec)\n"
        "    try:\n"
        "        with open('/proc/self/status', encoding='ascii') as f:\n"
        "            return next(int(x.split()[1]) // 1024 for x in f if x.startswith('VmHWM:'))\n"
        "    except (OSError, StopIteration):\n"
        "        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
        "t = time.perf_counter()\n"
        "s = 0\n"
        "for i in range(20_000_000):\n"
        "    s += i\n"
        "print('cluster04.python_loop_s:', f'{time.perf_counter() - t:.2f}')\n"
        "from qosflow.cli.simulate import load_workload, run_policy\n"
        "from qosflow.sim.trace import elasticflow_dir\n"
        f"w = load_workload(str(elasticflow_dir() / '{MS}/cluster04.csv'), '128x8', 'A100', 1)\n"
        "t = time.perf_counter()\n"
        "r = run_policy(w, 'qosflow', slot=60, speeds='oracle', seed=1, sigma=0.0, bound=None,"
        " timing=True)\n"
        "print('cluster04.qosflow_ratio:', f'{r.metrics.ratio:.3f}')\n"
        "print('cluster04.qosflow_met:', f'{r.metrics.met}/{r.metrics.deadline_jobs}')\n"
        "print('cluster04.qosflow_guarantee_violations:', r.metrics.guarantee_violations)\n"
        "print('cluster04.qosflow_wall_s:', f'{time.perf_counter() - t:.1f}')\n"
        "print('cluster04.peak_rss_mb:', peak_mb())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=os.environ
    )
    sys.stdout.write(proc.stdout)
    if proc.returncode:
        say("cluster04.error", proc.stderr.strip().splitlines()[-1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip cluster01 and cluster04")
    parser.add_argument("--no-fidelity", action="store_true", help="skip bench/sim_fidelity.py")
    args = parser.parse_args()
    start = time.perf_counter()
    if not args.no_fidelity:
        fidelity()
    versus_reference(args.quick)
    bound_195()
    if not args.quick:
        cluster04()
    say("bench_wall_s", f"{time.perf_counter() - start:.0f}")
    say("bench_peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
