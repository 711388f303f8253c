"""The job board: every active qosflow job of a namespace, in the shared store.

Every plan and watch step of every DAG reads the same picture from here, runs the core's cluster
allocator (:func:`qosflow.core.allocator.allocate`) on it, and writes back its own job's row
only: what it measured (progress, size, its belief as tables), and what the allocator decided
for it (target size, class, guarantee, reason, and the allocator's memory of it). A step that
runs the allocator holds the board's lock from reading to writing
(:meth:`JobBoard.session`), so two steps never decide on the same free units at once: SQLite's
``BEGIN IMMEDIATE`` on one host, a table lock on PostgreSQL across hosts.

Beside the rows, the board keeps the namespace's recent arrivals (``qosflow_board_arrivals``):
each deadline job as its first ask saw it, which the allocator's forecast reads
(:mod:`qosflow.core.forecast`) long after the job's own row is gone.

A job whose DAG run died stops sending heartbeats; after :data:`HEARTBEAT_TTL_S` it leaves the
board and its capacity counts as free. A paused job (target 0) stays on the board: its deadline
still counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Boolean, Column, Float, Integer, String, Table, Text, delete, select
from sqlalchemy.engine import Connection

from qosflow.store.history import HistoryStore
from qosflow.store.schema import METADATA

HEARTBEAT_TTL_S = 600.0
"""A job whose steps have not written its row for this long has left the board."""
FINISHED_TTL_S = 3600.0
"""How long a finished job's row is kept (its end frees capacity: waiting jobs are asked again)."""

