"""Trace files: ElasticFlow/Microsoft job traces, throughput tables and cluster specs.

Everything here reads the ElasticFlow data (``shared/traces/elasticflow/``) exactly as the
ElasticFlow artifact does (see its ``README.md`` and ``ALGORITHM.md``):

* a **job trace** (:func:`load_trace`) accepts both column-name variants (``submit_time`` or
  ``submission_time``, ``iteration`` or ``num_iteration``, ``ddl`` or ``deadline``); times are
  absolute seconds; the job size is ``iteration`` at the listed global batch size; a
  ``best_effort`` value of 1 means no deadline (``deadline = inf``);
* a **throughput table** (:func:`load_throughputs`) gives iterations per second by GPU count per
  (model, global batch size); an empty cell, ``nan`` or a zero means "this GPU count is not allowed";
* a **cluster spec** (:func:`load_cluster_spec`, ``nXgY.csv``) gives switches, nodes and GPUs per node.

Every bad row raises :class:`~qosflow.core.errors.TraceError` naming the file, the line and the column.
Files are UTF-8, with or without a byte-order mark, or UTF-16 with a byte-order mark (what
spreadsheet programs save); another encoding is refused naming the first bad byte's line
(:mod:`qosflow.sim.text`).

Where the data comes from: the throughput tables, the cluster specs and the small traces
(``195job``, ``100jobs_1500lam``, ``elasticVpollux_e``) are package data of ``qosflow.sim``
(``qosflow/sim/data/elasticflow/``, the same relative paths as in ``shared/traces/elasticflow/``,
with the upstream licence texts beside them), read through :mod:`importlib.resources`, so an
installed wheel needs no checkout. Every loader looks there first: ``load_throughputs("A100")``,
``load_cluster_spec("n16g8")``, a packaged trace named by its stem (``load_trace("195job")``), and
any path under :func:`elasticflow_dir` whose file is packaged (the packaged copy is byte-identical
and wins). Everything else, e.g. the large Microsoft cluster traces the benchmarks run, is read
from ``shared/``: :func:`shared_dir` is the one place that knows where it lives
(``$QOSFLOW_SHARED``, else beside the checkout).
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Literal

from qosflow.core.errors import SpecError, TraceError
from qosflow.sim.text import read_text

GpuType = Literal["A100", "T4"]
LEVEL_COLUMNS = (1, 2, 4, 8, 16, 32, 64)
MAX_LEVEL = 64

_ALIASES: dict[str, tuple[str, ...]] = {
    "job_id": ("job_id",),
    "submit": ("submit_time", "submission_time"),
    "iterations": ("iteration", "num_iteration"),
    "model": ("model_name",),
    "deadline": ("ddl", "deadline"),
    "batch_size": ("batch_size",),
    "num_gpu": ("num_gpu",),
    "duration": ("duration",),
}
_CLUSTER_NAME = re.compile(r"^n(\d+)g(\d+)$")
SCHEDULER = "pkusys-ElasticFlow/ElasticFlow/scheduler"
"""Folder of the throughput tables and cluster specs, relative to the ElasticFlow data."""
PACKAGED_TRACES = {
    "195job": "microsoft-elasticflow-traces/data/elasticflow-traces/195job.csv",
    "100jobs_1500lam": "generated/100jobs_1500lam.csv",
    "elasticVpollux_e": "pkusys-ElasticFlow/ElasticFlow/traces_for_ElasticFlow/elasticVpollux_e.csv",
}
"""The traces shipped in the package: stem -> path relative to the ElasticFlow data."""

# ElasticFlow's per-model GPU caps (the artifact's ``models.get_max_gpu``), by GPU type.
_EF_CAP_A100 = {
    ("bert", 64): 8,
    ("bert", 128): 16,
    ("gpt2", 128): 16,
    ("gpt2", 256): 32,
    ("inception3", 64): 16,
    ("inception3", 128): 32,
    ("resnet50", 64): 32,
    ("vgg16", 64): 32,
}
_EF_CAP_T4 = {"bert": 16, "cifar10": 16, "yolov3": 4, "ncf": 1}


def shared_dir() -> Path:
    """Return the project's ``shared/`` folder (traces, schemas, notes).

    ``$QOSFLOW_SHARED`` wins; otherwise ``shared/`` beside the repository checkout (the repo is
    ``<x>/main`` and shared data lives in ``<x>/shared``, also in CI).
    """
    env = os.environ.get("QOSFLOW_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[4] / "shared"  # <x>/main/src/qosflow/sim/trace.py


def elasticflow_dir() -> Path:
    """Return ``shared/traces/elasticflow`` (ElasticFlow's traces and tables, all of them)."""
    return shared_dir() / "traces" / "elasticflow"


def packaged_dir() -> Traversable:
    """Return the packaged subset of the ElasticFlow data (``qosflow/sim/data/elasticflow``)."""
    return files("qosflow.sim") / "data" / "elasticflow"


def elasticflow_file(relative: str) -> Path | Traversable:
    """A file or folder of the ElasticFlow data by its path relative to ``elasticflow/``.

    The packaged copy when there is one, else the one under :func:`elasticflow_dir`.
    """
    packaged = packaged_dir()
    for part in PurePosixPath(relative).parts:
        packaged = packaged / part
    if packaged.is_file() or packaged.is_dir():
        return packaged
    return elasticflow_dir() / relative


def _source(path: Path | str) -> Path | Traversable:
    """Where to read ``path`` from: the package, or the file system as it is.

    A packaged trace's stem (when no such file exists), and a file under ``elasticflow_dir()``
    that is packaged, are read from the package.
    """
    text = str(path)
    stem = text.removesuffix(".csv")
    if stem in PACKAGED_TRACES and not Path(text).exists():
        return elasticflow_file(PACKAGED_TRACES[stem])
    absolute = Path(os.path.abspath(path))
    try:
        relative = absolute.relative_to(os.path.abspath(elasticflow_dir()))
    except ValueError:
        return Path(path)
    return elasticflow_file(relative.as_posix())


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One row of a job trace.

    Attributes:
        job_id: Identifier from the trace (any string).
        submit: Arrival, absolute seconds.
        deadline: Absolute deadline in seconds; ``inf`` for a best-effort job.
        iterations: Job size in training iterations at ``batch_size``.
        model: Model name (a throughput file name).
        batch_size: Global batch size (a row of the model's throughput file).
        num_gpu: GPUs the job asked for originally (used by rigid policies only).
        duration: Runtime in seconds on ``num_gpu`` GPUs (informational).
        best_effort: True when the job has no deadline.
    """

    job_id: str
    submit: float
    deadline: float
    iterations: int
    model: str
    batch_size: int
    num_gpu: int
    duration: float
    best_effort: bool = False


def knee_of(curve: Mapping[int, float]) -> int:
    """The smallest size with the curve's highest throughput."""
    return max(curve, key=lambda n: (curve[n], -n))


@dataclass(frozen=True, slots=True)
class ThroughputTable:
    """Measured throughput (iterations/s of the whole job) by (model, batch size) and GPU count.

    Attributes:
        gpu_type: ``A100`` or ``T4``.
        curves: ``(model, batch_size) -> {gpus: iterations per second}``, allowed counts only.
    """

    gpu_type: str
    curves: Mapping[tuple[str, int], Mapping[int, float]]

    def curve(self, model: str, batch_size: int) -> Mapping[int, float]:
        """Throughput by GPU count of one (model, batch size); raises ``SpecError`` if unknown."""
        try:
            return self.curves[(model, batch_size)]
        except KeyError:
            raise SpecError(
                "model_name", f"no {self.gpu_type} throughput for {model}/{batch_size}"
            ) from None

    def elasticflow_cap(self, model: str, batch_size: int) -> int:
        """ElasticFlow's per-model GPU cap (the artifact's ``get_max_gpu``).

        The artifact sets it per profiled model, about where the model stops scaling: its planner
        assumes more GPUs never slow a job down. For a table the artifact never profiled (the
        seed paper's generated CPU table, whose curves fall past their knees) the cap is the
        curve's knee, the size it would have been given.
        """
        if self.gpu_type not in ("A100", "T4"):
            return knee_of(self.curve(model, batch_size))
        if self.gpu_type == "T4":
            if model == "deepspeech2" and batch_size == 320:
                return 32
            return _EF_CAP_T4.get(model, MAX_LEVEL)
        if model == "deepspeech2":
            return batch_size
        return _EF_CAP_A100.get((model, batch_size), min(batch_size, MAX_LEVEL))

    def generic_cap(self, model: str, batch_size: int) -> int:
        """Cap for every other policy: largest allowed column, at most 64 and the batch size."""
        allowed = [k for k in self.curve(model, batch_size) if k <= min(batch_size, MAX_LEVEL)]
        return max(allowed, default=0)

    def levels(self, model: str, batch_size: int, cap: int) -> tuple[int, ...]:
        """Allowed GPU counts (ascending) of a job, up to ``cap``."""
        return tuple(sorted(k for k in self.curve(model, batch_size) if k <= cap))


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """Size of a GPU cluster (``cluster_specs/nXgY.csv``).

    Attributes:
        switches: Number of switches.
        nodes_per_switch: Nodes under each switch.
        gpus_per_node: GPUs per node (the node size).
    """

    switches: int
    nodes_per_switch: int
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        """Total nodes."""
        return self.switches * self.nodes_per_switch

    @property
    def total(self) -> int:
        """Total GPUs."""
        return self.nodes * self.gpus_per_node

    @classmethod
    def parse(cls, text: str) -> ClusterShape:
        """Parse ``"16x8"`` (nodes x GPUs per node) into a one-switch shape."""
        parts = text.lower().split("x")
        if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise SpecError(
                "cluster", f"must look like 16x8 (nodes x units per node), got {text!r}"
            )
        return cls(1, int(parts[0]), int(parts[1]))


def cluster_shape(text: str) -> ClusterShape:
    """``NODESxUNITS`` (one switch), or the name of one of the artifact's specs (``n64g8``).

    Raises:
        SpecError: When ``text`` is neither.
        TraceError: When a named spec is missing or malformed.
    """
    if _CLUSTER_NAME.match(text):
        return load_cluster_spec(text)
    try:
        return ClusterShape.parse(text)
    except SpecError:
        raise SpecError(
            "cluster",
            f"must look like 16x8 (nodes x units per node) or name an ElasticFlow cluster spec "
            f"such as n64g8, got {text!r}",
        ) from None


def _rows(path: Path | Traversable) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) of a CSV file with a header; the header is line 1."""
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    try:
        if not reader.fieldnames:
            raise TraceError(str(path), 1, "", "empty file (no header)")
        for row in reader:
            yield reader.line_num, {k.strip(): (v or "").strip() for k, v in row.items() if k}
    except csv.Error as exc:  # raised before line_num counts the record's first line
        raise TraceError(str(path), reader.line_num + 1, "", f"not valid CSV ({exc})") from None


def _number(path: Path | Traversable, line: int, column: str, text: str, *, integer: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(str(path), line, column, f"not a number (got {text!r})") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(str(path), line, column, f"must be a finite number >= 0 (got {text!r})")
    if integer and value != int(value):
        raise TraceError(str(path), line, column, f"must be an integer (got {text!r})")
    return value


def _columns(path: Path | Traversable, header: Mapping[str, str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, names in _ALIASES.items():
        name = next((n for n in names if n in header), None)
        if name is None:
            raise TraceError(str(path), 1, names[0], f"missing column (one of {', '.join(names)})")
        found[key] = name
    return found


def _job(
    path: Path | Traversable, line: int, row: Mapping[str, str], cols: Mapping[str, str]
) -> TraceJob:
    def num(key: str, *, integer: bool) -> float:
        return _number(path, line, cols[key], row.get(cols[key], ""), integer=integer)

    job_id = row.get(cols["job_id"], "")
    if not job_id:
        raise TraceError(str(path), line, "job_id", "must not be empty")
    best = row.get("best_effort", "0") or "0"
    if best not in ("0", "1"):
        raise TraceError(str(path), line, "best_effort", f"must be 0 or 1 (got {best!r})")
    submit, iterations = num("submit", integer=False), int(num("iterations", integer=True))
    batch, num_gpu = int(num("batch_size", integer=True)), int(num("num_gpu", integer=True))
    for key, value in (("iterations", iterations), ("batch_size", batch), ("num_gpu", num_gpu)):
        if value < 1:
            raise TraceError(str(path), line, cols[key], f"must be >= 1 (got {value})")
    deadline = math.inf if best == "1" else num("deadline", integer=False)
    if deadline < submit:
        raise TraceError(str(path), line, cols["deadline"], f"before the submit time {submit:g}")
    model = row.get(cols["model"], "")
    if not model:
        raise TraceError(str(path), line, cols["model"], "must not be empty")
    return TraceJob(
        job_id=job_id,
        submit=submit,
        deadline=deadline,
        iterations=iterations,
        model=model,
        batch_size=batch,
        num_gpu=num_gpu,
        duration=num("duration", integer=False),
        best_effort=best == "1",
    )


def load_trace(path: Path | str, table: ThroughputTable | None = None) -> tuple[TraceJob, ...]:
    """Load a job trace (either ElasticFlow column-name variant), in file order.

    Args:
        path: The CSV file, or the stem of a packaged trace (``195job``, ``100jobs_1500lam``,
            ``elasticVpollux_e``) when no such file exists. A file under
            :func:`elasticflow_dir` that is packaged is read from the package.
        table: When given, every (model, batch size) must have a throughput curve in it.

    Returns:
        The jobs, in file order.

    Raises:
        TraceError: On a missing column, a bad value, a duplicate id or an unknown model/batch.
    """
    source = _source(path)
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    cols: dict[str, str] | None = None
    for line, row in _rows(source):
        cols = cols or _columns(source, row)
        job = _job(source, line, row, cols)
        if job.job_id in seen:
            raise TraceError(str(source), line, "job_id", f"duplicate id {job.job_id!r}")
        if table is not None and (job.model, job.batch_size) not in table.curves:
            raise TraceError(
                str(source),
                line,
                cols["model"],
                f"no {table.gpu_type} throughput for {job.model}/{job.batch_size}",
            )
        seen.add(job.job_id)
        jobs.append(job)
    if not jobs:
        raise TraceError(str(source), 1, "", "no jobs in the trace")
    return tuple(jobs)


def _table_file(
    path: Path | Traversable, model: str, out: dict[tuple[str, int], Mapping[int, float]]
) -> None:
    for line, row in _rows(path):
        batch_text = row.get("global_batch_size", "")
        batch = int(_number(path, line, "global_batch_size", batch_text, integer=True))
        curve: dict[int, float] = {}
        for k in LEVEL_COLUMNS:
            text = row.get(str(k), "")
            if text == "" or text.lower() == "nan":
                continue
            value = _number(path, line, str(k), text, integer=False)
            if value > 0:
                curve[k] = value
        if not curve:
            raise TraceError(str(path), line, "1", "no GPU count has a throughput")
        out[(model, batch)] = MappingProxyType(curve)


def load_throughputs(gpu_type: str | Path = "A100") -> ThroughputTable:
    """Load a throughput folder (``throughputs_<GPU>/<model>.csv``).

    Args:
        gpu_type: ``A100`` or ``T4`` (ElasticFlow's tables, packaged with qosflow), or a folder
            path whose name ends in ``_<GPU>``.

    Returns:
        The table of every model file in the folder.
    """
    folder: Path | Traversable
    if isinstance(gpu_type, Path):
        folder = _source(gpu_type)
    else:
        if gpu_type not in ("A100", "T4"):
            raise SpecError("gpu_type", f"must be A100 or T4 (got {gpu_type!r})")
        folder = elasticflow_file(f"{SCHEDULER}/throughputs_{gpu_type}")
    tables = (
        sorted((f for f in folder.iterdir() if f.name.endswith(".csv")), key=lambda f: f.name)
        if folder.is_dir()
        else []
    )
    if not tables:
        raise TraceError(str(folder), 0, "", "no throughput files (<model>.csv) in the folder")
    curves: dict[tuple[str, int], Mapping[int, float]] = {}
    for file in tables:
        _table_file(file, file.name.removesuffix(".csv"), curves)
    name = folder.name.rsplit("_", 1)[-1]
    return ThroughputTable(gpu_type=name, curves=MappingProxyType(curves))


def load_cluster_spec(spec: str | Path) -> ClusterShape:
    """Load a cluster spec: a path to ``nXgY.csv`` or just its name (``n16g8``, packaged).

    Raises:
        TraceError: When the file is missing or a field is not a positive integer.
    """
    path: Path | Traversable
    if _CLUSTER_NAME.match(str(spec)):
        path = elasticflow_file(f"{SCHEDULER}/cluster_specs/{spec}.csv")
    else:
        path = _source(spec)
    rows = list(_rows(path))
    if len(rows) != 1:
        raise TraceError(str(path), 2, "", f"expected exactly one data row (got {len(rows)})")
    line, row = rows[0]
    values = []
    for column in ("num_switch", "num_node_p_switch", "num_gpu_p_node"):
        value = int(_number(path, line, column, row.get(column, ""), integer=True))
        if value < 1:
            raise TraceError(str(path), line, column, f"must be >= 1 (got {value})")
        values.append(value)
    return ClusterShape(*values)
