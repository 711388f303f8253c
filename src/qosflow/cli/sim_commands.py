"""The ``simulate`` and ``bound`` subcommands' arguments; the work loads only when one runs.

The simulator's module (:mod:`qosflow.cli.simulate`) imports the whole simulator and scipy, about a
second; every other ``qosflow`` command builds the same parser and need not pay for it.
"""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_POLICIES = "k8s-default,edf-elastic,xing19,elasticflow,elasticflow-exact,qosflow"
"""What ``qosflow simulate`` runs without ``--policies``."""


def _simulate(args: argparse.Namespace) -> int:
    from qosflow.cli.simulate import simulate_cmd

    return simulate_cmd(args)


def _bound(args: argparse.Namespace) -> int:
    from qosflow.cli.simulate import bound_cmd

    return bound_cmd(args)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="trace CSV, or seed[:knob=value,...]")
    p.add_argument(
        "--cluster",
        default=None,
        help="NODESxUNITS, e.g. 16x8 (seed: 4x16), or an ElasticFlow spec name, e.g. n64g8",
    )
    p.add_argument("--gpu-type", default="A100", help="A100, T4 or a throughputs_<X> folder")
    p.add_argument("--seed", type=int, default=1, help="seed of the generator and the noise")


def add_subcommands(sub: Any) -> None:
    """Register ``simulate`` and ``bound`` on the ``qosflow`` CLI's subparsers."""
    sim = sub.add_parser("simulate", help="run scheduling policies on a trace (simulator)")
    _common(sim)
    sim.add_argument("--slot", type=int, default=60, help="scheduling slot in seconds")
    sim.add_argument("--policies", default=DEFAULT_POLICIES, help="comma-separated names")
    sim.add_argument("--speeds", choices=("oracle", "learned"), default="oracle")
    sim.add_argument("--noise-sigma", type=float, default=0.0, help="lognormal step-time noise")
    sim.add_argument("--out", default="sim-out", help="output folder")
    sim.add_argument(
        "--overhead",
        default=None,
        help="overhead charged to every policy: policy (each its own; default for traces), "
        "elasticflow, none, rescale[:SECONDS] (default rescale:5 for the CPU seed workload: in-place resize)",
    )
    sim.add_argument("--no-bound", action="store_true", help="skip the upper bound")
    sim.add_argument("--bound-time-limit", type=float, default=30.0)
    sim.add_argument(
        "--no-timing",
        action="store_true",
        help="blank wall/CPU times so equal runs give byte-identical files",
    )
    sim.set_defaults(func=_simulate)
    bnd = sub.add_parser("bound", help="offline upper bound on jobs that can meet deadlines")
    _common(bnd)
    bnd.add_argument("--slot", type=int, default=1800, help="Bound B slot (0: skip Bound B)")
    bnd.add_argument("--milp", action="store_true", help="also solve Bound B as a MILP")
    bnd.add_argument("--time-limit", type=float, default=60.0, help="HiGHS limit per solve (s)")
    bnd.set_defaults(func=_bound)
