"""The demo sizes its job so one CPU must miss and the switch to two makes it (issue 13)."""

from __future__ import annotations

import pytest

from qosflow_airflow.demo import LONGEST_S, SWITCH_S, size_job


@pytest.mark.parametrize("speedup", [1.3, 1.35, 1.45, 1.6, 1.8])
def test_one_cpu_must_miss_and_two_make_it_with_time_to_spare(speedup: float) -> None:
    rate1, margin = 7.0, 10.0
    sized = size_job(rate1, rate1 * speedup, 180.0, margin)
    assert sized is not None
    steps, deadline = sized
    assert 180.0 <= deadline <= LONGEST_S
    assert steps / rate1 >= 1.08 * deadline  # one CPU alone misses by 8 % or more
    finish = SWITCH_S + (steps - rate1 * SWITCH_S) / (rate1 * speedup)
    assert finish <= 0.9 * deadline - margin  # after the switch, 10 % of the deadline to spare


def test_a_host_that_cannot_give_a_second_cpu_is_told_before_anything_runs() -> None:
    assert size_job(7.0, 7.0 * 1.2, 180.0, 10.0) is None
    assert size_job(0.0, 5.0, 180.0, 10.0) is None


def test_a_calibration_pod_that_made_no_progress_is_named_not_called_0x_faster():
    from qosflow_airflow.demo import _too_busy

    said = _too_busy(0.0, 10.0, None, 300.0)
    assert said is not None and "pod at 1 CPU made no progress" in said and "0.00x" not in said
    said = _too_busy(6.0, 0.0, None, 300.0)
    assert said is not None and "pod at 2 CPUs made no progress" in said
    assert "only 1.02x faster" in (_too_busy(6.0, 6.1, None, 300.0) or "")
    assert _too_busy(6.0, 10.0, (1500, 180.0), 300.0) is None
