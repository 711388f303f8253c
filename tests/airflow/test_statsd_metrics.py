"""qosflow's metrics reach a StatsD server through Airflow's own stats client (issue 19).

A UDP StatsD listener on loopback (a socket read by a thread; the tests wait on its data, never
on a clock) receives what the steps send when Airflow is configured the way a deployment would
be (``[metrics] statsd_on``, host, port, prefix). Emission never fails a task: metrics off, a
closed port, a misconfigured backend or a client that raises are all swallowed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

PREFIX = "qftest"
KEY = "team.ranking/v2 nightly"
SAFE_KEY = "team_ranking_v2_nightly"  # what every backend accepts: `.`, `/`, ` ` become `_`
STOP = b"__stop__"


class StatsdListener:
    """A StatsD server on 127.0.0.1: every line received, in order, and a wait on them."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="statsd-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (data := self.sock.recv(65535)) != STOP:
            with self._cond:
                self.lines += data.decode().splitlines()
                self._cond.notify_all()

    def close(self) -> None:
        if self.sock.fileno() < 0:  # closed already
            return
        self.sock.sendto(STOP, ("127.0.0.1", self.port))
        self._thread.join(timeout=10)
        self.sock.close()

    def wait_for(self, names: set[str], timeout: float = 30.0) -> dict[str, list[float]]:
        """Every value of every metric once all of ``names`` arrived (or what came, on timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: names <= set(self.values()), timeout=timeout)
            return self.values()

    def values(self) -> dict[str, list[float]]:
        """Metric name (without the prefix) → the values it took, in order.

        A gauge line with a sign is a change of the last value (the StatsD client sends a
        negative gauge as ``0|g`` then ``-x|g``); counters list each increment.
        """
        out: dict[str, list[float]] = {}
        for line in list(self.lines):
            name, _, rest = line.partition(":")
            value, kind = rest.split("|")[:2]
            seen = out.setdefault(name.removeprefix(f"{PREFIX}."), [])
            if kind == "g" and value[0] in "+-" and seen:
                seen[-1] += float(value)
            else:
                seen.append(float(value))
        return out


@contextmanager
def statsd_env(**extra: str) -> Iterator[StatsdListener]:
    """Airflow's ``[metrics]`` pointed at a fresh listener (and put back afterwards)."""
    from qosflow_airflow import metrics

    listener = StatsdListener()
    env = {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(listener.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
        **{f"AIRFLOW__METRICS__{k.upper()}": v for k, v in extra.items()},
    }
    try:
        with mock.patch.dict(os.environ, env):
            metrics.configure()  # what a process started with this config would have done
            yield listener
    finally:
        metrics.configure()  # back to the session's config (metrics off)
        listener.close()


@pytest.fixture
def statsd() -> Iterator[StatsdListener]:
    with statsd_env() as listener:
        yield listener


def _names(*names: str) -> set[str]:
    return {f"qosflow.{n}.{SAFE_KEY}" for n in names}


# ---- the steps, driven as Airflow drives them (plan → submit → watch → rescale → finish)


class TI:
    """XCom of one DAG run; ``as_task`` gives the view a task pushes through."""

    def __init__(self) -> None:
        self.task_id = ""
        self.dag_id, self.map_index = "metrics", -1
        self.xcoms: dict[tuple[str, str], Any] = {}

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[(self.task_id, key)] = json.loads(json.dumps(value))


def _run(op: Any, ti: TI, method: str = "execute", **kw: Any) -> Any:
    ti.task_id = op.task_id
    result = getattr(op, method)({"ti": ti, "dag": None, "run_id": "r1"}, **kw)
    if result is not None:
        ti.xcoms[(op.task_id, "return_value")] = json.loads(json.dumps(result))
    return result


def _watch(ti: TI, task_id: str, state_task_ids: list[str], hold: float) -> dict[str, Any]:
    """A round's watch: defer, rebuild the trigger from its kwargs, run it, resume the sensor."""
    from airflow.sdk.exceptions import TaskDeferred

    from qosflow_airflow.sensors.progress import DeadlineProgressSensor
    from qosflow_airflow.triggers.progress import DeadlineProgressTrigger

    sensor = DeadlineProgressSensor(
        task_id=task_id, state_task_ids=state_task_ids, poll_interval=0.0, hold_seconds=hold
    )
    ti.task_id = task_id
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({"ti": ti})
    _path, kwargs = deferred.value.trigger.serialize()
    trigger = DeadlineProgressTrigger(**json.loads(json.dumps(kwargs)))
    event = asyncio.run(trigger.run().asend(None)).payload
    return dict(_run(sensor, ti, "execute_complete", event=event))


def _late_job_rescaled_to_its_end(ti: TI) -> tuple[dict[str, Any], dict[str, Any]]:
    """A job planned on 1 CPU that needs 2: round 1 scales it up, round 2 watches it end."""
    from qosflow_airflow.operators.plan import PlanTrainingOperator, SubmitTrainingOperator
    from qosflow_airflow.operators.rescale import RescaleOperator

    job = {
        "name": "late-job",
        "key": KEY,
        "total_steps": 300,
        "deadline": "PT4M",
        "resources": {"unit": "cpu", "min": 1, "max": 2, "per_node": 2},
        "dwell_seconds": 10,
        "margin_seconds": 5,
        "step_seconds_estimate": 1.0,
    }
    _run(PlanTrainingOperator(task_id="plan", job=job, initial_units=1), ti)
    _run(SubmitTrainingOperator(task_id="submit", plan_task_id="plan"), ti)
    first = _watch(ti, "round_1.watch", ["submit"], hold=0.0)
    rescale = RescaleOperator(
        task_id="round_1.rescale", watch_task_id="round_1.watch", state_task_ids=["submit"]
    )
    _run(rescale, ti)
    last = _watch(ti, "round_2.watch", ["round_1.rescale", "submit"], hold=1e9)  # to the end
    return first, last


def test_every_metric_reaches_statsd_with_the_job_key(
    fake_cluster: Any, statsd: StatsdListener
) -> None:
    from qosflow_airflow import metrics

    event, end = _late_job_rescaled_to_its_end(TI())
    decision = event["decision"]
    assert decision["action"] == "scale_up" and decision["units"] == 2, event["message"]
    assert end["status"] == "done", end["message"]
    # the finish step calls this when the job ended; here directly, for a guarantee it missed
    metrics.job_finished(KEY, met=False, lateness_s=42.5, guaranteed=True)

    gauges = _names("units", "predicted_finish_seconds", "slack_seconds", "lateness_seconds")
    counters = _names(
        "decisions.scale_up",
        "decisions.done",
        "rescales.restart",
        "jobs_finished.missed",
        "guarantee_violations",
    )
    got = statsd.wait_for(gauges | counters)
    assert gauges | counters <= set(got), sorted(got)
    units = got[f"qosflow.units.{SAFE_KEY}"]
    assert units[0] == 1 and 2 in units and units[-1] == 0  # 1 CPU, then 2, then ended
    # the fired decision's own prediction was sent at the poll that fired it
    slack = decision["deadline"] - decision["median_finish"]
    assert slack in got[f"qosflow.slack_seconds.{SAFE_KEY}"]
    assert (
        decision["median_finish"] - event["time"]
        in got[f"qosflow.predicted_finish_seconds.{SAFE_KEY}"]
    )
    assert got[f"qosflow.lateness_seconds.{SAFE_KEY}"] == [42.5]
    assert got[f"qosflow.decisions.scale_up.{SAFE_KEY}"] == [1.0]  # what round 1 acted on
    assert got[f"qosflow.decisions.done.{SAFE_KEY}"] == [1.0]
    assert got[f"qosflow.rescales.restart.{SAFE_KEY}"] == [1.0]  # segment 1 of 2
    assert len(fake_cluster.requests) == 2
    assert got[f"qosflow.guarantee_violations.{SAFE_KEY}"] == [1.0]


def test_a_met_deadline_is_no_violation_and_an_in_place_resize_counts_as_such() -> None:
    from qosflow_airflow import metrics

    with statsd_env() as statsd:
        metrics.job_finished(KEY, met=True, lateness_s=-30.0, guaranteed=True)
        metrics.rescaled(KEY, "in_place")
        got = statsd.wait_for(_names("jobs_finished.met", "rescales.in_place", "lateness_seconds"))
    assert got[f"qosflow.lateness_seconds.{SAFE_KEY}"] == [-30.0]  # negative: early
    assert not any("guarantee_violations" in name for name in got)


def test_with_tags_the_key_is_a_tag_not_part_of_the_name() -> None:
    from qosflow_airflow import metrics

    with statsd_env(statsd_influxdb_enabled="True") as statsd:
        metrics.rescaled(KEY, "pause")
        metrics.job_finished(KEY, met=False, lateness_s=1.0, guaranteed=False)
        want = {
            f"qosflow.rescales,how=pause,job_key={SAFE_KEY}",
            f"qosflow.jobs_finished,outcome=missed,job_key={SAFE_KEY}",
        }
        got = statsd.wait_for(want)
    assert want <= set(got), sorted(got)


def test_a_long_or_odd_key_becomes_one_bounded_segment() -> None:
    from qosflow_airflow.metrics import MAX_SEGMENT, segment, stat_name

    long_a, long_b = "k" * 300 + "a", "k" * 300 + "b"
    assert len(segment(long_a)) == MAX_SEGMENT and segment(long_a) != segment(long_b)
    assert segment("a.b,c=d e") == "a_b_c_d_e" and segment("") == "_"
    assert stat_name("units", "a.b", {}, tags=False) == ("qosflow.units.a_b", None)
    assert stat_name("rescales", "a.b", {"how": "pause"}, tags=True) == (
        "qosflow.rescales",
        {"how": "pause", "job_key": "a_b"},
    )


# ---- emission never fails a task


def _emit_everything() -> None:
    from qosflow.core.decide import Action, Decision
    from qosflow_airflow import metrics

    decision = Decision(Action.SCALE_UP, 2, "behind", 1_000.0, 1_100.0, 1_200.0, 5.0)
    watcher = mock.Mock(paused=False)
    watcher.spec.key = KEY
    status = mock.Mock(units=1)
    status.phase.finished = False
    event = mock.Mock(decision=decision)
    metrics.predicted(KEY, decision, now=900.0)
    metrics.polled(watcher, status, event)
    metrics.rescaled(KEY, "restart")
    metrics.job_finished(KEY, met=False, lateness_s=3.0, guaranteed=True)


def test_metrics_off_send_nothing_and_raise_nothing() -> None:
    from qosflow_airflow import metrics

    with statsd_env(statsd_on="False") as statsd:  # host and port set, metrics off
        _emit_everything()
        metrics.polled(mock.Mock(spec=[]), mock.Mock(), None)  # even a broken caller
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as marker:  # loopback: in order
            marker.sendto(b"marker:1|c", ("127.0.0.1", statsd.port))
        got = statsd.wait_for({"marker"})
    assert list(got) == ["marker"]


def test_a_closed_port_raises_nothing() -> None:
    with statsd_env() as statsd:
        statsd.close()  # nothing listens any more
        _emit_everything()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "qosflow_airflow.metrics" and r.levelname == "WARNING"
    ]


