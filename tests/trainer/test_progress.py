from __future__ import annotations

import time
from pathlib import Path

import pytest

from qosflow_trainer import report_progress
from qosflow_trainer.errors import TrainerError
from qosflow_trainer.progress import ProgressFile, format_progress, parse_progress, write_progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3/10\n", (3, 10)),
        ("1/10\n\n 4 / 10 \n\n", (4, 10)),  # last non-empty line wins
        ("10/10", (10, 10)),
        ("11/10\n", None),
        ("3/0\n", None),
        ("-1/10\n", None),
        ("", None),
        ("abc\n", None),
        ("3/10\nbroken\n", None),
    ],
)
def test_parse_progress_follows_argo_rules(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_progress(text) == expected


@pytest.mark.parametrize(("done", "total"), [(-1, 5), (6, 5), (0, 0)])
def test_invalid_progress_is_rejected_naming_the_field(done: int, total: int) -> None:
    with pytest.raises(TrainerError, match=r"progress\.(done|total)"):
        format_progress(done, total)


def test_write_progress_replaces_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    write_progress(path, 1, 9)
    write_progress(path, 2, 9)
    assert path.read_text() == "2/9\n"
    assert [p.name for p in tmp_path.iterdir()] == ["progress"]


def test_progress_file_rate_limits_with_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "p"
    pf = ProgressFile(path, 100, min_interval=1.0, clock=clock)
    assert pf.update(0)  # start is always written
    clock.now += 0.4
    assert not pf.update(5)
    assert path.read_text() == "0/100\n"
    clock.now += 0.6
    assert pf.update(9)
    assert path.read_text() == "9/100\n"
    clock.now += 0.1
    assert pf.update(100)  # the end is always written
    assert path.read_text() == "100/100\n"
    clock.now += 0.1
    assert pf.update(100, force=True)
    assert pf.writes == 4


def test_flush_writes_latest_value(tmp_path: Path) -> None:
    clock = FakeClock()
    pf = ProgressFile(tmp_path / "p", 10, min_interval=60.0, clock=clock)
    pf.update(1)
    pf.update(7)
    assert (tmp_path / "p").read_text() == "1/10\n"
    pf.flush()
    assert (tmp_path / "p").read_text() == "7/10\n"


def test_heartbeat_rewrites_the_latest_value(tmp_path: Path) -> None:
    pf = ProgressFile(tmp_path / "p", 10, min_interval=3600.0)
    pf.update(1)
    pf.update(4)
    with pf.heartbeat(0.005):
        while pf.writes < 3:  # the heartbeat thread must keep writing (pytest-timeout bounds it)
            time.sleep(0.001)
    assert (tmp_path / "p").read_text() == "4/10\n"


def test_report_progress_uses_env_and_is_a_noop_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARGO_PROGRESS_FILE", raising=False)
    assert report_progress(1, 5) is False
    with pytest.raises(TrainerError):
        report_progress(6, 5)
    path = tmp_path / "argo-progress"
    monkeypatch.setenv("ARGO_PROGRESS_FILE", str(path))
    assert report_progress(0, 5)
    assert not report_progress(1, 5, min_interval=3600)
    assert report_progress(5, 5, min_interval=3600)
    assert path.read_text() == "5/5\n"
    explicit = tmp_path / "explicit"
    assert report_progress(2, 3, path=explicit)
    assert explicit.read_text() == "2/3\n"


def test_write_errors_go_to_on_error_when_given(tmp_path: Path) -> None:
    missing = tmp_path / "gone" / "progress"
    with pytest.raises(OSError):
        ProgressFile(missing, 10).update(0)
    errors: list[OSError] = []
    pf = ProgressFile(missing, 10, on_error=errors.append)
    assert pf.update(0)
    assert len(errors) == 1 and pf.writes == 0
