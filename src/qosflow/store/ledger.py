"""The promise ledger: guarantees a plan step gave whose workflow may not be on the cluster yet.

``HistoryStore.promise_ledger`` opens one exclusive transaction; inside it a plan step reads the
unexpired promises, decides, and records its own, so two DAGs planning at the same instant cannot
both be promised the same capacity.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, Float, String, Table, Text, delete, insert, select
from sqlalchemy.engine import Connection

from qosflow.store.schema import METADATA

PROMISE_TTL_S = 1800.0
"""How long a recorded promise reserves capacity before its workflow must be on the cluster."""

promises_table = Table(
    "qosflow_promises",
    METADATA,
    Column("job_id", String(253), primary_key=True),
    Column("unit", String(16), nullable=False),
    Column("block", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False, index=True),
)


class PromiseLedger:
    """The promise ledger inside :meth:`HistoryStore.promise_ledger`'s exclusive transaction."""

    def __init__(self, conn: Connection, now: float) -> None:
        """Wrap the open transaction."""
        self._conn, self._now = conn, now

    def pending(self, unit: str) -> dict[str, dict[str, Any]]:
        """Job id → admission block of every unexpired promise of ``unit`` kind."""
        t = promises_table.c
        rows = self._conn.execute(select(t.job_id, t.block).where(t.unit == unit)).all()
        out: dict[str, dict[str, Any]] = {}
        for job, text in rows:
            try:
                block = json.loads(text)
            except ValueError:
                continue
            if isinstance(block, dict):
                out[str(job)] = block
        return out

    def record(
        self, job_id: str, unit: str, block: Mapping[str, Any], *, ttl_s: float = PROMISE_TTL_S
    ) -> None:
        """Record (or renew, for a retried plan) the promise given to ``job_id``."""
        t = promises_table.c
        self._conn.execute(delete(promises_table).where(t.job_id == job_id))
        row = {
            "job_id": job_id,
            "unit": unit,
            "block": json.dumps(dict(block), allow_nan=False),
            "created_at": self._now,
            "expires_at": self._now + ttl_s,
        }
        self._conn.execute(insert(promises_table), [row])
