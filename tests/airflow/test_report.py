"""The report's figure, checked on its data (artists, positions, ticks), not on pixels.

* decision labels never overlap, however close in time the decisions are;
* the size axis has whole-unit ticks;
* one rule for "behind": a decision's marker is red exactly when the job is drawn below its
  "must be done by" line, and at a decision that is exactly when the decision's own
  conservative finish misses its deadline minus margin (so an ``at_risk`` job is never drawn
  above its line, and a job drawn below it is never marked on track).
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qosflow.core.speed import ProgressSample

T0 = 1_800_000_000.0
TOTAL = 300


def _report(marks, schedule=None, samples=None, deadline=T0 + 240.0, finished=T0 + 260.0):
    from qosflow_airflow.report import Report

    if samples is None:
        samples = [
            ProgressSample(T0 + 5 * i, min(2 * i, TOTAL), 1 if i < 20 else 2) for i in range(60)
        ]
    if schedule is None:  # the plan: 0.7 s a step, done by deadline - 10 s
        schedule = [(T0 + 23 * i, max(0, round(TOTAL - (230 - 23 * i) / 0.7))) for i in range(11)]
    return Report(
        job="r",
        total_steps=TOTAL,
        start=T0,
        deadline=deadline,
        finished_at=finished,
        succeeded=True,
        schedule=schedule,
        samples=samples,
        marks=marks,
    )


def _labels(fig):
    return [t for t in fig.axes[0].texts if (t.get_gid() or "").startswith("mark-")]


def test_decision_labels_never_overlap_even_when_decisions_crowd(tmp_path):
    from qosflow_airflow.report import Mark

    kinds = itertools.cycle(["scale_up", "in_place", "bump", "restart", "at_risk", "scale_down"])
    marks = [Mark(T0 + 60 + 0.7 * i, next(kinds), 2, f"reason {i}") for i in range(14)]
    marks += [Mark(T0 + 180 + 6 * i, "bump", 2, "later") for i in range(4)]
    fig = _report(marks).figure()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in _labels(fig)]
    assert len(boxes) == len(marks)
    overlaps = [
        (i, j) for (i, a), (j, b) in itertools.combinations(enumerate(boxes), 2) if a.overlaps(b)
    ]
    assert not overlaps, overlaps
    inside = fig.axes[0].get_window_extent(renderer)
    assert all(inside.y0 <= b.y0 and b.y1 <= inside.y1 for b in boxes)  # in the plot
    key = "\n".join(t.get_text() for t in fig.texts if (t.get_gid() or "").startswith("key-"))
    for number, mark in enumerate(marks, 1):
        assert f"{number:>2}  t+" in key and mark.kind in key


@pytest.mark.parametrize("count", [1, 5, 6, 30])
def test_labels_in_one_lane_keep_their_distance(count):
    from qosflow_airflow.report_figure import LABEL_GAP, LANES, lanes

    xs = sorted(0.9 * i / max(count - 1, 1) * (0.2 if count > 10 else 1) for i in range(count))
    got = lanes(xs)
    assert len(got) == count and max(got) < LANES
    for lane in set(got):
        mine = [x for x, g in zip(xs, got, strict=True) if g == lane]
        gaps = [b - a for a, b in itertools.pairwise(mine)]
        if count <= LANES or xs[-1] - xs[0] >= LABEL_GAP * count / LANES:
            assert all(g >= LABEL_GAP - 1e-12 for g in gaps), (lane, gaps)


def test_the_size_axis_ticks_are_whole_units():
    fig = _report([]).figure()
    size = fig.axes[1]
    low, high = size.get_ylim()
    ticks = [t for t in size.get_yticks() if low <= t <= high]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert size.get_ylabel() == "size (units)"


def _line_at(fig, x):
    """The highest gray dashed ("must be done by") line's value at minute ``x`` (figure data)."""
    values = []
    for line in fig.axes[0].get_lines():
        if line.get_linestyle() != "--":
            continue
        xs, ys = (list(map(float, v)) for v in line.get_data())
        for (x0, y0), (x1, y1) in itertools.pairwise(zip(xs, ys, strict=True)):
            if x0 <= x <= x1 and x1 > x0:
                values.append(y0 + (y1 - y0) * (x - x0) / (x1 - x0))
    return values