board_table = Table(
    "qosflow_board",
    METADATA,
    Column("namespace", String(253), primary_key=True),
    Column("job_id", String(253), primary_key=True),
    Column("unit", String(16), nullable=False),
    Column("spec", Text, nullable=False),
    Column("done", Float, nullable=False, default=0.0),
    Column("units", Integer, nullable=False, default=0),
    Column("target", Integer, nullable=False, default=0),
    Column("klass", String(63), nullable=False, default=""),
    Column("guaranteed", Boolean, nullable=False, default=False),
    Column("reason", Text, nullable=False, default=""),
    Column("belief", Text, nullable=False, default="{}"),
    Column("state", Text, nullable=False, default="{}"),
    Column("overhead_s", Float, nullable=False, default=30.0),
    Column("heartbeat", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
)

arrivals_table = Table(
    "qosflow_board_arrivals",
    METADATA,
    Column("namespace", String(253), primary_key=True),
    Column("unit", String(16), primary_key=True),
    Column("job_id", String(253), primary_key=True),
    Column("submitted_at", Float, nullable=False),
    Column("arrival", Text, nullable=False),
)


@dataclass(frozen=True, slots=True)
class BoardEntry:
    """One job's row.

    Attributes:
        job_id: The job's id (its workflows are ``<job_id>-s<k>``).
        unit: Its unit kind.
        spec: Its spec as JSON (``qosflow_airflow.state.job_to_dict``'s form).
        done: Steps done at the last observation.
        units: Units it holds now (0: waiting or paused).
        target: The allocator's target size for it.
        klass: Its PriorityClass.
        guaranteed: Whether it holds a guarantee.
        reason: The allocator's reason, in words.
        belief: Its belief (``qosflow.core.summary.belief_to_dict``), ``{}`` before any.
        state: The allocator's memory of it (``qosflow.core.summary.state_to_dict``).
        overhead_s: What a rescale costs it.
        heartbeat: When a step of it last wrote the row.
        finished_at: When it ended (``None`` while active).
    """

    job_id: str
    unit: str
    spec: Mapping[str, Any]
    done: float = 0.0
    units: int = 0
    target: int = 0
    klass: str = ""
    guaranteed: bool = False
    reason: str = ""
    belief: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    overhead_s: float = 30.0
    heartbeat: float = 0.0
    finished_at: float | None = None

    @property
    def active(self) -> bool:
        """Still running, waiting or paused."""
        return self.finished_at is None


def _row(namespace: str, e: BoardEntry) -> dict[str, Any]:
    return {
        "namespace": namespace,
        "job_id": e.job_id,
        "unit": e.unit,
        "spec": json.dumps(dict(e.spec), allow_nan=False, sort_keys=True),
        "done": e.done,
        "units": e.units,
        "target": e.target,
        "klass": e.klass,
        "guaranteed": e.guaranteed,
        "reason": e.reason,
        "belief": json.dumps(dict(e.belief), allow_nan=False, sort_keys=True),
        "state": json.dumps(dict(e.state), allow_nan=False, sort_keys=True),
        "overhead_s": e.overhead_s,
        "heartbeat": e.heartbeat,
        "finished_at": e.finished_at,
    }


def _entry(row: Any) -> BoardEntry:
    m = row._mapping
    return BoardEntry(
        job_id=str(m["job_id"]),
        unit=str(m["unit"]),
        spec=json.loads(m["spec"]),
        done=float(m["done"]),
        units=int(m["units"]),
        target=int(m["target"]),
        klass=str(m["klass"]),
        guaranteed=bool(m["guaranteed"]),
        reason=str(m["reason"]),
        belief=json.loads(m["belief"] or "{}"),
        state=json.loads(m["state"] or "{}"),
        overhead_s=float(m["overhead_s"]),
        heartbeat=float(m["heartbeat"]),
        finished_at=None if m["finished_at"] is None else float(m["finished_at"]),
    )


class BoardSession:
    """The board inside one locked transaction (:meth:`JobBoard.session`)."""

    def __init__(self, conn: Connection, namespace: str, now: float) -> None:
        """Wrap the open transaction."""
        self._conn, self.namespace, self.now = conn, namespace, now

    def entries(self, unit: str) -> list[BoardEntry]:
        """Every row of ``unit`` kind, active and recently finished, in arrival order."""
        t = board_table.c
        rows = self._conn.execute(
            select(board_table)
            .where(t.namespace == self.namespace, t.unit == unit)
            .order_by(t.job_id)
        ).all()
        entries = [_entry(r) for r in rows]
        return sorted(entries, key=lambda e: (float(e.spec.get("submitted_at", 0.0)), e.job_id))

    def get(self, job_id: str) -> BoardEntry | None:
        """One row, or ``None``."""
        t = board_table.c
        row = self._conn.execute(
            select(board_table).where(t.namespace == self.namespace, t.job_id == job_id)
        ).first()
        return _entry(row) if row is not None else None

    def put(self, entry: BoardEntry) -> None:
        """Write (insert or replace) one job's row, stamped with this session's time."""
        self._write(replace(entry, heartbeat=self.now))

    def decide(self, entry: BoardEntry) -> None:
        """Write the allocator's answer into another job's row, keeping that job's heartbeat.

        Only a job's own steps stamp its heartbeat (a job whose run died must still leave the
        board after :data:`HEARTBEAT_TTL_S`).
        """
        self._write(entry)

    def _write(self, entry: BoardEntry) -> None:
        t = board_table.c
        self._conn.execute(
            delete(board_table).where(t.namespace == self.namespace, t.job_id == entry.job_id)
        )
        self._conn.execute(board_table.insert(), [_row(self.namespace, entry)])

    def arrivals(self, unit: str) -> list[dict[str, Any]]:
        """The recent arrivals of ``unit`` kind (``qosflow.core.forecast.arrival_to_dict``)."""
        t = arrivals_table.c
        rows = self._conn.execute(
            select(arrivals_table.c.arrival)
            .where(t.namespace == self.namespace, t.unit == unit)
            .order_by(t.submitted_at, t.job_id)
        ).all()
        return [json.loads(r.arrival) for r in rows]

    def keep_arrivals(self, unit: str, arrivals: Sequence[Mapping[str, Any]]) -> None:
        """Keep exactly ``arrivals`` (each with ``name`` and ``submitted_at``) for ``unit``."""
        t = arrivals_table.c
        self._conn.execute(
            delete(arrivals_table).where(t.namespace == self.namespace, t.unit == unit)
        )
        if arrivals:
            self._conn.execute(
                arrivals_table.insert(),
                [
                    {
                        "namespace": self.namespace,
                        "unit": unit,
                        "job_id": str(a["name"]),
                        "submitted_at": float(a["submitted_at"]),
                        "arrival": json.dumps(dict(a), allow_nan=False, sort_keys=True),
                    }
                    for a in arrivals
                ],
            )

    def finish(self, job_id: str) -> None:
        """Mark a job ended: its units are free from now on (kept a while: see ``freed``)."""
        entry = self.get(job_id)
        if entry is not None and entry.active:
            self.put(replace(entry, finished_at=self.now, units=0, target=0))


class JobBoard:
    """The board of one namespace in a history store's database.

    Args:
        store: The shared store (its database holds the board's table).
        namespace: The namespace of the jobs (one board per namespace).
    """

    def __init__(self, store: HistoryStore, namespace: str) -> None:
        """Create the board's table if needed."""
        self.store, self.namespace = store, namespace
        with store.transaction() as conn:
            board_table.create(conn, checkfirst=True)
            arrivals_table.create(conn, checkfirst=True)

    @contextmanager
    def session(self, now: float) -> Iterator[BoardSession]:
        """Read, decide and write under the board's lock; stale and long-finished rows go.

        A row whose heartbeat is older than :data:`HEARTBEAT_TTL_S` (its DAG run died) and a
        finished row older than :data:`FINISHED_TTL_S` are deleted on the way in.

        Raises:
            qosflow.store.history.HistoryError: When the database fails (nothing is written).
        """
        t = board_table.c
        with self.store.transaction(lock="qosflow_board") as conn:
            conn.execute(
                delete(board_table).where(
                    t.namespace == self.namespace,
                    (t.finished_at.is_(None) & (t.heartbeat < now - HEARTBEAT_TTL_S))
                    | (t.finished_at < now - FINISHED_TTL_S),
                )
            )
            yield BoardSession(conn, self.namespace, now)
