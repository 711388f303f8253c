"""The history store: yesterday's observed speeds and prediction errors, for today's plan.

Three tables; the first two are keyed by the job's history key (``JobSpec.key``):

* ``qosflow_samples`` — observed progress samples ``(time, steps_done, units)`` per (key, unit
  kind). :meth:`HistoryStore.prior` fits them with :func:`qosflow.core.fit.fit`, so tomorrow night's
  run of the same pipeline starts from a fitted speed model instead of the pessimistic default.
* ``qosflow_predictions`` — (predicted remaining s, realised remaining s) pairs;
  :meth:`HistoryStore.calibration` turns them into the split-conformal inflation factor with
  :func:`qosflow.core.predict.calibrate`.
* ``qosflow_promises`` — the promise ledger: guarantees given by a plan step whose workflow may
  not be on the cluster yet. :meth:`HistoryStore.promise_ledger` lets one plan step at a time
  read them, decide and record its own, so two DAGs planning at the same instant cannot both be
  promised the same capacity.

Any SQLAlchemy URL works (PostgreSQL for a multi-worker Airflow). The default is a SQLite file in
WAL mode with a busy timeout and ``BEGIN IMMEDIATE`` write transactions, so two processes (the
Airflow triggerer and a worker, say) can write at once without losing a row. Recording the same
sample twice (a retried task) stores it once.

Opening a SQLite file checks it first: its folder must be creatable and writable (SQLite puts its
``-wal`` and ``-shm`` files beside the database), the file readable and writable, and
``PRAGMA quick_check`` must pass, so a damaged database is refused at open, naming the file,
instead of failing some later query (or answering from a broken index). Every such failure is a
:class:`HistoryError` naming the path; URLs in messages never show a password.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Column,
    Engine,
    Float,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    func,
    insert,
    inspect,
    select,
)
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from qosflow.core.errors import QosflowError, SpecError
from qosflow.core.prior import HISTORY_LIMIT, end_to_end, prior_of
from qosflow.store import timings as key_timings
from qosflow.store.ledger import PromiseLedger, promises_table
from qosflow.store.schema import METADATA

if TYPE_CHECKING:
    from qosflow.core.fit import Measured
    from qosflow.core.predict import Calibration
    from qosflow.core.speed import ProgressSample, SpeedModel

__all__ = ["DEFAULT_URL", "HistoryError", "HistoryStore"]

DEFAULT_URL = "sqlite:///.qosflow/history.db"
BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for the other writer's lock before giving up."""

samples_table = Table(
    "qosflow_samples",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(253), nullable=False),
    Column("unit", String(16), nullable=False),
    Column("time", Float, nullable=False),
    Column("steps_done", Integer, nullable=False),
    Column("units", Integer, nullable=False),
    Column(
        "share", Float, nullable=True
    ),  # CPU share got over the interval before (qosflow.core.usage)
    Column("pods", Integer, nullable=True),  # the units ran as pods × units/pod (null: 1 pod)
    UniqueConstraint("key", "unit", "time", "steps_done", "units", name="uq_qosflow_sample"),
    Index("ix_qosflow_samples_key_unit_time", "key", "unit", "time"),
)
predictions_table = Table(
    "qosflow_predictions",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(253), nullable=False, index=True),
    Column("predicted", Float, nullable=False),
    Column("realised", Float, nullable=False),
    UniqueConstraint("key", "predicted", "realised", name="uq_qosflow_prediction"),
)


class HistoryError(QosflowError):
    """The history database refused or failed (the message names the URL without password)."""


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # let the "begin" hook issue BEGIN IMMEDIATE
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    _wal(cursor)
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.close()


def _wal(cursor: Any) -> None:
    """Switch to WAL mode, retrying while another connection holds the lock it needs.

    Switching the journal mode needs an exclusive lock, and SQLite may answer "database is
    locked" at once instead of waiting ``busy_timeout`` (its deadlock avoidance): two processes
    opening a new history database at the same moment hit it. So retry, backing off, for up to
    :data:`BUSY_TIMEOUT_MS`.
    """
    give_up = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > give_up:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.5)


def prepare_sqlite_file(path: Path) -> None:
    """Create the folder of a SQLite database and check the file before SQLite opens it.

    Args:
        path: The database file, as SQLite will open it (relative to the working directory).

    Raises:
        HistoryError: Naming the path, when the folder cannot be created or written, the path
            is not a regular file or cannot be read and written, or :func:`quick_check` fails.
    """
    where = f"history store {str(path)!r}"
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise HistoryError(f"{where}: cannot create folder {str(folder)!r}: it is a file") from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise HistoryError(f"{where}: cannot create folder {str(folder)!r}: {reason}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HistoryError(
            f"{where}: cannot write folder {str(folder)!r}: permission denied "
            "(SQLite keeps -wal and -shm files beside the database)"
        )
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise HistoryError(f"{where}: not a regular file")
        with path.open("r+b"):  # the permissions SQLite needs, with the OS's own answer
            pass
    except FileNotFoundError:
        return  # a new database: SQLite creates it
    except OSError as exc:
        raise HistoryError(f"{where}: cannot open: {exc.strerror or exc}") from None
    quick_check(path)