def _marker(fig, x, y):
    for line in fig.axes[0].get_lines():
        xs, ys = line.get_data()
        if line.get_marker() in ("o", "s") and list(xs) == [x] and list(ys) == [y]:
            return line.get_color()
    raise AssertionError(f"no marker at {(x, y)}")


def test_an_at_risk_job_above_the_plans_line_is_drawn_below_its_line_in_red():
    """The plan believed 1.25 steps/s; the decision believes far less: behind, on its line."""
    from qosflow_airflow.report import BEHIND, Mark

    # 1.5 steps/s: at t+100 the job has done 150 steps, above the plan's line (about 114)
    fast = [ProgressSample(T0 + 5 * i, min(round(7.5 * i), TOTAL), 1) for i in range(21)]
    at_risk = Mark(T0 + 100, "at_risk", 2, "even 2 cpus miss", finish=T0 + 400, due=T0 + 230)
    report = _report([at_risk], samples=fast)
    steps = report.steps_at(at_risk)
    assert steps > next(s for t, s in report.schedule if t >= T0 + 100)  # above the plan's line
    assert report.status(at_risk) is True
    fig = report.figure()
    x = 100 / 60
    assert any(v > steps for v in _line_at(fig, x + 0.01))  # drawn below its line
    assert _marker(fig, x, steps) == BEHIND


def test_a_job_below_the_plans_line_that_a_decision_finds_on_track_is_drawn_above_it():
    from qosflow_airflow.report import AHEAD, Mark

    slow = [ProgressSample(T0 + 5 * i, i, 2) for i in range(40)]  # 0.2 steps/s: below the plan
    down = Mark(T0 + 150, "scale_down", 1, "far ahead", finish=T0 + 200, due=T0 + 230)
    report = _report([down], samples=slow)
    steps = report.steps_at(down)
    assert report.status(down) is False
    fig = report.figure()
    x = 150 / 60
    assert all(v <= steps + 1e-6 for v in _line_at(fig, x + 0.01))
    assert _marker(fig, x, steps) == AHEAD


@given(
    steps=st.integers(0, TOTAL - 1),
    t=st.floats(10.0, 220.0),
    finish_in=st.floats(1.0, 1000.0) | st.just(math.inf),
    due_in=st.floats(1.0, 400.0),
)
def test_behind_the_drawn_line_exactly_when_the_decisions_finish_misses(
    steps, t, finish_in, due_in
):
    """One rule for both: the line a decision implies puts it behind iff it predicts a miss."""
    from qosflow_airflow.report import Mark

    mark = Mark(T0 + t, "x", 2, "r", steps=steps, finish=T0 + t + finish_in, due=T0 + t + due_in)
    report = _report([mark], samples=[])
    misses = mark.finish > mark.due
    if abs(finish_in - due_in) > 1e-6 * max(1.0, due_in):  # not on the line itself
        assert report.status(mark) is misses


def test_a_decision_mark_carries_what_the_decision_believed():
    from qosflow_airflow.report import decision_mark

    event = {
        "time": T0 + 50,
        "samples": [[T0 + 45, 30, 1], [T0 + 50, 36, 1]],
        "decision": {
            "action": "scale_up",
            "units": 2,
            "reason": "behind",
            "conservative_finish": None,  # no speed known: everything is due
            "deadline": T0 + 200,
            "margin": 10.0,
        },
    }
    mark = decision_mark(event)
    assert (mark.steps, mark.finish, mark.due) == (36.0, math.inf, T0 + 190)
    assert mark.judges
    assert _report([mark]).status(mark) is True