def test_a_misconfigured_backend_raises_nothing_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with statsd_env(statsd_custom_client_path="builtins.object"):  # not a StatsClient
        _emit_everything()
    assert len(_warnings(caplog)) == 1, caplog.text


def test_a_client_that_raises_raises_nothing_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from airflow.sdk.observability import stats

    def boom(*_a: Any, **_k: Any) -> None:
        raise OSError("network is unreachable")

    with statsd_env(), mock.patch.multiple(stats, gauge=boom, incr=boom):
        _emit_everything()
    assert len(_warnings(caplog)) == 1, caplog.text


# ---- the triggerer: Airflow initialises the client we send through; no configure() needed


@pytest.mark.slow
def test_a_forked_triggerer_process_sends_without_configure(statsd: StatsdListener) -> None:
    """Like ``airflow triggerer``: its modules loaded with the deployment's config, then the trigger
    runner forked off; the trigger's poll sends from the child."""
    code = (
        "import os, airflow.jobs.triggerer_job_runner\n"
        "from qosflow_airflow import metrics\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        f"    metrics.rescaled({KEY!r}, 'resume'); os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    env = {
        **os.environ,
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
    }
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    got = statsd.wait_for(_names("rescales.resume"))
    assert got.get(f"qosflow.rescales.resume.{SAFE_KEY}") == [1.0], sorted(got)


# ---- a whole DAG run, in-process (dag.test()), against the fake cluster

SCENARIOS = Path(__file__).parent / "dag_files" / "qosflow_test_scenarios.py"


@pytest.mark.slow
def test_a_dag_test_run_sends_its_metrics_from_every_step(
    airflow_db: None, fake_cluster: Any, statsd: StatsdListener, tmp_path: Path
) -> None:
    """``dag.test()`` runs the tasks and the triggers inline: the same process, the client Airflow
    configured at import (re-read by ``configure()`` for the listener)."""
    from airflow.dag_processing.dagbag import DagBag

    fake_cluster.clock = time.time()  # the deadline counts from the run's real queued time
    fake_cluster.tick = 20.0  # 20 s of the job's time per poll: the run takes seconds
    bag = DagBag(dag_folder=str(SCENARIOS))
    assert bag.import_errors == {}
    conf = {
        "name": "metrics-dag",  # the key defaults to the name
        "steps": 300,
        "deadline": "PT4M",
        "step_s": 1.0,
        "initial_units": 1,  # 1 CPU misses: round 1 scales up
        "report_dir": str(tmp_path),
    }
    run = bag.dags["qosflow_test_scenarios"].test(run_conf=conf)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states["training.round_1.rescale"] == "success", states
    want = {
        f"qosflow.{name}.metrics-dag"
        for name in (
            "units",
            "predicted_finish_seconds",
            "slack_seconds",
            "decisions.scale_up",
            "decisions.done",
            "rescales.restart",
            "lateness_seconds",  # the finish step's
        )
    }
    got = statsd.wait_for(want)
    assert want <= set(got), sorted(got)
    outcomes = [n for n in got if n.startswith("qosflow.jobs_finished.")]
    assert outcomes in (
        ["qosflow.jobs_finished.met.metrics-dag"],
        ["qosflow.jobs_finished.missed.metrics-dag"],
    ), sorted(got)
