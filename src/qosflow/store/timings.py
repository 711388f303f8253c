"""Users' timings of a key: a spec's ``step_seconds_estimate`` timed above one node.

A user who timed a job at a size past one node measured the key (its model and batch size)
there once. The plan step records that timing here, and every later plan and watch of the key
counts it as one window measured at that size where no run of the key measured
(:func:`qosflow.core.prior.timed`). Each ``(key, unit, size)`` keeps its newest timing: a user
who times the job again replaces it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from sqlalchemy import Column, Float, Integer, String, Table, delete, insert, select
from sqlalchemy.engine import Connection

from qosflow.store.schema import METADATA

if TYPE_CHECKING:
    from qosflow.core.fit import Measured

timings_table = Table(
    "qosflow_timings",
    METADATA,
    Column("key", String(253), primary_key=True),
    Column("unit", String(16), primary_key=True),
    Column("units", Integer, primary_key=True),
    Column("step_seconds", Float, nullable=False),
    Column("timed_at", Float, nullable=False),
)


def record(
    conn: Connection, key: str, unit: str, *, units: int, step_seconds: float, at: float
) -> None:
    """Record (or replace) the timing of ``key`` at ``units``, inside an open transaction.

    An upsert, so two plan steps recording the same size at once both succeed (the later
    one's timing stays).
    """
    row = {"key": key, "unit": unit, "units": units, "step_seconds": step_seconds, "timed_at": at}
    new = {"step_seconds": step_seconds, "timed_at": at}
    name = conn.dialect.name
    if name in ("sqlite", "postgresql"):  # the same upsert in both dialects
        dialect = importlib.import_module(f"sqlalchemy.dialects.{name}")
        stmt = dialect.insert(timings_table).values(row)
        conn.execute(stmt.on_conflict_do_update(index_elements=["key", "unit", "units"], set_=new))
        return
    t = timings_table.c
    conn.execute(delete(timings_table).where(t.key == key, t.unit == unit, t.units == units))
    conn.execute(insert(timings_table), [row])


def read(conn: Connection, key: str, unit: str) -> list[Measured]:
    """The key's timings, newest first, each one window at its size."""
    from qosflow.core.fit import Measured  # lazy: keeps writer processes light

    t = timings_table.c
    rows = conn.execute(
        select(t.units, t.step_seconds)
        .where(t.key == key, t.unit == unit)
        .order_by(t.timed_at.desc(), t.units)
    ).all()
    return [Measured(int(units), float(step), 1) for units, step in rows]
