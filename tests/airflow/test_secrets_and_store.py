"""No secret in XCom, logs, reprs or reports; a busy history store never fails a finished job
(issue 15)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

PASSWORD = "Pg-pa55-x9Q7zLm"
TOKEN = "argo-token-4f1c8e0b7d"
HISTORY_URL = f"postgresql+psycopg://qosflow:{PASSWORD}@db.example:5432/qosflow"
T0 = 1_800_000_000.0


class RecordingTI:
    """XCom in a dict; every value pushed or returned is kept for the scan."""

    def __init__(self) -> None:
        self.task_id = ""
        self.dag_id, self.map_index = "nightly", -1
        self.xcoms: dict[tuple[str, str], Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = json.loads(json.dumps(value))

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))


def _run(op: Any, ctx: dict[str, Any], method: str = "execute", **kw: Any) -> Any:
    ti = ctx["ti"]
    ti.task_id = op.task_id
    result = getattr(op, method)(ctx, **kw)
    if result is not None:
        ti.xcoms[(op.task_id, "return_value")] = json.loads(json.dumps(result))
    return result


def _deferred(op: Any, ctx: dict[str, Any], kwargs_seen: list[Any]) -> Any:
    """Defer, rebuild the trigger from its serialised kwargs, run it, resume the operator."""
    from airflow.sdk.exceptions import TaskDeferred

    from qosflow_airflow.triggers.progress import DeadlineProgressTrigger

    ctx["ti"].task_id = op.task_id
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(ctx)
    _path, kwargs = deferred.value.trigger.serialize()
    kwargs_seen.append(kwargs)  # Airflow stores these in its database too
    trigger = DeadlineProgressTrigger(**json.loads(json.dumps(kwargs)))
    event = asyncio.run(trigger.run().asend(None))
    return _run(op, ctx, "execute_complete", event=event.payload)


@pytest.fixture
def secret_connection(fake_cluster: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """The fake cluster behind a connection whose token and history password are secrets; the
    PostgreSQL URL is served by a SQLite file (the test has no PostgreSQL)."""
    import qosflow.store.history as history

    conn = {
        "conn_type": "qosflow_argo",
        "host": "http://127.0.0.1:1",
        "password": TOKEN,
        "extra": {
            "history_url": HISTORY_URL,
            "image": "registry.example/trainer:1",
            "checkpoint_claim": "qosflow-checkpoints",
        },
    }
    monkeypatch.setenv("AIRFLOW_CONN_QOSFLOW_DEFAULT", json.dumps(conn))
    real = history.HistoryStore
    sqlite_url = f"sqlite:///{tmp_path}/history.db"

    def store(url: str = HISTORY_URL) -> Any:
        assert url == HISTORY_URL  # the steps read the URL from the connection
        return real(sqlite_url)

    monkeypatch.setattr(history, "HistoryStore", store)
    fake_cluster.rate = 10.0  # 400 steps soon: the watch ends with done
    return fake_cluster


def _flow(tmp_path: Path, kwargs_seen: list[Any]) -> tuple[RecordingTI, dict[str, Any]]:
    from qosflow_airflow.operators.finish import FinishTrainingOperator
    from qosflow_airflow.operators.plan import PlanTrainingOperator, SubmitTrainingOperator
    from qosflow_airflow.sensors.progress import DeadlineProgressSensor

    ti = RecordingTI()
    ctx = {"ti": ti, "dag": None, "run_id": "manual__1", "dag_run": SimpleNamespace()}
    job = {
        "name": "secret-job",
        "total_steps": 400,
        "deadline": "PT20M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "step_seconds_estimate": 0.5,
    }
    _run(PlanTrainingOperator(task_id="plan", job=job), ctx)
    _run(SubmitTrainingOperator(task_id="submit", plan_task_id="plan"), ctx)
    watch = DeadlineProgressSensor(
        task_id="watch", state_task_ids=["submit"], poll_interval=0.0, hold_seconds=1e9
    )
    assert _deferred(watch, ctx, kwargs_seen)["status"] == "done"
    finish = FinishTrainingOperator(
        task_id="finish",
        plan_task_id="plan",
        watch_task_ids=["watch"],
        state_task_ids=["submit"],
        report_dir=str(tmp_path / "reports"),
        poll_interval=0.0,
    )
    _run(finish, ctx)
    return ti, ctx


def test_no_secret_in_any_xcom_log_line_trigger_kwarg_repr_or_report(
    secret_connection: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from qosflow.store.history import HistoryStore
    from qosflow_airflow.hooks.argo import QosflowArgoHook

    caplog.set_level(logging.DEBUG)
    kwargs_seen: list[Any] = []
    ti, _ctx = _flow(tmp_path, kwargs_seen)
    assert {task for task, _ in ti.xcoms} == {"plan", "submit", "watch", "finish"}
    assert ti.xcoms[("plan", "return_value")]["conn_id"] == "qosflow_default"
    report = ti.xcoms[("finish", "return_value")]
    assert "deadline met" in report["verdict"]
    # the history really was written (through the connection's URL)
    assert HistoryStore().count_samples() > 0
    config = QosflowArgoHook().config
    assert config.history_url == HISTORY_URL and config.token == TOKEN
    out = capsys.readouterr()
    texts = {
        "xcom": json.dumps([[list(k), v] for k, v in ti.xcoms.items()]),
        "trigger kwargs": json.dumps(kwargs_seen),
        "logs": caplog.text + out.out + out.err,
        "reprs": repr(config) + repr(QosflowArgoHook()),
        "report": report["table"] + Path(report["png"]).name,
    }
    for where, text in texts.items():
        for secret in (PASSWORD, TOKEN):
            assert secret not in text, f"{secret!r} leaks into the {where}"
    assert "qosflow:***@db.example" in repr(config)


def test_the_history_password_is_registered_with_airflows_log_masker(
    secret_connection: Any,
) -> None:
    from airflow.sdk._shared.secrets_masker import redact

    from qosflow_airflow.hooks.argo import QosflowArgoHook

    assert QosflowArgoHook().config.history_url  # reading the connection registers its secrets
    assert PASSWORD not in str(redact(f"connecting with {PASSWORD}"))


def test_states_written_before_this_change_are_read_without_their_url() -> None:
    from qosflow_airflow.state import TrainingState

    old = {
        "job": {"name": "j"},
        "workflow": "j-s0",
        "segment": 0,
        "units": 1,
        "priority_class": "qosflow-normal",
        "priority": 1,
        "guaranteed": True,
        "checkpoint_dir": "/c",
        "history_url": HISTORY_URL,
    }
    st = TrainingState.from_dict(old)
    assert PASSWORD not in json.dumps(st.to_dict()) and "history_url" not in st.to_dict()


# ------------------------------------------------------------------ a busy history store


def _locked_error() -> Exception:
    """A store error that says ``database is locked`` (its cause hidden, as ``from None`` does)."""
    from qosflow.store.history import HistoryError

    try:
        raise HistoryError("history store sqlite:///h.db: OperationalError: database is locked")
    except HistoryError as exc:
        return exc


def test_transient_store_errors_are_retryable_and_others_are_not(tmp_path: Path) -> None:
    import sqlalchemy.exc
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from qosflow.store.history import HistoryError
    from qosflow_airflow.operators.base import airflow_error, transient_store_error

    def from_cause(cause: BaseException, message: str = "history store x: failed") -> Exception:
        try:
            raise HistoryError(message) from cause
        except HistoryError as exc:
            return exc

    locked = sqlalchemy.exc.OperationalError("INSERT", {}, sqlite3.OperationalError("locked"))
    transient = [
        from_cause(locked),
        from_cause(sqlalchemy.exc.TimeoutError("QueuePool limit reached")),
        from_cause(ConnectionRefusedError(111, "refused")),
        _locked_error(),
    ]
    permanent = [
        from_cause(ImportError("No module named 'psycopg'")),
        from_cause(PermissionError(13, "denied")),
        HistoryError("history store 'h.db': the database is corrupt or not a SQLite database"),
    ]
    for exc in transient:
        assert transient_store_error(exc), exc
        mapped = airflow_error(exc)  # type: ignore[arg-type]
        assert isinstance(mapped, AirflowException) and not isinstance(mapped, AirflowFailException)
    for exc in permanent:
        assert not transient_store_error(exc), exc
        assert isinstance(airflow_error(exc), AirflowFailException)  # type: ignore[arg-type]


def _hold_lock(db: Path) -> sqlite3.Connection:
    holder = sqlite3.connect(db, timeout=0.05, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def _finish_flow_until_finish(tmp_path: Path) -> tuple[RecordingTI, dict[str, Any], Any]:
    from qosflow_airflow.operators.finish import FinishTrainingOperator
    from qosflow_airflow.operators.plan import PlanTrainingOperator, SubmitTrainingOperator
    from qosflow_airflow.sensors.progress import DeadlineProgressSensor

    ti = RecordingTI()
    ctx = {"ti": ti, "dag": None, "run_id": "manual__2", "dag_run": SimpleNamespace()}
    job = {
        "name": "locked-job",
        "total_steps": 400,
        "deadline": "PT20M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "step_seconds_estimate": 0.5,
    }
    _run(PlanTrainingOperator(task_id="plan", job=job), ctx)
    _run(SubmitTrainingOperator(task_id="submit", plan_task_id="plan"), ctx)
    watch = DeadlineProgressSensor(
        task_id="watch", state_task_ids=["submit"], poll_interval=0.0, hold_seconds=1e9
    )
    _deferred(watch, ctx, [])
    finish = FinishTrainingOperator(
        task_id="finish",
        plan_task_id="plan",
        watch_task_ids=["watch"],
        state_task_ids=["submit"],
        report_dir=str(tmp_path / "reports"),
        poll_interval=0.0,
        store_retry_s=30.0,
    )
    return ti, ctx, finish


@pytest.fixture
def busy_store(fake_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    import qosflow.store.history as history

    monkeypatch.setattr(history, "BUSY_TIMEOUT_MS", 50)  # "locked" in 50 ms, not 30 s
    fake_cluster.rate = 10.0
    return fake_cluster


def test_finish_waits_out_a_store_lock_and_records_the_run(busy_store: Any, tmp_path: Path) -> None:
    from qosflow.store.history import HistoryStore

    url = f"sqlite:///{tmp_path}/history.db"
    _ti, ctx, finish = _finish_flow_until_finish(tmp_path)
    holder = _hold_lock(tmp_path / "history.db")
    now, waits = [0.0], []

    def sleep(seconds: float) -> None:  # virtual time; the other writer lets go after 2 waits
        waits.append(seconds)
        now[0] += seconds
        if len(waits) == 2:
            holder.execute("COMMIT")

    finish.clock, finish.sleep = (lambda: now[0]), sleep
    result = _run(finish, ctx)
    assert "deadline met" in result["verdict"] and len(waits) == 2
    assert HistoryStore(url).count_samples() > 0
    holder.close()


def test_a_lock_held_too_long_fails_finish_retryably_and_the_retry_records_once(
    busy_store: Any, tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from qosflow.store.history import HistoryStore

    url = f"sqlite:///{tmp_path}/history.db"
    _ti, ctx, finish = _finish_flow_until_finish(tmp_path)
    holder = _hold_lock(tmp_path / "history.db")
    now = [0.0]
    finish.clock = lambda: now[0]
    finish.sleep = lambda s: now.__setitem__(0, now[0] + s)
    with pytest.raises(AirflowException) as err:
        _run(finish, ctx)
    assert not isinstance(err.value, AirflowFailException)  # the task's retries may cure it
    assert "locked" in str(err.value) and now[0] <= 30.0
    holder.execute("COMMIT")
    holder.close()
    retried = _run(finish, ctx)  # the task's next try: the job had succeeded all along
    assert "deadline met" in retried["verdict"]
    store = HistoryStore(url)
    stored = store.count_samples()
    _run(finish, ctx)  # and once more: nothing is stored twice
    assert store.count_samples() == stored > 0
    store.close()