def quick_check(path: Path) -> None:
    """Run ``PRAGMA quick_check`` on an existing SQLite file (reads the whole file once).

    It finds damaged pages, records and b-tree structure; a flipped bit inside a stored value
    is beyond any SQLite check (the file format keeps no checksums).

    Raises:
        HistoryError: Saying the database is corrupt (or not a SQLite database), or that it could
            not be checked (locked for longer than the busy timeout, an I/O error).
    """
    where = f"history store {str(path)!r}"
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        raise HistoryError(f"{where}: cannot open: {exc}") from None
    try:
        db.text_factory = bytes  # a damaged schema may not even decode
        rows = db.execute("PRAGMA quick_check").fetchall()
        problems = [bytes(r[0]).decode(errors="replace") for r in rows if r[0] != b"ok"]
    except sqlite3.OperationalError as exc:  # busy, I/O: not evidence of damage
        raise HistoryError(f"{where}: cannot check the database: {exc}") from None
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # "file is not a database", ...
        problems = [str(exc)]
    finally:
        db.close()
    if problems:
        detail = " ".join(" ".join(problems).split())[:300]
        raise HistoryError(
            f"{where}: the database is corrupt or not a SQLite database (quick_check: {detail}); "
            "move it away to start a new history, or restore a backup"
        )


