"""``qosflow simulate`` / ``qosflow bound``: files, determinism, errors."""

from __future__ import annotations

import argparse
import codecs
import subprocess
from pathlib import Path

import pytest
from in_process import qosflow

from qosflow.cli.sim_commands import add_subcommands
from qosflow.core.errors import SpecError
from qosflow.sim.trace import elasticflow_dir, packaged_dir

TRACE = "seed:jobs=25,rate_per_hour=20"


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return int(args.func(args))


def _simulate(out: Path, *extra: str) -> None:
    argv = ["simulate", "--trace", TRACE, "--cluster", "2x16", "--slot", "60", "--out", str(out)]
    assert _main([*argv, "--policies", "k8s-default,xing19,qosflow", *extra]) == 0


def test_same_seed_gives_byte_identical_results(tmp_path: Path) -> None:
    _simulate(tmp_path / "a", "--no-timing", "--seed", "3")
    _simulate(tmp_path / "b", "--no-timing", "--seed", "3")
    _simulate(tmp_path / "c", "--no-timing", "--seed", "4")
    for name in ("results.csv", "jobs.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (tmp_path / "a" / "jobs.csv").read_bytes() != (tmp_path / "c" / "jobs.csv").read_bytes()


def test_results_columns_plots_and_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _simulate(tmp_path)
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    for col in (
        "policy",
        "deadline_jobs",
        "met",
        "ratio",
        "upper_bound",
        "fraction_of_bound",
        "guarantee_violations",
        "utilisation",
        "rescales",
        "wall_s",
    ):
        assert col in header
    rows = (tmp_path / "results.csv").read_text().splitlines()[1:]
    assert [r.split(",")[0] for r in rows] == ["k8s-default", "xing19", "qosflow"]
    assert all(r.split(",")[header.index("upper_bound")] for r in rows)  # the bound was computed
    for png in ("satisfaction.png", "lateness_cdf.png", "utilisation.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "qosflow" in out and "upper bound" in out


def test_bound_command_on_a_real_trace(capsys: pytest.CaptureFixture[str]) -> None:
    trace = elasticflow_dir() / "generated" / "100jobs_1500lam.csv"
    assert _main(["bound", "--trace", str(trace), "--cluster", "16x8", "--slot", "3600"]) == 0
    out = capsys.readouterr().out
    assert "feasible in isolation: 100" in out
    assert "upper bound: 100" in out


def test_unknown_policy_and_knob_are_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="unknown policy"):
        _main(["simulate", "--trace", TRACE, "--policies", "nope", "--out", str(tmp_path)])
    with pytest.raises(SpecError, match="unknown seed workload knob"):
        _main(["bound", "--trace", "seed:bogus=1"])


FAST = ["--policies", "k8s-default", "--no-bound", "--cluster", "2x8", "--no-timing"]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return qosflow(*args, cwd=cwd)


def _small_trace() -> str:
    """The first five jobs of a packaged trace, as text."""
    text = (packaged_dir() / "generated" / "100jobs_1500lam.csv").read_text(encoding="utf-8")
    return "".join(text.splitlines(keepends=True)[:6])


def _assert_refused(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (  # Latin-1: the e-acute of line 7's model name
            (_small_trace() + "9,1,2,r\xe9snet,5,256,1,3,0\n").encode("latin-1"),
            "trace.csv:7:model_name: not valid UTF-8 (byte 0xe9); save the file as UTF-8",
        ),
        (
            _small_trace().encode("utf-16-le"),
            "trace.csv:1:: contains NUL bytes (UTF-16 without a byte-order mark",
        ),
        (
            _small_trace().encode("utf-16")[:-1],  # a BOM, then a torn last character
            "trace.csv:6:best_effort: not valid UTF-16, though it starts with a UTF-16 BOM (byte 0x0a)",
        ),
        (_small_trace().encode("utf-32"), "trace.csv:1:: the file is UTF-32 text"),
        (b"", "trace.csv:1:: empty file (no header)"),
    ],
    ids=["latin-1", "utf-16-without-bom", "torn-utf-16", "utf-32", "empty"],
)
def test_a_trace_in_another_encoding_is_one_error_line(
    tmp_path: Path, data: bytes, needle: str
) -> None:
    (tmp_path / "trace.csv").write_bytes(data)
    proc = _cli("simulate", "--trace", "trace.csv", *FAST, "--out", "out", cwd=tmp_path)
    _assert_refused(proc, needle)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "data",
    [
        codecs.BOM_UTF8 + _small_trace().encode("utf-8"),
        _small_trace().encode("utf-16"),  # BOM + native order
        codecs.BOM_UTF16_BE + _small_trace().encode("utf-16-be"),
    ],
    ids=["utf-8-bom", "utf-16", "utf-16-be"],
)
def test_a_trace_with_a_byte_order_mark_is_read(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "trace.csv").write_bytes(_small_trace().encode("utf-8"))
    assert (
        _main(
            [
                "simulate",
                "--trace",
                str(tmp_path / "trace.csv"),
                *FAST,
                "--out",
                str(tmp_path / "plain"),
            ]
        )
        == 0
    )
    (tmp_path / "trace.csv").write_bytes(data)
    proc = _cli("simulate", "--trace", "trace.csv", *FAST, "--out", "out", cwd=tmp_path)
    assert "Traceback" not in proc.stderr and proc.returncode == 0, proc.stderr
    for name in ("results.csv", "jobs.csv"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


@pytest.mark.parametrize(
    ("trace", "needle"),
    [
        (
            "seed:jobs=abc",
            "error: --trace: seed workload knob jobs: must be an integer (got 'abc')",
        ),
        ("seed:jobs=1.5", "--trace: seed workload knob jobs: must be an integer (got '1.5')"),
        ("seed:jobs=inf", "--trace: seed workload knob jobs: must be an integer (got 'inf')"),
        (
            "seed:sigma=nan",
            "--trace: seed workload knob sigma: must be a finite number (got 'nan')",
        ),
        ("seed:jobs", "--trace: seed workload knob jobs: needs a value (jobs=...)"),
        ("seed:feasible_only=maybe", "feasible_only: must be true or false (got 'maybe')"),
        ("seed:rate_per_hour=-1", "--trace: seed workload knob rate_per_hour: must be > 0"),
        (
            "seed:lam_min=2,lam_max=1",
            "--trace: seed workload knob lam_min: must satisfy 0 < lam_min <= lam_max",
        ),
    ],
)
def test_a_bad_seed_knob_is_one_error_line(tmp_path: Path, trace: str, needle: str) -> None:
    if trace == "seed:jobs=abc":  # through the CLI; the rule is the same for every knob
        _assert_refused(_cli("simulate", "--trace", trace, *FAST, cwd=tmp_path), needle)
        _assert_refused(_cli("bound", "--trace", trace, cwd=tmp_path), needle)
        return
    with pytest.raises(SpecError) as err:
        _main(["simulate", "--trace", trace, *FAST, "--out", str(tmp_path / "out")])
    assert needle in f"error: {err.value}"


def test_seed_knobs_still_accept_integral_floats_and_booleans(tmp_path: Path) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--trace", "seed:jobs=4.0,feasible_only=no, sigma = 0.5", *FAST]
    assert _main([*argv, "--out", str(out)]) == 0
    assert len((out / "jobs.csv").read_text().splitlines()) == 1 + 4


@pytest.mark.parametrize(
    ("out", "needle"),
    [
        ("taken", "error: --out: 'taken' is an existing file, not a folder"),
        ("taken/sub", "error: --out: cannot create folder 'taken/sub': 'taken' is a file"),
    ],
)
def test_an_out_that_is_a_file_is_one_error_line(tmp_path: Path, out: str, needle: str) -> None:
    (tmp_path / "taken").write_text("keep me")
    proc = _cli("simulate", "--trace", "seed:jobs=4", *FAST, "--out", out, cwd=tmp_path)
    _assert_refused(proc, needle)
    assert (tmp_path / "taken").read_text() == "keep me"


def test_a_row_the_csv_reader_refuses_names_file_and_line(tmp_path: Path) -> None:
    from qosflow.core.errors import TraceError
    from qosflow.sim.trace import load_trace

    trace = tmp_path / "trace.csv"
    trace.write_text(_small_trace() + '9,1,2,"' + "x" * 200_000 + '",5,256,1,3,0\n')
    with pytest.raises(TraceError, match=r"trace\.csv:7:: not valid CSV \(field larger"):
        load_trace(trace)


@pytest.mark.parametrize("policy", ["qosflow", "xing19"])
def test_our_policies_are_charged_restarts_on_the_runs_own_nodes_and_switches(
    policy: str,
) -> None:
    # ElasticFlow's overhead depends on which GPU ranks a job lands on, so the model must place
    # on the cluster of the run: T4 nodes of 4, or the artifact's two switches of n64g8
    from qosflow.cli.simulate import load_workload, make_policy, overhead_model
    from qosflow.sim.policies.ef_overhead import ElasticFlowOverhead

    trace = str(
        elasticflow_dir() / "microsoft-elasticflow-traces/data/elasticflow-traces/195job.csv"
    )
    w = load_workload(trace, "n64g8", "A100", 1)
    model = make_policy(policy, speeds="oracle", table=w.table, slot=60, shape=w.shape).overhead
    model = getattr(model, "inner", model)  # qosflow adds the Airflow steps' latency around it
    assert isinstance(model, ElasticFlowOverhead)
    assert (model.node_size, model.switches) == (8, 2)
    shared = overhead_model("elasticflow", 60, load_workload(trace, "16x4", "A100", 1).shape)
    assert isinstance(shared, ElasticFlowOverhead)
    assert (shared.node_size, shared.switches) == (4, 1)


@pytest.mark.parametrize("policy", ["qosflow", "xing19"])
def test_where_the_cluster_resizes_in_place_our_policies_plan_that_cost(policy: str) -> None:
    # the Airflow watch plans a change of size at what it costs on its cluster (5 s for an
    # in-place CPU resize); the simulated policies must plan the same, not a restart's 30 s
    from qosflow.cli.simulate import load_workload, make_policy, resize_cost

    w = load_workload("seed:jobs=4", None, "A100", 1)
    assert resize_cost("rescale:5") == 5.0
    assert resize_cost("rescale") == 30.0
    assert resize_cost("elasticflow") is None and resize_cost("policy") is None
    planned = make_policy(
        policy, speeds="oracle", table=w.table, slot=60, shape=w.shape, resize_s=5.0
    )
    assert planned.rescale_overhead_s == 5.0  # type: ignore[attr-defined]
    default = make_policy(policy, speeds="oracle", table=w.table, slot=60, shape=w.shape)
    assert default.rescale_overhead_s == 30.0  # type: ignore[attr-defined]


def test_a_run_on_an_in_place_cluster_hands_its_resize_cost_to_the_policy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import qosflow.cli.simulate as simulate

    made: list[float] = []
    real = simulate.make_policy

    def spy(*args: object, **kwargs: object) -> object:
        policy = real(*args, **kwargs)  # type: ignore[arg-type]
        made.append(policy.rescale_overhead_s)  # type: ignore[attr-defined]
        return policy

    monkeypatch.setattr(simulate, "make_policy", spy)
    w = simulate.load_workload("seed:jobs=4", None, "A100", 1)
    for overhead in ("rescale:5", "none"):
        simulate.run_policy(
            w,
            "qosflow",
            slot=60,
            speeds="oracle",
            seed=1,
            sigma=0.0,
            bound=None,
            timing=False,
            overhead=overhead,
        )
    assert made == [5.0, 30.0]