def _begin_immediate(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


_DDL_LOCK = 0x716F73666C6F77
"""PostgreSQL advisory lock key held while the tables are created (``CREATE TABLE IF NOT
EXISTS`` races on the catalogue when two processes create the same table at once)."""


def _engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise SpecError("history.url", f"not a SQLAlchemy URL ({exc})") from None
    if parsed.get_backend_name() != "sqlite":
        try:
            return create_engine(parsed, pool_pre_ping=True)
        except (ImportError, SQLAlchemyError) as exc:  # e.g. the database driver is missing
            where = parsed.render_as_string(hide_password=True)
            raise HistoryError(f"history store {where}: {exc}") from exc
    memory = parsed.database in (None, "", ":memory:")
    if not memory and parsed.database is not None and not parsed.query.get("uri"):
        prepare_sqlite_file(Path(parsed.database))
    try:
        engine = create_engine(
            parsed,
            connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            poolclass=StaticPool if memory else None,
        )
    except ArgumentError as exc:  # e.g. a user or host in a SQLite URL (rendered without password)
        raise SpecError("history.url", str(exc).replace("\n", " ")) from None
    event.listen(engine, "connect", _sqlite_pragmas)
    event.listen(engine, "begin", _begin_immediate)
    return engine


class HistoryStore:
    """Observed progress and prediction errors per job key, in any SQLAlchemy database.

    Args:
        url: SQLAlchemy URL; relative SQLite paths are relative to the working directory and
            their folder is created.

    Raises:
        SpecError: When ``url`` is not a SQLAlchemy URL.
        HistoryError: When the database cannot be opened or its tables created.
    """

    def __init__(self, url: str = DEFAULT_URL) -> None:
        self.url = url
        self._engine = _engine(url)
        with self._tx() as conn:
            if conn.dialect.name == "postgresql":  # two stores opening a new database at once
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_DDL_LOCK})")
            METADATA.create_all(conn)
        self._add_missing_columns()

    def _add_missing_columns(self) -> None:
        """Bring a database made by an older qosflow up to date (columns added since)."""
        for column, kind in (("share", "FLOAT"), ("pods", "INTEGER")):
            with self._tx() as conn:
                have = {c["name"] for c in inspect(conn).get_columns("qosflow_samples")}
            if column in have:
                continue
            try:
                with self._tx() as conn:
                    conn.exec_driver_sql(f"ALTER TABLE qosflow_samples ADD COLUMN {column} {kind}")
            except HistoryError:  # another process added it a moment ago
                with self._tx() as conn:
                    have = {c["name"] for c in inspect(conn).get_columns("qosflow_samples")}
                if column not in have:
                    raise

    @contextmanager
    def transaction(self, *, lock: str | None = None) -> Iterator[Connection]:
        """One write transaction (SQLite: ``BEGIN IMMEDIATE``, so writers take turns).

        Args:
            lock: A table to lock for the whole transaction on PostgreSQL (``SHARE ROW
                EXCLUSIVE``: one such transaction at a time, readers still read).

        Raises:
            HistoryError: When the database fails (nothing is written then).
        """
        with self._tx() as conn:
            if lock is not None and conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"LOCK TABLE {lock} IN SHARE ROW EXCLUSIVE MODE")
            yield conn

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        try:
            with self._engine.begin() as conn:
                yield conn
        except SQLAlchemyError as exc:
            where = make_url(self.url).render_as_string(hide_password=True)
            raise HistoryError(f"history store {where}: {exc.__class__.__name__}: {exc}") from exc

    def close(self) -> None:
        """Release the database connections."""
        self._engine.dispose()

    def record_samples(self, key: str, unit: str, samples: Sequence[ProgressSample]) -> None:
        """Store progress samples of one job; samples already stored are skipped."""
        rows = [
            {
                "key": key,
                "unit": unit,
                "time": s.time,
                "steps_done": s.steps_done,
                "units": s.units,
                "share": s.share,
                "pods": s.pods,
            }
            for s in samples
        ]
        if not rows:
            return
        with self._tx() as conn:
            conn.execute(self._insert_ignoring_duplicates(conn, samples_table), rows)

    def _insert_ignoring_duplicates(self, conn: Connection, table: Table) -> Any:
        name = conn.dialect.name
        if name == "sqlite":
            from sqlalchemy.dialects import sqlite

            return sqlite.insert(table).on_conflict_do_nothing()
        if name == "postgresql":
            from sqlalchemy.dialects import postgresql

            return postgresql.insert(table).on_conflict_do_nothing()
        if name in ("mysql", "mariadb"):
            return insert(table).prefix_with("IGNORE")
        return insert(table)

    def samples(self, key: str, unit: str, *, limit: int = HISTORY_LIMIT) -> list[ProgressSample]:
        """The newest ``limit`` samples of ``key`` on ``unit``, in the order they were recorded.

        Recording order (not time) keeps each recorded run contiguous even when two runs of the
        same key overlapped in time.
        """
        from qosflow.core.speed import ProgressSample  # lazy: keeps writer processes light

        t = samples_table.c
        query = (
            select(t.time, t.steps_done, t.units, t.share, t.pods)
            .where(t.key == key, t.unit == unit)
            .order_by(t.id.desc())
            .limit(max(limit, 0))
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [
            ProgressSample(
                float(r[0]),
                int(r[1]),
                int(r[2]),
                None if r[3] is None else float(r[3]),
                int(r[4] or 1),
            )
            for r in reversed(rows)
        ]

    def history(self, key: str, unit: str, *, limit: int = HISTORY_LIMIT) -> list[ProgressSample]:
        """The newest samples of ``key`` on ``unit``, ready to fit: runs laid end to end.

        Two runs of one key may overlap in time (two DAG runs, or a retry next to a slow run).
        The fit orders samples by time, which would interleave them into nonsense; so each run
        (contiguous in recording order) that starts before the previous one ended is shifted to
        start just after it. Step times within a run are unchanged; runs that did not overlap
        keep their times.
        """
        return end_to_end(self.samples(key, unit, limit=limit))

    def count_samples(self, key: str | None = None) -> int:
        """Number of stored samples, of one key or of all."""
        query = select(func.count()).select_from(samples_table)
        if key is not None:
            query = query.where(samples_table.c.key == key)
        with self._tx() as conn:
            return int(conn.execute(query).scalar_one())

    def record_timing(
        self, key: str, unit: str, *, units: int, step_seconds: float, at: float
    ) -> None:
        """Record a user's timing of ``key`` at ``units`` (:mod:`qosflow.store.timings`)."""
        with self._tx() as conn:
            key_timings.record(conn, key, unit, units=units, step_seconds=step_seconds, at=at)

    def timings(self, key: str, unit: str) -> list[Measured]:
        """The users' timings of ``key``, newest first, each one window at its size."""
        with self._tx() as conn:
            return key_timings.read(conn, key, unit)

    def record_prediction(
        self, key: str, predicted_remaining: float, realised_remaining: float
    ) -> None:
        """Log one (predicted remaining s, realised remaining s) pair for conformal calibration.

        Recording the same pair twice (a retried task) stores it once.
        """
        row = {"key": key, "predicted": predicted_remaining, "realised": realised_remaining}
        with self._tx() as conn:
            conn.execute(self._insert_ignoring_duplicates(conn, predictions_table), [row])

    def predictions(self, key: str, *, limit: int = 5000) -> list[tuple[float, float]]:
        """The newest ``limit`` (predicted, realised) pairs of ``key``, oldest first."""
        t = predictions_table.c
        query = (
            select(t.predicted, t.realised).where(t.key == key).order_by(t.id.desc()).limit(limit)
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [(float(p), float(r)) for p, r in reversed(rows)]

    def calibration(self, key: str) -> Calibration:
        """Split-conformal inflation learnt from the logged pairs (the default without any)."""
        from qosflow.core.predict import calibrate

        return calibrate(self.predictions(key))

    @contextmanager
    def promise_ledger(self, now: float) -> Iterator[PromiseLedger]:
        """One plan step at a time: read the promises, decide, record its own, then release.

        Everything inside runs in one exclusive transaction (SQLite: ``BEGIN IMMEDIATE``;
        PostgreSQL: a table lock), so a second plan step waits here until the first has recorded
        its promise, and then sees it. Expired promises are dropped on the way in.

        Raises:
            HistoryError: When the database fails (nothing is recorded then).
        """
        with self.transaction(lock="qosflow_promises") as conn:
            conn.execute(delete(promises_table).where(promises_table.c.expires_at <= now))
            yield PromiseLedger(conn, now)

    def prior(self, key: str, unit: str, node_size: int) -> SpeedModel | None:
        """Speed model fitted over the stored samples, or ``None`` when they cannot be fitted."""
        return prior_of(self.history(key, unit), node_size)
